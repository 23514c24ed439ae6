"""Draft trees from n-gram matches (specdec/ngram/tree.py) and the draft budget (budget.py): worked
examples, the chain against the lookup it specialises, packing against the kernel reference."""

import numpy as np
import pytest
import torch

from specdec.kernels.tree_build import reconstruct_indices_from_tree_mask_ref
from specdec.ngram import propose_ngram
from specdec.ngram.budget import DraftBudget, verify_sizes
from specdec.ngram.config import NgramConfig
from specdec.ngram.tree import DraftTree, build_tree, find_matches, pack_trees


def _h(*tokens):
    return np.asarray(tokens, dtype=np.int32)


def test_find_matches_takes_the_longest_window_latest_first():
    """position 0 1 2 3 4 5 6 7 8 9: "5 9" ends at 1 and 5; "8 5 9" nowhere before."""
    n, ends = find_matches(_h(5, 9, 7, 2, 5, 9, 7, 8, 5, 9), min_n=1, max_n=3)
    assert n == 2 and ends.tolist() == [5, 1]
    assert find_matches(_h(1, 2, 3), min_n=1, max_n=3)[0] == 0
    assert find_matches(_h(5, 9, 7, 2, 5, 9, 7, 8, 5, 9), min_n=3, max_n=3)[0] == 0


def test_bfs_tree_of_the_module_example():
    """history ... 9 4 5 6 ... 9 4 7 ... 9 8 1 ... 9; breadth 2 at the root, 1 below, 4 nodes::

        root -> 8 -> 1
             -> 4 -> 7
    """
    history = _h(9, 4, 5, 6, 0, 9, 4, 7, 0, 9, 8, 1, 0, 9)
    config = NgramConfig(num_draft_tokens=5, min_match_window=1, max_match_window=2, min_bfs_breadth=1,
                         max_bfs_breadth=4)
    # match "0 9" (n = 2): root breadth (2 - 2) * 4/2 + 1 = 1; match "9" only (n = 1): 3, then 1
    tree = build_tree(history, config, max_nodes=4)
    assert tree == DraftTree([8, 1, 0, 9], [0, 1, 2, 3])  # "0 9" -> latest match is "0 9 8 1 0 9"
    wide = build_tree(_h(9, 4, 5, 6, 9, 4, 7, 3, 9, 8, 1, 2, 9), config, max_nodes=4)
    assert wide == DraftTree([8, 4, 1, 7], [0, 0, 1, 2])


def test_prob_tree_prefers_the_frequent_child():
    """After 9: "4 5 9" follows twice (older), "8 1" once (latest). Root breadth 2 (a 1-token match
    of windows 1-2, breadths 1-3): BFS puts the latest first, PROB the frequent one, whose whole
    path (p = 2/3 at every node) outranks 8 (p = 1/3)."""
    history = _h(9, 4, 5, 9, 4, 5, 9, 8, 1, 9)
    bfs = NgramConfig(num_draft_tokens=4, max_match_window=2, max_bfs_breadth=3)
    prob = NgramConfig(num_draft_tokens=4, max_match_window=2, max_bfs_breadth=3, match_type="PROB")
    assert build_tree(history, bfs, max_nodes=3) == DraftTree([8, 4, 1], [0, 0, 1])
    assert build_tree(history, prob, max_nodes=3) == DraftTree([4, 5, 9], [0, 1, 2])
    # deeper: "4 5 9" continues "8 1" or "4 5" (1/3 each); ties go to the older push (the root's 8)
    assert build_tree(history, prob, max_nodes=5) == DraftTree([4, 5, 9, 8, 8], [0, 1, 2, 0, 3])


@pytest.mark.parametrize("seed", range(5))
def test_chain_equals_the_prompt_lookup(seed):
    rng = np.random.default_rng(seed)
    config = NgramConfig(num_draft_tokens=6, min_match_window=1, max_match_window=3, max_bfs_breadth=1)
    for _ in range(50):
        history = rng.integers(0, 5, size=rng.integers(2, 40)).astype(np.int32)
        tree = build_tree(history, config, max_nodes=5)
        assert tree.tokens == propose_ngram(history, min_n=1, max_n=3, k=5, repeat=True).tolist()
        assert tree.parents == list(range(len(tree)))


