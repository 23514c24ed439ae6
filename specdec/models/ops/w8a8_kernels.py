"""Triton W8A8 GEMM behind ``specdec.models.ops.gemv``: ``out = (xq @ Wq^T) * x_scale * w_scale
(+ bias)`` on the FP8 tensor cores, for the few tokens of a draft forward (17-128: ``gemv._w8a8_config``).

Both operands are e4m3 with one fp32 scale per row (x per token from ``quantize_rows_fp8``, W per
output row from ``attach_fp8_copy_``), the product is summed in fp32 and both scales (then the bias)
are applied to the sum before one rounding to bf16: what ``torch._scaled_mm`` computes with row-wise
scales, up to the summation order.

Why not only ``torch._scaled_mm``: at these token counts the GEMM is a read of the weight, and
cuBLAS tiles N = 4096 (the head's o, down and fc) into 32 column tiles of 128 and a 128-token
wave: 32 programs on 132 SMs, which read 58.7 MB in 36 µs (down, 128 tokens) where the bytes take
19.5. Here the reduction over K is split too (``split_k`` programs a tile), so a wave fills the
GPU; the partial sums meet without atomics on the data and without a second kernel:

    every program   its [BLOCK_M, BLOCK_N] fp32 partial sum over its K range -> the workspace,
                    then takes a ticket for its tile (one atomic add, acquire-release, gpu scope)
    the last one    (ticket split_k - 1) sums the tile's partials in split order (deterministic),
                    applies the scales and bias, stores bf16 and resets the tile's counter to 0

so the counters are zero between calls and a CUDA graph replays the kernel as it is. NOTE: the
counters (one set per device) are shared by every launch on a device: launches must not run
concurrently on several streams of one device (the engine runs its forwards on one; with PDL a
launch waits for the previous kernel to finish before it takes a ticket).

The grid runs the token tiles of one weight tile next to each other (program id 0), so a weight
tile read by two token tiles can come from L2 the second time. ``max_num_imprecise_acc``: Hopper's
FP8 MMA accumulates in reduced precision unless the compiler promotes the sum to fp32 every so many
products (``promote_every``, 128: once a K chunk). On the H100 the promotion cost 2-45 % of a call
and kept an output row's error at 0.07 % of the exact product, against 0.24-0.37 % without it
(benchmarks/results/2026-11-27-h100-w8a8-gemm): the head's acceptance was measured with exact sums.

The loop has constant bounds and advances its pointers a chunk at a time: a first version bounded
by a runtime split length, with 64-bit token offsets, ran 2-10x slower (same results folder).

On CPU (TRITON_INTERPRET=1, tests) the operands are widened to fp32 for ``tl.dot``; the kernel
logic, the split and the tickets run as on the GPU.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from specdec.models.ops.launch import pdl_kwargs

# a ticket counter per (token tile, weight tile): 512 tokens x 64k weight rows in 64 x 64 tiles
MAX_TILES = 8192


@dataclasses.dataclass(frozen=True)
class W8A8Config:
    """Tiling of one launch: tokens and weight rows a tile, K a chunk, programs a tile along K."""

    block_m: int
    block_n: int
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    promote_every: int = 128  # K products between promotions of the MMA's sum to fp32 (sm90); 0: never


@triton.jit(do_not_specialize=["M"])
def _w8a8_kernel(xq_ptr, xs_ptr, wq_ptr, ws_ptr, b_ptr, out_ptr, part_ptr, ticket_ptr, M, N, K, stride_om,
                 HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, K_PER_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
                 COMPILED: tl.constexpr, PDL: tl.constexpr, PROMOTE_EVERY: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * K_PER_SPLIT + tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    # NOTE: 32-bit token offsets (M x K < 2^31), 64-bit weight rows; the loop's bounds are constants, the
    # pointers advance by a chunk: the compiler then pipelines the loads (asynchronous copies, 4 stages)
    x_ptrs = xq_ptr + offs_m[:, None] * K + offs_k[None, :]
    w_ptrs = wq_ptr + offs_n.to(tl.int64)[:, None] * K + offs_k[None, :]
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0, eviction_policy="evict_first")
        else:
            k_mask = offs_k + k0 < K
            x = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0, eviction_policy="evict_first")
        if COMPILED and PROMOTE_EVERY > 0:
            acc = tl.dot(x, tl.trans(w), acc, max_num_imprecise_acc=PROMOTE_EVERY)
        elif COMPILED:  # the MMA's own accumulation (Hopper: reduced precision)
            acc = tl.dot(x, tl.trans(w), acc)
        else:  # NOTE: the interpreter has no FP8 arithmetic: the same values in fp32
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if SPLIT_K > 1:
        local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [BLOCK_M, BLOCK_N]
        tile = pid_m * tl.num_programs(1) + pid_n
        tiles = tl.num_programs(0) * tl.num_programs(1)
        # the workspace [SPLIT_K, tiles, BLOCK_M * BLOCK_N] fp32, kept in L2 (.cg: never in an SM's L1)
        tl.store(part_ptr + (pid_k * tiles + tile).to(tl.int64) * (BLOCK_M * BLOCK_N) + local, acc, cache_modifier=".cg")
        tl.debug_barrier()  # every thread's partial is written before the tile's ticket is taken
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(part_ptr + (s * tiles + tile).to(tl.int64) * (BLOCK_M * BLOCK_N) + local,
                               cache_modifier=".cg")
            tl.store(ticket_ptr + tile, 0)  # the counter is zero again for the next launch
            _epilogue(acc, xs_ptr, ws_ptr, b_ptr, out_ptr, offs_m, offs_n, m_mask, n_mask, stride_om, HAS_BIAS)
    else:
        _epilogue(acc, xs_ptr, ws_ptr, b_ptr, out_ptr, offs_m, offs_n, m_mask, n_mask, stride_om, HAS_BIAS)


@triton.jit
def _epilogue(acc, xs_ptr, ws_ptr, b_ptr, out_ptr, offs_m, offs_n, m_mask, n_mask, stride_om, HAS_BIAS: tl.constexpr):
    """Both scales (then the bias) on the fp32 sum, one rounding to the output's dtype."""
    acc *= tl.load(xs_ptr + offs_m, mask=m_mask, other=0.0)[:, None]
    acc *= tl.load(ws_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


@functools.cache
def _tickets(device: torch.device) -> torch.Tensor:
    """[MAX_TILES] int32 zeros, one set per device, zero between launches (the last program of a
    tile resets its counter). NOTE: allocated at the first launch on the device, eagerly: the
    engine's warm-up runs every forward before it captures a CUDA graph."""
    return torch.zeros(MAX_TILES, dtype=torch.int32, device=device)


def w8a8_gemm(
    xq: torch.Tensor,  # [M, K] float8_e4m3fn, contiguous
    x_scale: torch.Tensor,  # [M] fp32
    weight_fp8: torch.Tensor,  # [N, K] float8_e4m3fn, contiguous
    w_scale: torch.Tensor,  # [N] fp32
    bias: torch.Tensor | None,  # [N] bf16
    config: W8A8Config,
) -> torch.Tensor:  # [M, N] bf16
    """Launch (no input checks: ``specdec.models.ops.gemv`` checks and dispatches)."""
    m, k = xq.shape
    n = weight_fp8.shape[0]
    out = torch.empty((m, n), dtype=torch.bfloat16, device=xq.device)
    if m == 0 or n == 0:
        return out
    grid = (triton.cdiv(m, config.block_m), triton.cdiv(n, config.block_n), config.split_k)
    chunks = triton.cdiv(k, config.block_k)
    k_per_split = triton.cdiv(chunks, config.split_k) * config.block_k
    tiles = grid[0] * grid[1]
    if config.split_k > 1:
        if tiles > MAX_TILES:
            raise ValueError(f"W8A8 split-K launch of {tiles} tiles exceeds MAX_TILES={MAX_TILES}")
        partials = torch.empty(config.split_k * tiles * config.block_m * config.block_n, dtype=torch.float32,
                               device=xq.device)
        tickets = _tickets(xq.device)
    else:
        partials = tickets = out  # NOTE: unused
    _w8a8_kernel[grid](
        xq, x_scale, weight_fp8, w_scale, bias if bias is not None else out, out, partials, tickets, m, n, k,
        out.stride(0), HAS_BIAS=bias is not None, SPLIT_K=config.split_k, K_PER_SPLIT=k_per_split,
        EVEN_K=k % config.block_k == 0 and k_per_split * config.split_k == k, COMPILED=not INTERPRETED,
        PROMOTE_EVERY=min(config.promote_every, config.block_k),  # NOTE: at most a chunk (a dot's K)
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps,
        num_stages=config.num_stages, **pdl_kwargs(xq.device))
    return out


# True when triton was imported with TRITON_INTERPRET=1: the kernel then runs on CPU tensors only.
INTERPRETED = type(_w8a8_kernel).__name__ == "InterpretedFunction"
