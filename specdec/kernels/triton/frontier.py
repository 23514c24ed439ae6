"""Triton ``select_frontier``: one program per request.

The program holds the request's K x K child scores as one tile, takes the K best by K rounds of
(max, lowest index holding it, mask it out), which is the reference's stable order, then gathers
the chosen tokens and copies the parents' feature rows in [K, BLOCK_H] tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton._common import custom_op, next_pow2

_BLOCK_H = 256


@triton.jit
def _frontier_kernel(scores_ptr, p_ptr, index_ptr, hidden_ptr, expand_ptr, best_ptr, parents_ptr, branch_ptr,
                     ids_ptr, hidden_out_ptr, k, h, s_stride0, s_stride1, p_stride0, p_stride1, parent_offset,
                     BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK_K)  # branch (row of the tile)
    c = tl.arange(0, BLOCK_K)  # child of the branch (column)
    valid = (r[:, None] < k) & (c[None, :] < k)  # [BLOCK_K, BLOCK_K]
    score = tl.load(scores_ptr + b * s_stride0 + r * s_stride1, mask=r < k, other=0.0)
    rows = b * k + r  # [BLOCK_K] this request's rows of topk_p / topk_index / hidden
    p = tl.load(p_ptr + rows[:, None] * p_stride0 + c[None, :] * p_stride1, mask=valid, other=0.0)
    expand = score[:, None] * p  # [BLOCK_K, BLOCK_K]
    flat = r[:, None] * k + c[None, :]  # child index j = r*K + c
    tl.store(expand_ptr + b * k * k + flat, expand, mask=valid)
    remaining = tl.where(valid, expand, -float("inf"))
    chosen = tl.zeros([BLOCK_K], dtype=tl.int64)  # [BLOCK_K] flat index of the i-th best
    for i in range(k):
        top = tl.max(tl.max(remaining, axis=1), axis=0)
        j = tl.min(tl.min(tl.where(remaining == top, flat, k * k), axis=1), axis=0)
        j = tl.minimum(j, k * k - 1)  # NOTE: NaN scores match nothing; never index past the request
        tl.store(best_ptr + b * k + i, top)
        chosen = tl.where(r == i, j, chosen)
        remaining = tl.where(flat == j, -float("inf"), remaining)
    out = r < k
    branch = chosen // k
    tl.store(parents_ptr + b * k + r, chosen + parent_offset, mask=out)
    tl.store(branch_ptr + b * k + r, branch, mask=out)
    token = tl.load(index_ptr + b * k * k + chosen, mask=out, other=0)
    tl.store(ids_ptr + b * k + r, token, mask=out)
    src = (b * k + branch) * h  # [BLOCK_K] first feature of each chosen parent's row
    dst = (b * k + r) * h
    for h0 in range(0, h, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        m = out[:, None] & (cols < h)[None, :]
        tile = tl.load(hidden_ptr + src[:, None] + cols[None, :], mask=m)
        tl.store(hidden_out_ptr + dst[:, None] + cols[None, :], tile, mask=m)


@custom_op("select_frontier", ("expand_scores", "best_scores", "parents", "parent_branch", "input_ids",
                               "hidden_out"))
def _frontier_op(scores: torch.Tensor, topk_p: torch.Tensor, topk_index: torch.Tensor, hidden: torch.Tensor,
                 expand_scores: torch.Tensor, best_scores: torch.Tensor, parents: torch.Tensor,
                 parent_branch: torch.Tensor, input_ids: torch.Tensor, hidden_out: torch.Tensor,
                 parent_offset: int) -> None:
    bs, k = scores.shape
    if bs and k:
        _frontier_kernel[(bs,)](
            scores, topk_p, topk_index, hidden, expand_scores, best_scores, parents, parent_branch, input_ids,
            hidden_out, k, hidden.shape[1], scores.stride(0), scores.stride(1), topk_p.stride(0), topk_p.stride(1),
            parent_offset, BLOCK_K=next_pow2(k), BLOCK_H=_BLOCK_H)


def select_frontier(scores, topk_p, topk_index, hidden, expand_scores, best_scores, parents, parent_branch,
                    input_ids, hidden_out, *, parent_offset: int) -> None:
    _frontier_op(scores, topk_p, topk_index, hidden, expand_scores, best_scores, parents, parent_branch, input_ids,
                 hidden_out, parent_offset)


IMPLS = {"select_frontier": select_frontier}
