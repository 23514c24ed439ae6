"""Draft-tree bookkeeping: grow the frontier step by step, keep the best nodes, build the tree.

Glossary: bs = requests; K = topk; S = spec_steps (draft depth); N = num_draft_tokens (tree nodes
per request, root included); score = product of draft probabilities along a node's path.

Each draft step proposes K children for each of the K frontier branches (step 0: K children of
the root). Every proposal gets a *score index*, flattened over steps: step 0 owns ``[0, K)``, step
``i >= 1`` owns ``[K + (i-1)K^2, K + iK^2)``, laid out branch-major (``K + (i-1)K^2 + r*K + c`` is
child c of frontier branch r). Of all proposals the N-1 best-scoring become the tree
(``organize_draft_results``), then ``build_tree`` runs ``build_tree_kernel_efficient``.

Worked example, K = 2, S = 2, N = 4::

    step 0: root -> a (.6), b (.35)             score indices 0, 1; frontier [a, b]
    step 1: a -> c (.6*.5 = .30), d (.6*.2 = .12)       score indices 2, 3
            b -> e (.35*.9 = .315), f (.35*.1 = .035)   score indices 4, 5
            frontier = best 2 = [e, c] -> parents_list[1] = [4, 2]
    parents_list = [[-1, 0, 1], [4, 2]];  parent_list = cat(parents_list[:-1]) = [-1, 0, 1]
    keep the N-1 = 3 best of [.6 .35 .30 .12 .315 .035] -> top_scores_index [0, 1, 4] (a, b, e)

            root          e = score index 4: 4 // K = 2 -> parent_list[2] = 1 = b
           /    \\
          a      b
                 |
                 e
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec.kernels import TreeMaskMode, build_tree_kernel_efficient, select_draft_nodes, select_frontier
from specdec.kernels.tree_build import packed_mask_bytes

__all__ = [
    "BuiltTree",
    "DraftSelection",
    "TreeInfo",
    "TreeMaskMode",
    "build_tree",
    "organize_draft_results",
    "select_top_k_tokens",
]


class TreeInfo(NamedTuple):
    # step 0: [bs, 1, K]; later: [bs, K, K] cumulative score of every proposal of this step
    scores: torch.Tensor
    # step 0: [bs, K]; later: [bs, K*K] token of every proposal of this step
    tokens: torch.Tensor
    # step 0: [bs, K+1] = [-1, 0, .., K-1]; later: [bs, K] score index of each new frontier node
    parents: torch.Tensor


class DraftSelection(NamedTuple):
    # [bs*K] tokens the next draft forward reads (one per frontier branch)
    input_ids: torch.Tensor
    # [bs*K, hidden] features of each branch's parent, for the next draft forward
    hidden_states: torch.Tensor
    # [bs, K] cumulative score of each frontier branch
    scores: torch.Tensor
    tree_info: TreeInfo
    # [bs, K] which branch of the previous frontier each new branch extends (step 0: all 0)
    parent_branch: torch.Tensor


def select_top_k_tokens(
    i: int,
    topk_p: torch.Tensor,  # step 0: [bs, K]; later: [bs*K, K] draft top-k probs per branch
    topk_index: torch.Tensor,  # same shape as topk_p, token ids
    hidden_states: torch.Tensor,  # step 0: [bs, hidden]; later: [bs*K, hidden]
    scores: torch.Tensor | None,  # [bs, K] frontier scores (unused at step 0)
    topk: int,
) -> DraftSelection:
    """Choose the next frontier after draft step ``i`` (SGLang's ``select_top_k_tokens``).

    Step 0 expands the root: its K proposals become the frontier. A later step scores all K*K
    proposals (branch score x child prob) and keeps the K best, e.g. K = 2::

        scores [.6 .3], topk_p [[.5 .2], [.9 .1]] -> expand [[.30 .12], [.27 .03]]
        best of flattened [.30 .12 .27 .03] -> indices [0, 2] -> parent_branch [0, 1]
        parents (score indices) = [0, 2] + K*K*(i-1) + K
    """
    k = topk
    if i == 0:
        bs = topk_p.shape[0]
        parents = torch.arange(-1, k, dtype=torch.long, device=topk_p.device).repeat(bs, 1)  # [bs, K+1]
        return DraftSelection(
            input_ids=topk_index.flatten(),
            hidden_states=hidden_states.repeat_interleave(k, dim=0),
            scores=topk_p,
            tree_info=TreeInfo(topk_p.unsqueeze(1), topk_index, parents),
            parent_branch=torch.zeros(bs, k, dtype=torch.long, device=topk_p.device),
        )
    bs, device = scores.shape[0], scores.device
    expand_scores = torch.empty(bs, k, k, dtype=torch.float32, device=device)
    best_scores = torch.empty(bs, k, dtype=torch.float32, device=device)
    parents, parent_branch = (torch.empty(bs, k, dtype=torch.int64, device=device) for _ in range(2))
    input_ids = torch.empty(bs * k, dtype=torch.int64, device=device)
    next_hidden = torch.empty_like(hidden_states)  # [bs*K, hidden]
    select_frontier(scores, topk_p, topk_index, hidden_states, expand_scores, best_scores, parents, parent_branch,
                    input_ids, next_hidden, parent_offset=k * k * (i - 1) + k)
    return DraftSelection(
        input_ids=input_ids,
        hidden_states=next_hidden,
        scores=best_scores,
        tree_info=TreeInfo(expand_scores, topk_index.reshape(bs, k * k), parents),
        parent_branch=parent_branch,
    )


def organize_draft_results(
    score_list: list[torch.Tensor],  # S entries: [bs, 1, K], then [bs, K, K]
    token_list: list[torch.Tensor],  # S entries: [bs, K], then [bs, K*K]
    parents_list: list[torch.Tensor],  # S entries: [bs, K+1], then [bs, K]
    num_draft_token: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep the N-1 best proposals: (parent_list, top_scores_index, draft_tokens).

    parent_list        [bs, K*(S-1)+1] cat(parents_list[:-1]) (the last step has no children
                       in the tree), or [bs, 0] when S == 1
    top_scores_index   [bs, N-1] score indices of the kept proposals, ascending
    draft_tokens       [bs, N-1] their tokens
    """
    flat_scores = torch.cat(score_list, dim=1).flatten(1)  # [bs, K + (S-1)K^2]
    flat_tokens = torch.cat(token_list, dim=1)  # [bs, K + (S-1)K^2]
    if not 1 <= num_draft_token <= flat_scores.shape[1] + 1:
        raise ValueError(f"num_draft_token: expected 1..{flat_scores.shape[1] + 1} for these draft "
                         f"results, got {num_draft_token}")
    bs = flat_scores.shape[0]
    top_scores_index, draft_tokens = torch.empty(2, bs, num_draft_token - 1, dtype=torch.int64,
                                                 device=flat_scores.device)  # [bs, N-1] each
    select_draft_nodes(flat_scores, flat_tokens.to(torch.int64), top_scores_index, draft_tokens)
    if len(parents_list) > 1:
        parent_list = torch.cat(parents_list[:-1], dim=1)
    else:
        parent_list = torch.empty(bs, 0, dtype=torch.long, device=parents_list[0].device)
    return parent_list, top_scores_index, draft_tokens


class BuiltTree(NamedTuple):
    # FULL_MASK: [sum(seq_lens)*N + bs*N*N] bool; QLEN_ONLY: [bs*N*N] bool;
    # QLEN_ONLY_BITPACKING: [bs*N] uint8 / uint16 / uint32 (N <= 8 / 16 / 32)
    tree_mask: torch.Tensor
    # [bs*N] int64 seq_len + depth of each node
    positions: torch.Tensor
    # [bs, N] int64 global node index b*N + t
    retrive_index: torch.Tensor
    # [bs, N] int64 smallest-index child, -1 for a leaf
    retrive_next_token: torch.Tensor
    # [bs, N] int64 next larger-index sibling, -1 for the last
    retrive_next_sibling: torch.Tensor
    # [bs*N] tree tokens, each request's root (verified_id) first
    draft_tokens: torch.Tensor


_PACKED_DTYPES = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32}


