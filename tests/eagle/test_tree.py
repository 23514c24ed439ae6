"""Draft-tree bookkeeping: select_top_k_tokens and organize_draft_results on the worked example,
build_tree in every mask mode, and a cross-check of build_tree against
reconstruct_indices_from_tree_mask over many random draft trees."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specdec.eagle.tree import (
    TreeMaskMode,
    build_tree,
    organize_draft_results,
    select_top_k_tokens,
)
from specdec.kernels import reconstruct_indices_from_tree_mask


def worked_example():
    """K = 2, S = 2 (the module docstring)::

        step 0: root -> a (.6, token 10), b (.35, token 11)           score indices 0, 1
        step 1: a -> c (.30, token 12), d (.12, token 13)              score indices 2, 3
                b -> e (.315, token 14), f (.035, token 15)            score indices 4, 5
        frontier after step 1: [e, c]
    """
    hidden = torch.tensor([[1.0, 2.0]])  # [bs, hidden]
    sel0 = select_top_k_tokens(0, torch.tensor([[0.6, 0.35]]), torch.tensor([[10, 11]]), hidden, None, 2)
    step1_hidden = torch.tensor([[3.0, 3.0], [4.0, 4.0]])  # [bs*K, hidden] draft outputs of a and b
    sel1 = select_top_k_tokens(
        1, torch.tensor([[0.5, 0.2], [0.9, 0.1]]), torch.tensor([[12, 13], [14, 15]]), step1_hidden, sel0.scores, 2
    )
    return sel0, sel1


def test_select_top_k_tokens_worked_example():
    sel0, sel1 = worked_example()
    assert torch.equal(sel0.input_ids, torch.tensor([10, 11]))
    assert torch.equal(sel0.hidden_states, torch.tensor([[1.0, 2.0], [1.0, 2.0]]))
    assert torch.equal(sel0.scores, torch.tensor([[0.6, 0.35]]))
    assert torch.equal(sel0.tree_info.scores, torch.tensor([[[0.6, 0.35]]]))
    assert torch.equal(sel0.tree_info.tokens, torch.tensor([[10, 11]]))
    assert torch.equal(sel0.tree_info.parents, torch.tensor([[-1, 0, 1]]))
    assert torch.equal(sel0.parent_branch, torch.tensor([[0, 0]]))

    assert torch.equal(sel1.input_ids, torch.tensor([14, 12]))  # e then c (by score)
    assert torch.equal(sel1.parent_branch, torch.tensor([[1, 0]]))
    assert torch.equal(sel1.hidden_states, torch.tensor([[4.0, 4.0], [3.0, 3.0]]))  # parents' rows
    assert torch.allclose(sel1.scores, torch.tensor([[0.315, 0.30]]))
    assert torch.allclose(sel1.tree_info.scores, torch.tensor([[[0.30, 0.12], [0.315, 0.035]]]))
    assert torch.equal(sel1.tree_info.tokens, torch.tensor([[12, 13, 14, 15]]))
    assert torch.equal(sel1.tree_info.parents, torch.tensor([[4, 2]]))


def test_organize_draft_results_worked_example():
    sel0, sel1 = worked_example()
    infos = [sel0.tree_info, sel1.tree_info]
    parent_list, top_index, tokens = organize_draft_results(
        [i.scores for i in infos], [i.tokens for i in infos], [i.parents for i in infos], 4
    )
    assert torch.equal(parent_list, torch.tensor([[-1, 0, 1]]))
    assert torch.equal(top_index, torch.tensor([[0, 1, 4]]))  # a, b, e; ascending
    assert torch.equal(tokens, torch.tensor([[10, 11, 14]]))


def test_organize_draft_results_single_step_has_empty_parent_list():
    sel0 = select_top_k_tokens(0, torch.tensor([[0.5, 0.3, 0.1]] * 2), torch.tensor([[7, 8, 9]] * 2),
                               torch.zeros(2, 1), None, 3)
    info = sel0.tree_info
    parent_list, top_index, tokens = organize_draft_results([info.scores], [info.tokens], [info.parents], 3)
    assert parent_list.shape == (2, 0) and parent_list.dtype == torch.long
    assert torch.equal(top_index, torch.tensor([[0, 1]] * 2))
    assert torch.equal(tokens, torch.tensor([[7, 8]] * 2))


@pytest.mark.parametrize("mode", list(TreeMaskMode))
def test_build_tree_worked_example(mode):
    """Tree of the worked example, seq_len 5, root token 9::

            root(9)      mask        positions  next_token  next_sibling
           /    \\         1 0 0 0     5          1           -1
          a(10) b(11)    1 1 0 0     6          -1           2
                 |       1 0 1 0     6          3           -1
                e(14)    1 0 1 1     7          -1          -1
    """
    sel0, sel1 = worked_example()
    infos = [sel0.tree_info, sel1.tree_info]
    parent_list, top_index, tokens = organize_draft_results(
        [i.scores for i in infos], [i.tokens for i in infos], [i.parents for i in infos], 4
    )
    tree = build_tree(torch.tensor([9]), parent_list, top_index, tokens, torch.tensor([5]), 5, 2, 2, 4, mode)
    block = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    if mode == TreeMaskMode.FULL_MASK:
        expected = torch.cat([torch.ones(4, 5, dtype=torch.bool), block], dim=1).flatten()
    elif mode == TreeMaskMode.QLEN_ONLY:
        expected = block.flatten()
    else:
        expected = torch.tensor([1, 3, 5, 13], dtype=torch.uint8)
    assert torch.equal(tree.tree_mask, expected)
    assert torch.equal(tree.positions, torch.tensor([5, 6, 6, 7]))
    assert torch.equal(tree.retrive_index, torch.tensor([[0, 1, 2, 3]]))
    assert torch.equal(tree.retrive_next_token, torch.tensor([[1, -1, 3, -1]]))
    assert torch.equal(tree.retrive_next_sibling, torch.tensor([[-1, 2, -1, -1]]))
    assert torch.equal(tree.draft_tokens, torch.tensor([9, 10, 11, 14]))


@pytest.mark.parametrize("n, dtype", [(8, torch.uint8), (9, torch.uint16), (16, torch.uint16), (17, torch.uint32)])
def test_build_tree_packed_dtype_follows_sglang(n, dtype):
    tree = random_built_tree(random.Random(n), 1, 1, n - 1, n, TreeMaskMode.QLEN_ONLY_BITPACKING)[1]
    assert tree.tree_mask.dtype == dtype and tree.tree_mask.shape == (n,)


def random_draft(rng: random.Random, bs: int, topk: int, steps: int, vocab: int = 40):
    """Draft results of `steps` random draft forwards, grown with select_top_k_tokens."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    def draft_topk(rows):  # [rows, K] probs and tokens of fresh random distributions
        return torch.randn(rows, vocab, generator=gen).mul(2).softmax(-1).topk(topk, dim=-1)
    topk_p, topk_index = draft_topk(bs)
    sel = select_top_k_tokens(0, topk_p, topk_index, torch.randn(bs, 3, generator=gen), None, topk)
    infos = [sel.tree_info]
    for i in range(1, steps):
        topk_p, topk_index = draft_topk(bs * topk)
        sel = select_top_k_tokens(i, topk_p, topk_index, sel.hidden_states, sel.scores, topk)
        infos.append(sel.tree_info)
    return [x.scores for x in infos], [x.tokens for x in infos], [x.parents for x in infos]


