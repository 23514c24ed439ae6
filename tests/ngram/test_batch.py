"""The batch paths of n-gram drafting (specdec/ngram/batch.py) against the per-request references
(specdec/ngram/tree.py) on random histories: matches, chain and BFS / PROB trees, packing, and the
cumulative depths the policy reads."""

import numpy as np
import pytest

from specdec.ngram.batch import BatchTrees, build_trees_batch, build_trees_ref, find_matches_batch, match_ends, pack_batch
from specdec.ngram.config import NgramConfig
from specdec.ngram.lookup import latest_longest_match_end, propose_ngram_ref
from specdec.ngram.tree import build_tree, find_matches, pack_trees


def _random_case(rng):
    bs, vocab = int(rng.integers(1, 10)), int(rng.integers(2, 12))  # small vocabularies: many matches
    max_w = int(rng.integers(1, 6))
    breadth = int(rng.integers(1, 8))
    config = NgramConfig(num_draft_tokens=int(rng.integers(2, 14)), min_match_window=int(rng.integers(1, max_w + 1)),
                         max_match_window=max_w, min_bfs_breadth=int(rng.integers(1, breadth + 1)),
                         max_bfs_breadth=breadth, match_type=str(rng.choice(["BFS", "BFS", "PROB"])))
    lengths = rng.integers(1, 90, size=bs)
    history = np.full((bs, 97), -7, dtype=np.int32)  # poison past each row's length
    for b in range(bs):
        history[b, : lengths[b]] = rng.integers(0, vocab, size=lengths[b])
    limits = rng.integers(0, config.num_draft_tokens, size=bs)
    return config, history, lengths, limits


@pytest.mark.parametrize("seed", range(4))
def test_batch_paths_equal_the_references(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        config, history, lengths, limits = _random_case(rng)
        n, ends = find_matches_batch(history, lengths, min_n=config.min_match_window, max_n=config.max_match_window)
        refs = [build_tree(history[b, : lengths[b]], config, max_nodes=int(limits[b])) for b in range(len(lengths))]
        for b, length in enumerate(lengths):
            if length >= 2:
                ref_n, ref_ends = find_matches(history[b, :length], min_n=config.min_match_window,
                                               max_n=config.max_match_window)
                assert (n[b], ends[b][ends[b] >= 0].tolist()) == (ref_n, ref_ends.tolist())
        for trees in (build_trees_batch(history, lengths, config, limits),
                      build_trees_ref(history, lengths, config, limits)):
            assert trees.cut(config.num_draft_tokens) == refs
            depth = trees.cumulative_depth(config.num_draft_tokens)
            assert depth.tolist() == [[t.cut(m).depth() if m else 0 for m in range(config.num_draft_tokens)]
                                      for t in refs]
            size = int(rng.integers(2, config.num_draft_tokens + 1))
            roots = rng.integers(0, 50, size=len(lengths))
            got = pack_batch(trees, roots, size)
            want = pack_trees(trees.cut(size - 1), roots.tolist(), size)
            for field in ("tokens", "mask", "depth", "next_token", "next_sibling"):
                assert np.array_equal(getattr(got, field), getattr(want, field)), field


@pytest.mark.parametrize("seed", range(2))
def test_match_ends_of_the_batch_equal_each_rows(seed):
    """The policy's view: the batch path's match ends equal the per-row search's (``latest_longest_match_end``),
    and are where the host's own search (``propose_ngram_ref``) drafts after."""
    rng = np.random.default_rng(seed)
    for _ in range(60):
        config, history, lengths, _ = _random_case(rng)
        kw = dict(min_n=config.min_match_window, max_n=config.max_match_window)
        ends = match_ends(history, lengths, **kw)
        for b, length in enumerate(lengths.tolist()):
            assert ends[b] == latest_longest_match_end(history[b, :length], **kw)
            draft = propose_ngram_ref(history[b, :length], k=length, **kw)  # all that follows the match
            assert ends[b] == (length - 1 - len(draft) if len(draft) else -1)


def test_bfs_batch_of_the_module_example():
    """tree.py's worked example, twice in one batch beside a row without a match::

        history ... 9 4 5 6 ... 9 4 7 ... 9 8 1 ... 9     root -> 8 -> 1,  root -> 4 -> 7
    """
    config = NgramConfig(num_draft_tokens=5, min_match_window=1, max_match_window=2, min_bfs_breadth=1,
                         max_bfs_breadth=4)
    row = [9, 4, 5, 6, 9, 4, 7, 3, 9, 8, 1, 2, 9]
    history = np.asarray([row, row, list(range(13))], dtype=np.int32)
    trees = build_trees_batch(history, np.asarray([13, 13, 13]), config, np.asarray([4, 3, 4]))
    assert trees.sizes.tolist() == [4, 3, 0]
    assert trees.tokens[0].tolist() == [8, 4, 1, 7] and trees.parents[0].tolist() == [0, 0, 1, 2]
    assert trees.tokens[1, :3].tolist() == [8, 4, 1]
    assert isinstance(trees, BatchTrees)
