"""``row_attention``: deterministic inference's attention, one query row over its own KV list, cut
into splits of a fixed number of positions so that the result depends on that list alone.

Row r reads the first ``row_lens[r]`` entries of ``kv_table[row_list[r]]`` (``specdec.kernels.row_kv``
builds them: prefix, then tree ancestors or earlier new tokens, then itself, in position order).
Entry e of every list is the KV of position e, so the cuts below sit at the same absolute positions
for a decode step and for the same token as a verify node, and both reduce the same values in the
same order, bit for bit:

* split s = entries [s * SPLIT_LEN, (s + 1) * SPLIT_LEN) (SPLIT_LEN a multiple of the KV tile);
* split s belongs to program ``s % NUM_PROGRAMS`` of the row's (row, KV head); a program runs the
  online softmax over its splits' tiles in increasing order and writes one fp32 partial + lse;
* ``_merge_kernel`` folds the ``min(NUM_PROGRAMS, cdiv(len, SPLIT_LEN))`` used partials of a row
  in program order (two sequential loops, no tree reduction).

Example, SPLIT_LEN 4 (tiles of 2), NUM_PROGRAMS 2, a row of 11 entries: splits [0,4) [4,8) [8,11);
program 0 reads splits 0 and 2, program 1 split 1; the merge folds program 0 then program 1. A row of
the same length in any other launch (any batch, any grid) does exactly this.

A sliding window (``window``, a local layer's) keeps a row's last ``window`` entries (the row is at
its last entry's position): the splits stay at the same absolute positions, the first one the window
reaches is cut at the window's start, and they are dealt to the programs from that one on. The same
row at window 6 reads [5,8) and [8,11): program 0 split 1 from entry 5, program 1 split 2. Decode and
verify of one token still agree bit for bit (same length, same window).

Nothing depends on the launch but through ``max_kv_len``, a host bound that only sizes the grid
(``min(NUM_PROGRAMS, cdiv(max_kv_len, SPLIT_LEN))`` programs a row, fewer where a window reaches
fewer splits; those past a row's used ones loop over nothing and store nothing). Under a CUDA graph
it is the captured bound; nothing is read on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.attention.triton_kernels.common import (
    LOG2E,
    LaunchConfig,
    attend_tile,
    dot_precision,
    head_dim_block,
    launch_config,
    query_tile,
    store_rows,
    tile_dtype,
    window_arg,
)
from specdec.attention.rowwise import rowwise_attention
from specdec.attention.triton_kernels.decode import check_qkv
from specdec.kernels.common import check_tensor

# NOTE: constants of the run, not tuning knobs per launch: changing either changes the bits (the
# same for every row of a run, so decode and verify still agree). On a GPU: two 128-entry tiles a
# split and up to 8 programs a (row, KV head): a bs-1 decode of an 8-KV-head model at context 1 k
# runs 32 programs, and a row's fp32 partials stay bounded by 8 whatever the context bound. In the
# interpreter (CPU tests): splits of two 16-entry tiles, two programs, so short rows already fold
# several splits into one program.
GPU_SPLIT_LEN, GPU_NUM_PROGRAMS = 256, 8
CPU_SPLIT_LEN, CPU_NUM_PROGRAMS = 32, 2
# the GPU's KV tile (entries, warps, pipeline stages), a constant of the run as well (the tile width sets
# where the online softmax rescales); None: ``launch_config``'s for a 16-row query tile (128 x 4 x 3).
# Measured on an H200 (Llama-3-8B heads, bf16, one layer, CUDA-graph replay, µs; 128-4-3 -> 64-2-4): bs 1
# at context 1 k 17.0 -> 17.3, bs 64 98.7 -> 86.3, bs 128 183.1 -> 158.6; at 4 k 23.9 -> 25.5, 300.6 -> 274.5,
# 587.7 -> 531.9 (benchmarks/bench_row_attention.py; benchmarks/results/2026-11-29-h200-det-rows)
GPU_TILE: tuple[int, int, int] | None = (64, 2, 4)


def split_plan(device: torch.device) -> tuple[int, int]:
    """(SPLIT_LEN, NUM_PROGRAMS) on ``device``."""
    return (GPU_SPLIT_LEN, GPU_NUM_PROGRAMS) if device.type == "cuda" else (CPU_SPLIT_LEN, CPU_NUM_PROGRAMS)


@triton.jit
def first_split(kv_len, window, SPLIT_LEN: tl.constexpr):
    """(the window's first entry, the first split it reaches, splits it reaches) of a row of ``kv_len``."""
    win_lo = tl.maximum(kv_len - window, 0)
    first = win_lo // SPLIT_LEN
    return win_lo, first, tl.cdiv(kv_len, SPLIT_LEN) - first


@triton.jit(do_not_specialize=["window"])
def _row_kernel(
    Q, K, V, P, LSE, kv_table, row_list, row_lens, sm_scale_log2, window,
    stride_qs, stride_qh, stride_ks, stride_kh, stride_vs, stride_vh, stride_table,
    stride_pr, stride_ph, stride_pp, stride_lr, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT_LEN: tl.constexpr, NUM_PROGRAMS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    prog = tl.program_id(2)
    kv_len = tl.load(row_lens + row)
    win_lo, first, used = first_split(kv_len, window, SPLIT_LEN)
    entries = kv_table + tl.load(row_list + row).to(tl.int64) * stride_table
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    # a program past the row's used splits owns none of its entries: it stores nothing, the merge skips it
    # (NOTE: a bound, not `h_valid & (prog < used)`: triton 3.9's interpreter gives a tensor mask and a scalar
    # comparison an int32 result, which tl.load/tl.store then reject)
    h_valid = offs_h < tl.where(prog < used, GROUP, 0)
    d_valid = offs_d < HEAD_DIM
    head = kv_head * GROUP + offs_h  # [BLOCK_H] query heads of this KV head
    q_mask = h_valid[:, None] & d_valid[None, :]
    q = tl.load(Q + row.to(tl.int64) * stride_qs + head[:, None] * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)
    q = query_tile(q, K)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    # this program's splits, in order (the first cut at the window's start)
    for split_lo in range((first + prog) * SPLIT_LEN, kv_len, NUM_PROGRAMS * SPLIT_LEN):
        lo = tl.maximum(split_lo, win_lo)
        hi = tl.minimum(split_lo + SPLIT_LEN, kv_len)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_valid = offs_n < hi
            slot = tl.load(entries + offs_n, mask=n_valid, other=0).to(tl.int64)
            m_i, l_i, acc = attend_tile(q, K, V, slot, n_valid, n_valid[None, :], kv_head, stride_ks, stride_kh,
                                        stride_vs, stride_vh, offs_d, d_valid, sm_scale_log2, m_i, l_i, acc,
                                        DOT_PRECISION, False)
    o_ptrs = P + row.to(tl.int64) * stride_pr + head[:, None] * stride_ph + prog * stride_pp + offs_d[None, :]
    lse_ptrs = LSE + row.to(tl.int64) * stride_lr + head * stride_lh + prog
    store_rows(acc, m_i, l_i, o_ptrs, lse_ptrs, q_mask, h_valid, False)


@triton.jit(do_not_specialize=["window"])
def _merge_kernel(
    P, LSE, O, row_lens, num_heads, window,
    stride_pr, stride_ph, stride_pp, stride_lr, stride_lh, stride_or, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEADS: tl.constexpr,
    SPLIT_LEN: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)  # [HEADS]
    offs_d = tl.arange(0, BLOCK_D)
    h_valid = heads < num_heads
    o_mask = h_valid[:, None] & (offs_d < HEAD_DIM)[None, :]
    _, _, splits = first_split(tl.load(row_lens + row), window, SPLIT_LEN)
    used = tl.minimum(splits, NUM_PROGRAMS)
    lse_row = LSE + row * stride_lr + heads * stride_lh  # [HEADS] pointers
    m = tl.full([HEADS], float("-inf"), tl.float32)
    for p in range(0, used):
        m = tl.maximum(m, tl.load(lse_row + p, mask=h_valid, other=float("-inf")))
    m = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([HEADS], tl.float32)
    acc = tl.zeros([HEADS, BLOCK_D], tl.float32)
    for p in range(0, used):  # NOTE: in program order, one at a time: the fold is the same in every launch
        w = tl.exp2(tl.load(lse_row + p, mask=h_valid, other=float("-inf")) - m)
        part = tl.load(P + row * stride_pr + heads[:, None] * stride_ph + p * stride_pp + offs_d[None, :],
                       mask=o_mask, other=0.0)
        total += w
        acc += w[:, None] * part
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(O + row * stride_or + heads[:, None] * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=o_mask)


def _check_inputs(q, k_buffer, v_buffer, kv_table, row_list, row_lens, out) -> None:
    check_qkv(q, k_buffer, v_buffer, out)
    check_tensor("kv_table", kv_table, dtype=torch.int32, dim=2, device=q.device)
    check_tensor("row_list", row_list, dtype=(torch.int32, torch.int64), shape=(q.shape[0],), device=q.device)
    check_tensor("row_lens", row_lens, dtype=torch.int32, shape=(q.shape[0],), device=q.device)


def row_attention(
    q: torch.Tensor,  # [rows, num_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    kv_table: torch.Tensor,  # [num_lists, stride] int32 KV slots, position order
    row_list: torch.Tensor,  # [rows] the list each row reads
    row_lens: torch.Tensor,  # [rows] int32 how many of its entries
    out: torch.Tensor,  # [rows, num_heads, head_dim] (written)
    *,
    sm_scale: float,
    max_kv_len: int,
    window: int | None = None,
) -> None:
    """softmax(q k^T * sm_scale) v of each row over its list, or its last ``window`` entries, in fixed
    position splits (module docstring).

    ``max_kv_len`` (a host bound on ``row_lens``, no sync) sizes the grid only.
    """
    _check_inputs(q, k_buffer, v_buffer, kv_table, row_list, row_lens, out)
    rows, hq, d = q.shape
    hkv = k_buffer.shape[1]
    if rows == 0:
        return
    split_len, num_programs = split_plan(q.device)
    block_h = max(16, triton.next_power_of_2(hq // hkv))
    tiles = tile_dtype(q.dtype, k_buffer.dtype)
    cfg = launch_config(q.device, block_m=block_h, head_dim=d, elem_size=tiles.itemsize)
    if GPU_TILE is not None and q.device.type == "cuda":
        cfg = LaunchConfig(*GPU_TILE)
    if split_len % cfg.block_n:
        raise ValueError(f"row_attention: split length {split_len} is not a multiple of the {cfg.block_n}-entry tile")
    # NOTE: a window of w entries reaches up to cdiv(w, split_len) + 1 splits (it starts mid-split)
    reach = triton.cdiv(max_kv_len, split_len) if window is None else triton.cdiv(window, split_len) + 1
    programs = max(1, min(num_programs, triton.cdiv(max_kv_len, split_len), reach))
    partial = torch.empty(rows, hq, programs, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(rows, hq, programs, dtype=torch.float32, device=q.device)
    _row_kernel[(rows, hkv, programs)](
        q, k_buffer, v_buffer, partial, lse, kv_table, row_list, row_lens, sm_scale * LOG2E, window_arg(window),
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        kv_table.stride(0), partial.stride(0), partial.stride(1), partial.stride(2), lse.stride(0), lse.stride(1),
        GROUP=hq // hkv, HEAD_DIM=d, BLOCK_D=head_dim_block(d), BLOCK_H=block_h, BLOCK_N=cfg.block_n,
        SPLIT_LEN=split_len, NUM_PROGRAMS=num_programs, DOT_PRECISION=dot_precision(tiles, q.device),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    heads = min(triton.next_power_of_2(hq), 16)
    _merge_kernel[(rows, triton.cdiv(hq, heads))](
        partial, lse, out, row_lens, hq, window_arg(window),
        partial.stride(0), partial.stride(1), partial.stride(2), lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=d, BLOCK_D=head_dim_block(d), HEADS=heads, SPLIT_LEN=split_len, NUM_PROGRAMS=num_programs,
    )


# the specification: torch_native's own deterministic attention (no triton needed there)
row_attention_ref = rowwise_attention
