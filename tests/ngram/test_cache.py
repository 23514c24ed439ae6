"""NgramCache: the docstring's worked example, longest key first, recency, the capacity bound
under many insertions (least recently used first), and cache chains replacing short own trees."""

import numpy as np
import pytest

from specdec.ngram.batch import BatchTrees
from specdec.ngram.cache import NgramCache, with_cache_drafts


def cache(capacity=1000, branch_length=4, min_n=1, max_n=2) -> NgramCache:
    return NgramCache(capacity=capacity, branch_length=branch_length, min_n=min_n, max_n=max_n)


@pytest.mark.parametrize("history, k, draft", [
    ([6, 8, 5], 3, [9, 7]),  # key (8 5), the longest
    ([1, 5], 3, [9, 7]),  # key (5)
    ([1, 3], 2, [8, 5]),  # cut to k
    ([1, 2], 3, []),  # nothing stored ends in 2
    ([6, 8, 5], 0, []),
])
def test_worked_example(history, k, draft):
    """finished 3 8 5 9 7, windows 1..2, branch_length 4 (the module docstring's table)."""
    c = cache()
    c.insert([3, 8, 5, 9, 7])
    assert c.lookup(np.asarray(history), k) == draft


def test_newer_continuation_wins():
    c = cache()
    c.insert([4, 1, 2])
    c.insert([4, 6, 6])
    assert c.lookup(np.asarray([4]), 2) == [6, 6]


@pytest.mark.parametrize("capacity", [1, 7, 50, 333])
def test_capacity_bound_holds_under_many_insertions(capacity):
    rng = np.random.default_rng(capacity)
    c = cache(capacity=capacity, branch_length=6, max_n=3)
    for _ in range(200):
        c.insert(rng.integers(0, 50, size=int(rng.integers(2, 40))))
        assert c.size <= capacity
        assert c.size == sum(len(k) + len(v) for k, v in c._entries.items())


def test_least_recently_used_goes_first():
    c = cache(capacity=12, branch_length=3, max_n=1)  # each key costs 3 tokens (1 + 2)
    c.insert([10, 11, 12])  # (10)->11 12, (11)->12
    c.insert([20, 21, 22])  # (20)->21 22, (21)->22: 10 tokens held
    assert c.lookup(np.asarray([10]), 2) == [11, 12]  # (10) is now the most recent
    c.insert([30, 31])  # (30)->31: 12 tokens held
    c.insert([40, 41])  # over: (11) goes, the least recent
    assert c.lookup(np.asarray([11]), 2) == [] and c.lookup(np.asarray([10]), 2) == [11, 12]
    assert c.size <= 12


def test_cache_chains_replace_shorter_own_trees():
    """Row 0 drafted nothing, row 1 two own nodes (kept: the cache's chain is not longer), row 2
    one node of a limit 3 (replaced by 3 cached ones)."""
    c = cache(branch_length=5)
    c.insert([7, 8, 9, 1, 2])
    history = np.asarray([[5, 7, 0], [3, 1, 0], [4, 7, 8]])  # row 1: the cache has (1) -> 2
    trees = BatchTrees(np.asarray([[0, 0, 0], [4, 4, 0], [6, 0, 0]]), np.asarray([[0, 0, 0], [0, 0, 0], [0, 0, 0]]),
                       np.asarray([0, 2, 1]))
    out = with_cache_drafts(trees, c, history, np.asarray([2, 2, 3]), np.asarray([3, 3, 3]))
    assert out.sizes.tolist() == [3, 2, 3]
    assert out.tokens.tolist() == [[8, 9, 1], [4, 4, 0], [9, 1, 2]]
    assert out.parents.tolist() == [[0, 1, 2], [0, 0, 0], [0, 1, 2]]
