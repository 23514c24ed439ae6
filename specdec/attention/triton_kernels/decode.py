"""``decode_attention``: one query row per sequence over its listed KV slots (flash-decoding).

Grid ``(num_seqs, num_kv_heads, num_splits)``. A program loads the ``group = num_heads /
num_kv_heads`` query heads that share its KV head as the rows of one tile (padded to 16 rows for
``tl.dot``), so each K/V tile is read once per KV head, not once per query head. A sequence's last
DECODE_TAIL (16) entries are its tail, folded as one tile of their own; the entries before them, its
body, are cut over the splits: split ``s`` covers body entries ``[s * chunk, (s + 1) * chunk)``, where
the sequence's own ``chunk`` is its body over the split count, rounded up to whole tiles
(``split_chunk``), and the last split with body entries (split 0 if none) folds the tail after them
(``decode_ranges``). With one split the program writes the output directly, otherwise partials that
``merge_partials`` combines. The tail is what lets a verify tree's nodes share every other tile
(``verify_rows.py``): it holds a node's ancestors and itself.

The host plans the split count from a length bound (``max_kv_len``: the batch's longest sequence,
or under CUDA graphs the captured bound, often the server's whole context length); each sequence
then spreads its own entries over every split, so a short sequence under a long bound still takes
all the programs the plan gave it, one or two tiles each, instead of filling the first split alone.

Example, 2 sequences with kv lens 9 and 2, tiles of 2 entries, 3 splits, a tail of 2 entries (for
the example; it is 16):
    kv_indptr = [0, 9, 11]    kv_indices = [40 41 9 3 12 5 6 20 21 | 7 8]
    seq 0 (body 7, chunk 4): split 0 reads slots 40 41 9 3, split 1 12 5 6 and then its tail 20 21,
      split 2 nothing (lse = -inf, weight 0 in the merge)
    seq 1 (body 0): split 0 reads its tail 7 8, splits 1 and 2 nothing

Sliding windows (``window``, a local layer's): the query sits at the last entry's position and sees
the last ``window`` entries alone, so the body starts there, not at 0, and a local layer reads at
most ``window`` entries whatever the context (the plan is sized by ``min(bound, window)``,
``window_span``). The same example at window 5:
    seq 0: entries 4..8 (body 4..6, chunk 2): split 0 reads slots 12 5, split 1 6 and the tail 20 21
    seq 1: both entries, its tail, as without a window
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specdec.attention.triton_kernels.common import (
    attend_tile,
    DECODE_TAIL,
    decode_ranges,
    head_dim_block,
    LOG2E,
    check_device,
    dot_precision,
    query_tile,
    tile_dtype,
    is_streaming_grid,
    launch_config,
    plan_num_splits,
    store_rows,
    window_arg,
    window_span,
)
from specdec.attention.triton_kernels.merge import merge_partials, split_buffers
from specdec.kernels.common import check_tensor


@triton.jit
def _attend_entries(q, K, V, slots, offs_n, end, kv_head, stride_ks, stride_kh, stride_vs, stride_vh, offs_d, d_valid,
                    sm_scale_log2, m_i, l_i, acc, DOT_PRECISION: tl.constexpr, ROW_SUMS_BY_DOT: tl.constexpr):
    """``attend_tile`` over a sequence's entries ``offs_n`` [N] (``slots``: its slot list), those before ``end``."""
    n_valid = offs_n < end
    slot = tl.load(slots + offs_n, mask=n_valid, other=0).to(tl.int64)
    return attend_tile(q, K, V, slot, n_valid, n_valid[None, :], kv_head, stride_ks, stride_kh, stride_vs, stride_vh,
                       offs_d, d_valid, sm_scale_log2, m_i, l_i, acc, DOT_PRECISION, ROW_SUMS_BY_DOT)


