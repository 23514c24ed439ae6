"""Triton ``select_frontier`` and ``select_draft_nodes``.

``select_frontier``: one program per (request, block of BLOCK_H feature columns).

Each program holds the request's K x K child scores as one tile and takes the K best by K rounds
of (max, lowest index holding it, mask it out), which is the reference's stable order; then it
copies its [K, BLOCK_H] block of the parents' feature rows. The programs of column block 0 also
write the scores, parents, branches and tokens. (One program a request copying all the columns
took 12 us a draft step at bs 1 on an H100, most of it the serial copy.)

``select_draft_nodes``: one program per request. Each score becomes an int64 sort key that orders
like (score descending, index ascending): the fp32 bits mapped to an order-preserving unsigned
integer above the inverted index. One bitonic ``tl.sort`` of the keys ranks the proposals; the
first N-1 ranks' indices, sorted again, are the kept nodes in ascending order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton._common import custom_op, next_pow2

_BLOCK_H = 512


@triton.jit
def _frontier_kernel(scores_ptr, p_ptr, index_ptr, hidden_ptr, expand_ptr, best_ptr, parents_ptr, branch_ptr,
                     ids_ptr, hidden_out_ptr, k, h, s_stride0, s_stride1, p_stride0, p_stride1, parent_offset,
                     BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h0 = tl.program_id(1) * BLOCK_H
    # the one program of the request that writes the small outputs: its rows (branches) [0, k), the others' none
    # NOTE: a bound, not `mask & (program_id == 0)`: triton 3.9's interpreter gives a tensor mask and a scalar
    # comparison an int32 result, which tl.load/tl.store then reject
    written = tl.arange(0, BLOCK_K) < tl.where(tl.program_id(1) == 0, k, 0)  # [BLOCK_K]
    r = tl.arange(0, BLOCK_K)  # branch (row of the tile)
    c = tl.arange(0, BLOCK_K)  # child of the branch (column)
    valid = (r[:, None] < k) & (c[None, :] < k)  # [BLOCK_K, BLOCK_K]
    score = tl.load(scores_ptr + b * s_stride0 + r * s_stride1, mask=r < k, other=0.0)
    rows = b * k + r  # [BLOCK_K] this request's rows of topk_p / topk_index / hidden
    p = tl.load(p_ptr + rows[:, None] * p_stride0 + c[None, :] * p_stride1, mask=valid, other=0.0)
    expand = score[:, None] * p  # [BLOCK_K, BLOCK_K]
    flat = r[:, None] * k + c[None, :]  # child index j = r*K + c
    tl.store(expand_ptr + b * k * k + flat, expand, mask=valid & written[:, None])
    remaining = tl.where(valid, expand, -float("inf"))
    chosen = tl.zeros([BLOCK_K], dtype=tl.int64)  # [BLOCK_K] flat index of the i-th best
    for i in range(k):
        top = tl.max(tl.max(remaining, axis=1), axis=0)
        j = tl.min(tl.min(tl.where(remaining == top, flat, k * k), axis=1), axis=0)
        j = tl.minimum(j, k * k - 1)  # NOTE: NaN scores match nothing; never index past the request
        tl.store(best_ptr + b * k + i, top, mask=tl.program_id(1) == 0)
        chosen = tl.where(r == i, j, chosen)
        remaining = tl.where(flat == j, -float("inf"), remaining)
    out = r < k
    branch = chosen // k
    tl.store(parents_ptr + b * k + r, chosen + parent_offset, mask=written)
    tl.store(branch_ptr + b * k + r, branch, mask=written)
    token = tl.load(index_ptr + b * k * k + chosen, mask=written, other=0)
    tl.store(ids_ptr + b * k + r, token, mask=written)
    src = (b * k + branch) * h  # [BLOCK_K] first feature of each chosen parent's row
    dst = (b * k + r) * h
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
        # NOTE: at least one column block: its programs write the scores (a standalone draft has no features)
        _frontier_kernel[(bs, max(1, triton.cdiv(hidden.shape[1], _BLOCK_H)))](
            scores, topk_p, topk_index, hidden, expand_scores, best_scores, parents, parent_branch, input_ids,
            hidden_out, k, hidden.shape[1], scores.stride(0), scores.stride(1), topk_p.stride(0), topk_p.stride(1),
            parent_offset, BLOCK_K=next_pow2(k), BLOCK_H=_BLOCK_H)


_INDEX_BITS = 24  # score indices below 2**24 (K + (S-1)K^2: 16.8 M)


@triton.jit
def _draft_nodes_kernel(scores_ptr, tokens_ptr, kept_ptr, kept_tokens_ptr, m, kept,
                        BLOCK_M: tl.constexpr, INDEX_BITS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_M)
    score = tl.load(scores_ptr + b * m + i, mask=i < m, other=0.0)
    score = tl.where(score == 0.0, 0.0, score)  # -0.0 ties +0.0, as in torch's sort
    score = tl.where(score != score, float("nan"), score)  # every NaN the one positive NaN: first
    bits = score.to(tl.int32, bitcast=True)
    # fp32 order as unsigned order: negatives flip every bit, the rest set the sign bit
    order = tl.where(bits < 0, ~bits, bits ^ -2147483648).to(tl.int64) & 0xFFFFFFFF
    index_mask = (1 << INDEX_BITS) - 1
    key = (order << INDEX_BITS) | (index_mask - i)  # larger key: larger score, then smaller index
    key = tl.where(i < m, key, -1)  # padding ranks last
    ranked = tl.sort(key, descending=True)  # lane r holds the rank-r key
    first = tl.where(i < kept, index_mask - (ranked & index_mask), BLOCK_M)
    first = tl.sort(first)  # the kept indices ascending, padding (BLOCK_M) last
    out = i < kept
    tl.store(kept_ptr + b * kept + i, first, mask=out)
    tl.store(kept_tokens_ptr + b * kept + i, tl.load(tokens_ptr + b * m + first, mask=out, other=0), mask=out)


@custom_op("select_draft_nodes", ("top_scores_index", "draft_tokens"))
def _draft_nodes_op(scores: torch.Tensor, tokens: torch.Tensor, top_scores_index: torch.Tensor,
                    draft_tokens: torch.Tensor) -> None:
    (bs, m), kept = scores.shape, top_scores_index.shape[1]
    if bs and kept:
        _draft_nodes_kernel[(bs,)](scores, tokens, top_scores_index, draft_tokens, m, kept,
                                   BLOCK_M=next_pow2(m), INDEX_BITS=_INDEX_BITS)


def select_draft_nodes(scores, tokens, top_scores_index, draft_tokens) -> None:
    if scores.shape[1] >= 1 << _INDEX_BITS:
        raise ValueError(f"scores: at most {(1 << _INDEX_BITS) - 1} proposals a request, got {scores.shape[1]}")
    _draft_nodes_op(scores, tokens, top_scores_index, draft_tokens)


def select_frontier(scores, topk_p, topk_index, hidden, expand_scores, best_scores, parents, parent_branch,
                    input_ids, hidden_out, *, parent_offset: int) -> None:
    _frontier_op(scores, topk_p, topk_index, hidden, expand_scores, best_scores, parents, parent_branch, input_ids,
                 hidden_out, parent_offset)


IMPLS = {"select_frontier": select_frontier, "select_draft_nodes": select_draft_nodes}
