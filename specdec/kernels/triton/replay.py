"""Triton kernels of the trace replay's steps (``specdec.kernels.replay``): one program per request
(``replay_rows``: per block of requests), each a few gathers from the trace's tables.

Indices read from the inputs are clamped into their tables (a trace row into [0, T), a frontier
branch and child rank into [0, k), a slot into [0, K]), so malformed input cannot read out of
bounds; valid input is unchanged by it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.position_hash import HASH_POSITION, HASH_ROW, seed_term
from specdec.kernels.triton._common import custom_op, next_pow2

_ROWS_BLOCK = 128


@triton.jit(do_not_specialize=["bs"])
def _rows_kernel(keys_ptr, table_ptr, rows_ptr, bs, table_mask, seed_key,
                 HASH_POSITION: tl.constexpr, HASH_ROW: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = b < bs
    key = tl.load(keys_ptr + b, mask=live, other=0)
    h = (key * HASH_POSITION + b * HASH_ROW + seed_key) & table_mask  # int64: wraps like the ref's, low bits kept
    tl.store(rows_ptr + b, tl.load(table_ptr + h, mask=live, other=0), mask=live)


@triton.jit
def _row_base(rows_ptr, b, num_rows, row_stride):
    row = tl.minimum(tl.maximum(tl.load(rows_ptr + b), 0), num_rows - 1)
    return row * row_stride


@triton.jit
def _store_children(probs_ptr, child_ptr, base, slot, b, k, TOPK: tl.constexpr, BLOCK_K: tl.constexpr):
    """child_p[b * k + j, c] = probs[base + slot[j] * TOPK + c] for j, c < k (``base``: row and depth)."""
    j = tl.arange(0, BLOCK_K)
    c = tl.arange(0, BLOCK_K)
    mask = (j < k)[:, None] & (c < k)[None, :]
    slot = tl.minimum(tl.maximum(slot, 0), TOPK)  # slot K: the sentinel
    p = tl.load(probs_ptr + base + slot[:, None] * TOPK + c[None, :], mask=mask, other=0.0)
    tl.store(child_ptr + (b * k + j)[:, None] * k + c[None, :], p, mask=mask)


@triton.jit
def _root_kernel(rows_ptr, probs_ptr, next_slot_ptr, root_p_ptr, slots_ptr, child_ptr, k, num_rows, row_stride,
                 depth_stride, TOPK: tl.constexpr, HAS_CHILDREN: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    base = _row_base(rows_ptr, b, num_rows, row_stride)
    j = tl.arange(0, BLOCK_K)
    live = j < k
    tl.store(root_p_ptr + b * k + j, tl.load(probs_ptr + base + j, mask=live, other=0.0), mask=live)
    slot = tl.load(next_slot_ptr + base + j, mask=live, other=0)
    tl.store(slots_ptr + b * k + j, slot, mask=live)
    if HAS_CHILDREN:
        _store_children(probs_ptr, child_ptr, base + depth_stride, slot, b, k, TOPK, BLOCK_K)


@triton.jit
def _advance_kernel(rows_ptr, slots_ptr, parents_ptr, probs_ptr, next_slot_ptr, new_slots_ptr, child_ptr, k, depth,
                    parent_offset, num_rows, row_stride, depth_stride, TOPK: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    base = _row_base(rows_ptr, b, num_rows, row_stride) + depth * depth_stride
    j = tl.arange(0, BLOCK_K)
    live = j < k
    key = tl.maximum(tl.load(parents_ptr + b * k + j, mask=live, other=parent_offset) - parent_offset, 0)
    branch = tl.minimum(key // k, k - 1)
    parent_slot = tl.minimum(tl.maximum(tl.load(slots_ptr + b * k + branch, mask=live, other=0), 0), TOPK)
    slot = tl.load(next_slot_ptr + base + parent_slot * TOPK + key % k, mask=live, other=0)
    tl.store(new_slots_ptr + b * k + j, slot, mask=live)
    _store_children(probs_ptr, child_ptr, base + depth_stride, slot, b, k, TOPK, BLOCK_K)


@triton.jit
def _accept_cdf_kernel(rows_ptr, ranks_ptr, cdf_ptr, k, depths, num_rows, recorded_depths,
                       BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    base = _row_base(rows_ptr, b, num_rows, recorded_depths)
    d = tl.arange(0, BLOCK_D)
    r = tl.arange(0, BLOCK_K)
    rank = tl.load(ranks_ptr + base + d, mask=d < depths - 1, other=-1)[:, None]  # the leaves' depth: -1
    cdf = ((rank >= 0) & (r[None, :] >= rank)).to(tl.float32)
    mask = (d < depths)[:, None] & (r < k)[None, :]
    tl.store(cdf_ptr + (b * depths + d[:, None]) * k + r[None, :], cdf, mask=mask)


@custom_op("replay_rows", ("rows",))
def _rows_op(keys: torch.Tensor, row_table: torch.Tensor, rows: torch.Tensor, seed: int) -> None:
    bs = keys.shape[0]
    if bs:
        _rows_kernel[(triton.cdiv(bs, _ROWS_BLOCK),)](
            keys, row_table, rows, bs, row_table.shape[0] - 1, seed_term(seed),
            HASH_POSITION=HASH_POSITION, HASH_ROW=HASH_ROW, BLOCK=_ROWS_BLOCK)


@custom_op("replay_root", ("root_p", "slots", "child_p"))
def _root_op(rows: torch.Tensor, probs: torch.Tensor, next_slot: torch.Tensor, root_p: torch.Tensor,
             slots: torch.Tensor, child_p: torch.Tensor | None) -> None:
    bs, k = root_p.shape
    if bs:
        t, s, slots_k, topk = probs.shape
        _root_kernel[(bs,)](rows, probs, next_slot, root_p, slots, root_p if child_p is None else child_p, k, t,
                            s * slots_k * topk, slots_k * topk, TOPK=topk, HAS_CHILDREN=child_p is not None,
                            BLOCK_K=next_pow2(k))


@custom_op("replay_advance", ("new_slots", "child_p"))
def _advance_op(rows: torch.Tensor, slots: torch.Tensor, parents: torch.Tensor, probs: torch.Tensor,
                next_slot: torch.Tensor, new_slots: torch.Tensor, child_p: torch.Tensor, depth: int,
                parent_offset: int) -> None:
    bs, k = slots.shape
    if bs:
        t, s, slots_k, topk = probs.shape
        _advance_kernel[(bs,)](rows, slots, parents, probs, next_slot, new_slots, child_p, k, depth, parent_offset,
                               t, s * slots_k * topk, slots_k * topk, TOPK=topk, BLOCK_K=next_pow2(k))


@custom_op("replay_accept_cdf", ("cdf",))
def _accept_cdf_op(rows: torch.Tensor, path_ranks: torch.Tensor, cdf: torch.Tensor) -> None:
    bs, depths, _, k = cdf.shape
    if bs:
        _accept_cdf_kernel[(bs,)](rows, path_ranks, cdf, k, depths, *path_ranks.shape,
                                  BLOCK_D=next_pow2(depths), BLOCK_K=next_pow2(k))


def replay_rows(keys, row_table, rows, *, seed: int) -> None:
    _rows_op(keys, row_table, rows, seed)


def replay_root(rows, probs, next_slot, root_p, slots, child_p) -> None:
    _root_op(rows, probs, next_slot, root_p, slots, child_p)


def replay_advance(rows, slots, parents, probs, next_slot, new_slots, child_p, *, depth: int,
                   parent_offset: int) -> None:
    _advance_op(rows, slots, parents, probs, next_slot, new_slots, child_p, depth, parent_offset)


def replay_accept_cdf(rows, path_ranks, cdf) -> None:
    _accept_cdf_op(rows, path_ranks, cdf)


IMPLS = {"replay_rows": replay_rows, "replay_root": replay_root, "replay_advance": replay_advance,
         "replay_accept_cdf": replay_accept_cdf}