@triton.jit(do_not_specialize=["window"])
def _decode_kernel(
    Q, K, V, O, LSE, kv_indptr, kv_indices, row_lens, kv_row_stride, sm_scale_log2, window,
    stride_qs, stride_qh,
    stride_ks, stride_kh, stride_vs, stride_vh,
    stride_os, stride_oh, stride_osplit,
    stride_ls, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr,
    DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr, ROW_TABLE: tl.constexpr, ROW_SUMS_BY_DOT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if ROW_TABLE:  # sequence s lists its slots in row s of a [num_seqs, kv_row_stride] table
        kv_start = seq.to(tl.int64) * kv_row_stride
        kv_len = tl.load(row_lens + seq)
    else:
        kv_start = tl.load(kv_indptr + seq)
        kv_len = tl.load(kv_indptr + seq + 1) - kv_start
    # the query is at the last entry's position: it sees entries [kv_len - window, kv_len) (the whole list
    # without a window: NO_WINDOW), cut into the splits' body parts and the tail (``decode_ranges``)
    win_lo = tl.maximum(kv_len - window, 0)
    lo, hi, tail_lo, folds_tail = decode_ranges(kv_len, win_lo, split, tl.num_programs(2), BLOCK_N, TAIL)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_valid = offs_h < GROUP
    d_valid = offs_d < HEAD_DIM
    head = kv_head * GROUP + offs_h  # [BLOCK_H] query heads of this KV head
    q_mask = h_valid[:, None] & d_valid[None, :]
    q = tl.load(Q + seq.to(tl.int64) * stride_qs + head[:, None] * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)
    q = query_tile(q, K)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        m_i, l_i, acc = _attend_entries(q, K, V, kv_indices + kv_start, start + tl.arange(0, BLOCK_N), hi, kv_head,
                                        stride_ks, stride_kh, stride_vs, stride_vh, offs_d, d_valid, sm_scale_log2,
                                        m_i, l_i, acc, DOT_PRECISION, ROW_SUMS_BY_DOT)
    if folds_tail:  # the last TAIL entries as one tile, its row sums as products (``decode_ranges``)
        m_i, l_i, acc = _attend_entries(q, K, V, kv_indices + kv_start, tail_lo + tl.arange(0, TAIL), kv_len,
                                        kv_head, stride_ks, stride_kh, stride_vs, stride_vh, offs_d, d_valid,
                                        sm_scale_log2, m_i, l_i, acc, DOT_PRECISION, True)

    o_ptrs = O + seq.to(tl.int64) * stride_os + head[:, None] * stride_oh + split * stride_osplit + offs_d[None, :]
    lse_ptrs = LSE + seq.to(tl.int64) * stride_ls + head * stride_lh + split
    store_rows(acc, m_i, l_i, o_ptrs, lse_ptrs, q_mask, h_valid, DIRECT)


def _check_inputs(q, k_buffer, v_buffer, kv_indptr, kv_indices, out) -> None:
    check_qkv(q, k_buffer, v_buffer, out)
    check_tensor("kv_indptr", kv_indptr, dtype=torch.int32, dim=1, device=q.device)
    check_tensor("kv_indices", kv_indices, dtype=torch.int32, dim=1, device=q.device)


def check_qkv(q, k_buffer, v_buffer, out) -> None:
    """The query rows, the KV cache's buffers and the output agree on device, heads and head_dim."""
    device = q.device
    check_device(device)
    if q.dim() != 3 or q.stride(-1) != 1:
        raise ValueError(f"q: expected [rows, num_heads, head_dim] with unit last stride, got {tuple(q.shape)}")
    if out.shape != q.shape or out.stride(-1) != 1 or out.device != device:
        raise ValueError(f"out: expected shape {tuple(q.shape)} on {device} with unit last stride")
    check_tensor("k_buffer", k_buffer, dim=3, device=device)
    check_tensor("v_buffer", v_buffer, dtype=k_buffer.dtype, shape=k_buffer.shape, device=device)
    if k_buffer.shape[2] != q.shape[2] or q.shape[1] % k_buffer.shape[1]:
        raise ValueError(
            f"q heads/dim {tuple(q.shape[1:])} do not fit the KV cache's {tuple(k_buffer.shape[1:])}"
        )


def decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    kv_indptr: torch.Tensor,  # [num_seqs + 1] int32
    kv_indices: torch.Tensor,  # [total_kv] int32 KV slots, in position order per sequence
    out: torch.Tensor,  # [num_seqs, num_heads, head_dim] (written)
    *,
    sm_scale: float,
    max_kv_len: int,
    num_splits: int | None = None,
    window: int | None = None,
) -> None:
    """Attention of each sequence's single query row over its KV entries: all of them, or with a
    sliding ``window`` the last ``window`` (the query sits at the last entry's position).

    ``max_kv_len`` (a host int, no sync) sizes the split plan; ``num_splits`` forces a split count.
    """
    _check_inputs(q, k_buffer, v_buffer, kv_indptr, kv_indices, out)
    if kv_indptr.shape[0] != q.shape[0] + 1:
        raise ValueError(f"kv_indptr: expected {q.shape[0] + 1} entries, got {kv_indptr.shape[0]}")
    # NOTE: row_lens and the row stride are not read without ROW_TABLE (kv_indptr stands in)
    launch_decode_grid(q, k_buffer, v_buffer, kv_indptr, kv_indices, kv_indptr, 0, out, sm_scale=sm_scale,
                       max_kv_len=max_kv_len, plan_seqs=q.shape[0], num_splits=num_splits, row_table=False,
                       window=window)