def random_built_tree(rng, bs, topk, steps, n, mode):
    seq_lens = torch.tensor([rng.randint(0, 9) for _ in range(bs)])
    parent_list, top_index, tokens = organize_draft_results(*random_draft(rng, bs, topk, steps), n)
    verified = torch.tensor([rng.randrange(40) for _ in range(bs)])
    tree = build_tree(verified, parent_list, top_index, tokens, seq_lens, int(seq_lens.sum()), topk, steps, n, mode)
    return seq_lens, tree


CONFIGS = [(k, s) for k in (1, 2, 4, 8) for s in range(1, 7)]


@pytest.mark.parametrize("topk, steps", CONFIGS)
def test_reconstruct_matches_build_tree_on_random_trees(topk, steps):
    rng = random.Random(topk * 100 + steps)
    max_n = topk + (steps - 1) * topk * topk + 1
    for n in sorted({2, max_n, rng.randint(2, max_n), rng.randint(2, max_n)}):
        bs = rng.randint(1, 3)
        state = rng.getstate()
        seq_lens, qlen = random_built_tree(rng, bs, topk, steps, n, TreeMaskMode.QLEN_ONLY)
        positions = torch.full((bs * n,), -7)
        index, next_token, next_sibling = torch.full((3, bs, n), -7)
        reconstruct_indices_from_tree_mask(qlen.tree_mask, seq_lens, positions, index, next_token, next_sibling, bs, n)
        assert torch.equal(positions, qlen.positions)
        assert torch.equal(index, qlen.retrive_index)
        assert torch.equal(next_token, qlen.retrive_next_token)
        assert torch.equal(next_sibling, qlen.retrive_next_sibling)
        # the same draft in the other modes: identical links, consistent masks
        rng.setstate(state)
        _, full = random_built_tree(rng, bs, topk, steps, n, TreeMaskMode.FULL_MASK)
        assert_same_links(full, qlen)
        blocks = qlen.tree_mask.view(bs, n, n)
        start = 0
        for b, seq_len in enumerate(seq_lens.tolist()):
            rows = full.tree_mask[start : start + n * (seq_len + n)].view(n, seq_len + n)
            assert rows[:, :seq_len].all() and torch.equal(rows[:, seq_len:], blocks[b])
            start += n * (seq_len + n)
        if n <= 32:
            rng.setstate(state)
            _, packed = random_built_tree(rng, bs, topk, steps, n, TreeMaskMode.QLEN_ONLY_BITPACKING)
            assert_same_links(packed, qlen)
            nbytes = packed.tree_mask.element_size()
            bits = np.packbits(blocks.reshape(bs * n, n).numpy(), axis=1, bitorder="little")
            expected = np.zeros((bs * n, nbytes), dtype=np.uint8)
            expected[:, : bits.shape[1]] = bits
            assert np.array_equal(packed.tree_mask.view(torch.uint8).numpy(), expected.flatten())