def test_drafts_continue_a_repeat_past_the_history():
    """history 3 4 7 7 7 7: the longest match, "7 7 7", ends at 4 alone, one token before the end; cut
    there a chain or the trie's one branch would be one token (7); continued, both are the run's."""
    history = _h(3, 4, 7, 7, 7, 7)
    chain = NgramConfig(num_draft_tokens=5, min_match_window=1, max_match_window=3, max_bfs_breadth=1)
    assert build_tree(history, chain, max_nodes=4) == DraftTree([7, 7, 7, 7], [0, 1, 2, 3])
    tree = NgramConfig(num_draft_tokens=5, min_match_window=1, max_match_window=3, max_bfs_breadth=3)
    assert build_tree(history, tree, max_nodes=4) == DraftTree([7, 7, 7, 7], [0, 1, 2, 3])
    # a period of two: "1 2" ends at 3, two before the end: 1 2 1 2 ... (cut: 1 2)
    assert build_tree(_h(5, 1, 2, 1, 2), chain, max_nodes=4) == DraftTree([1, 2, 1, 2], [0, 1, 2, 3])


@pytest.mark.parametrize("match_type", ["BFS", "PROB"])
def test_trees_have_distinct_siblings_and_fit_the_budget(match_type):
    rng = np.random.default_rng(3)
    config = NgramConfig(num_draft_tokens=12, max_match_window=4, max_bfs_breadth=5, match_type=match_type)
    for _ in range(50):
        history = rng.integers(0, 4, size=60).astype(np.int32)
        tree = build_tree(history, config, max_nodes=9)
        assert len(tree) <= 9 and all(p <= i for i, p in enumerate(tree.parents))
        pairs = list(zip(tree.parents, tree.tokens))
        assert len(set(pairs)) == len(pairs)


def test_pack_trees_matches_the_kernel_reference():
    """Packed links equal what reconstruct_indices_from_tree_mask recovers from the packed mask."""
    trees = [DraftTree([4, 5, 6, 7], [0, 0, 1, 1]), DraftTree([], []), DraftTree([3, 3, 2], [0, 1, 2])]
    n = 6
    packed = pack_trees(trees, [9, 8, 7], n)
    bs = len(trees)
    seq_lens = torch.tensor([10, 0, 3])
    positions = torch.empty(bs * n, dtype=torch.int64)
    index, next_token, next_sibling = torch.empty(3, bs, n, dtype=torch.int64)
    reconstruct_indices_from_tree_mask_ref(torch.from_numpy(packed.mask.reshape(-1)), seq_lens, positions, index,
                                           next_token, next_sibling, bs, n)
    assert torch.equal(positions, (seq_lens[:, None] + torch.from_numpy(packed.depth)).flatten())
    assert torch.equal(next_token, torch.from_numpy(packed.next_token))
    assert torch.equal(next_sibling, torch.from_numpy(packed.next_sibling))
    assert packed.tokens[1].tolist() == [8] * n  # an empty tree is its root, repeated as padding
    assert packed.next_token[1].tolist() == [-1] * n  # nothing reachable: the row verifies its root only
    with pytest.raises(ValueError, match="does not fit"):
        pack_trees(trees, [9, 8, 7], 4)


def test_budget_doubles_on_full_acceptance_and_halves_on_none():
    config = NgramConfig(num_draft_tokens=12, max_verify_rows=48)
    assert verify_sizes(config) == [2, 3, 5, 9, 12]
    budget = DraftBudget(config, max_reqs=4)
    assert budget.limits([0, 1], bs=2) == [11, 11]
    assert budget.node_cap(5) == 8 and budget.node_cap(24) == 1 and budget.node_cap(25) == 0
    budget.observe([0, 1, 2], drafted_depth=[5, 5, 0], accepted=[0, 2, 0])
    assert budget.budget[:3].tolist() == [5, 11, 11]
    budget.observe([0], drafted_depth=[3], accepted=[3])
    assert budget.budget[0] == 10
    assert budget.step_size(3) == 5 and budget.step_size(9) == 12
    budget.reset([0])
    assert budget.budget[0] == 11
    fixed = DraftBudget(NgramConfig(num_draft_tokens=6, adaptive=False), max_reqs=2)
    assert fixed.sizes == [6] and fixed.limits([0], bs=64) == [5]