def build_tree(
    verified_id: torch.Tensor,  # [bs] last verified token of each request (the root)
    parent_list: torch.Tensor,  # [bs, K*(S-1)+1]
    top_scores_index: torch.Tensor,  # [bs, N-1]
    draft_tokens: torch.Tensor,  # [bs, N-1]
    seq_lens: torch.Tensor,  # [bs] tokens already in the KV cache
    seq_lens_sum: int,
    topk: int,
    spec_steps: int,
    num_verify_tokens: int,
    tree_mask_mode: TreeMaskMode = TreeMaskMode.FULL_MASK,
) -> BuiltTree:
    """Allocate the verify-side tree buffers like SGLang does and fill them with the tree kernel."""
    n, mode = num_verify_tokens, TreeMaskMode(tree_mask_mode)
    bs, device = seq_lens.numel(), seq_lens.device
    tokens = torch.cat((verified_id.unsqueeze(1), draft_tokens), dim=1).flatten()  # [bs*N]
    if mode == TreeMaskMode.FULL_MASK:
        tree_mask = torch.full((seq_lens_sum * n + n * n * bs,), True, dtype=torch.bool, device=device)
    elif mode == TreeMaskMode.QLEN_ONLY:
        tree_mask = torch.full((n * n * bs,), True, dtype=torch.bool, device=device)
    else:
        tree_mask = torch.zeros((n * bs,), dtype=_PACKED_DTYPES[packed_mask_bytes(n)], device=device)
    retrive_index, retrive_next_token, retrive_next_sibling = torch.full(
        (3, bs, n), -1, dtype=torch.long, device=device
    )
    positions = torch.empty((bs * n,), dtype=torch.long, device=device)
    build_tree_kernel_efficient(
        parent_list.to(torch.long).contiguous(),
        top_scores_index.to(torch.long).contiguous(),
        seq_lens.to(torch.long),
        tree_mask,
        positions,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        topk,
        spec_steps,
        n,
        int(mode),
    )
    return BuiltTree(tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling, tokens)