def assert_same_links(a, b):
    for field in ("positions", "retrive_index", "retrive_next_token", "retrive_next_sibling", "draft_tokens"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field


def test_organize_keeps_parents_when_scores_tie():
    """Confident drafts: the path saturates at 1.0 and everything else underflows to exactly 0.

        root -> a (1.0) -> c (1.0) -> e (1.0)      every other proposal scores 0.0
    With N-1 = 6 > 3 path nodes, the 3 extra nodes must be zero-score nodes whose parents are kept.
    """
    bs, k, steps, n = 1, 3, 3, 7
    topk_p = torch.tensor([[1.0, 0.0, 0.0]])
    topk_index = torch.tensor([[5, 6, 7]])
    hidden = torch.zeros(bs, 4)
    sel = select_top_k_tokens(0, topk_p, topk_index, hidden, None, k)
    scores, tokens, parents = [sel.tree_info.scores], [sel.tree_info.tokens], [sel.tree_info.parents]
    for i in range(1, steps):
        p = torch.tensor([[1.0, 0.0, 0.0]]).repeat(bs * k, 1)
        idx = torch.arange(bs * k * k).view(bs * k, k) + 10 * i
        sel = select_top_k_tokens(i, p, idx, sel.hidden_states, sel.scores, k)
        scores.append(sel.tree_info.scores)
        tokens.append(sel.tree_info.tokens)
        parents.append(sel.tree_info.parents)
    parent_list, top_index, draft_tokens = organize_draft_results(scores, tokens, parents, n)
    verified = torch.tensor([1])
    tree = build_tree(verified, parent_list, top_index, draft_tokens, torch.tensor([4]), 4, k, steps, n,
                      tree_mask_mode=TreeMaskMode.QLEN_ONLY)  # raises if a kept node lost its parent
    # depth of each node (positions - seq_len): the saturated path reaches depth 3
    assert int((tree.positions - 4).max()) == steps