class DecodePlan(NamedTuple):
    """How a decode grid of ``plan_seqs`` sequences runs: what a verify node must share with the
    decode step of its token to equal it bit for bit."""
    splits: int
    block_h: int  # query-tile rows: the GROUP heads of a KV head, padded for ``tl.dot``
    block_n: int
    num_warps: int
    num_stages: int
    streaming: bool  # a large unsplit grid's small tiles (``launch_config(streaming=True)``)


def decode_plan(q: torch.Tensor, k_buffer: torch.Tensor, *, max_kv_len: int, plan_seqs: int,
                num_splits: int | None, window: int | None) -> DecodePlan:
    """The split count and tiles of the decode batch of ``plan_seqs`` sequences whose longest windowed
    range is ``window_span(max_kv_len, window)``."""
    hq, d = q.shape[1], q.shape[2]
    hkv = k_buffer.shape[1]
    block_h = max(16, triton.next_power_of_2(hq // hkv))
    tiles = tile_dtype(q.dtype, k_buffer.dtype)
    cfg = launch_config(q.device, block_m=block_h, head_dim=d, elem_size=tiles.itemsize)
    splits, _ = plan_num_splits(plan_seqs * hkv, window_span(max_kv_len, window), device=q.device,
                                tile=cfg.block_n, num_splits=num_splits)
    streaming = is_streaming_grid(q.device, plan_seqs * hkv, splits)
    if streaming:
        cfg = launch_config(q.device, block_m=block_h, head_dim=d, elem_size=tiles.itemsize, streaming=True)
    return DecodePlan(splits, block_h, cfg.block_n, cfg.num_warps, cfg.num_stages, streaming)


def launch_decode_grid(q, k_buffer, v_buffer, kv_indptr, kv_indices, row_lens, row_stride, out, *, sm_scale,
                       max_kv_len, plan_seqs, num_splits, row_table, window) -> None:
    """The decode grid (sequence, KV head, split), planned by ``decode_plan``; a sequence's slots come
    from ``kv_indptr`` or (``row_table``) from ``row_lens`` and the table's row stride."""
    num_seqs, hq, d = q.shape
    hkv = k_buffer.shape[1]
    if num_seqs == 0:
        return
    plan = decode_plan(q, k_buffer, max_kv_len=max_kv_len, plan_seqs=plan_seqs, num_splits=num_splits,
                       window=window)
    direct = plan.splits == 1
    partial, lse = split_buffers(out, plan.splits)
    _decode_kernel[(num_seqs, hkv, plan.splits)](
        q, k_buffer, v_buffer, partial, lse, kv_indptr, kv_indices, row_lens, row_stride, sm_scale * LOG2E,
        window_arg(window),
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1),
        GROUP=hq // hkv, HEAD_DIM=d, BLOCK_D=head_dim_block(d),
        BLOCK_H=plan.block_h, BLOCK_N=plan.block_n, TAIL=DECODE_TAIL,
        DIRECT=direct, DOT_PRECISION=dot_precision(tile_dtype(q.dtype, k_buffer.dtype), q.device),
        ROW_TABLE=row_table, ROW_SUMS_BY_DOT=plan.streaming, num_warps=plan.num_warps, num_stages=plan.num_stages,
    )
    if not direct:
        merge_partials(partial, lse, out)


def decode_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    sm_scale: float,
    max_kv_len: int,
    num_splits: int | None = None,
    window: int | None = None,
) -> None:
    """Specification of ``decode_attention``: softmax(q k^T * sm_scale) v per sequence, in fp32, over
    its entries, or with a ``window`` its last ``window`` entries (the query at the last's position).

    Query head h reads KV head ``h // (num_heads // num_kv_heads)``. The plan arguments
    (``max_kv_len``, ``num_splits``) do not change the result.
    """
    group = q.shape[1] // k_buffer.shape[1]
    indptr = kv_indptr.tolist()
    for s in range(q.shape[0]):
        lo = indptr[s] if window is None else max(indptr[s], indptr[s + 1] - window)
        slots = kv_indices[lo : indptr[s + 1]].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [kv, num_heads, d]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,khd->hk", q[s].float(), k) * sm_scale
        out[s] = torch.einsum("hk,khd->hd", torch.softmax(scores, dim=-1), v).to(out.dtype)
