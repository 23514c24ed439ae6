"""Triton kernel behind ``specdec.models.ops.batch_invariant``: ``out = x @ W^T (+ bias)`` with one
fixed reduction for every M.

Grid ``(cdiv(M, tile_m), cdiv(N, block_n))``, the M index fastest, so the programs that share a
weight tile run side by side. A program owns a tile_m x block_n output tile and walks K from 0 in
block_k chunks, accumulating ``tl.dot`` in fp32. Rows past M load as zeros and are not stored; they
change no other row's arithmetic. No split-K: each element's sum runs over K from 0 in order, a
chunk at a time, each chunk as the tensor core's 16-deep steps into the same fp32 accumulator.

The launch (``launch_for``) changes only the tiling, by M and N: 16-row tiles up to 16 rows (Hopper's
mma.sync; narrow 16-column tiles and a deep pipeline for the skinny decode product), 64-row tiles
above (wgmma, which needs 64 rows: the weight read once per 64 rows, not once per 16), narrower ones
against weights of few rows (enough programs to keep every SM reading). A row's bits
are the same in every launch: on an H200 every launch ``benchmarks/det_linear.py --check`` tries,
16- and 64-row tiles, 16 to 128 columns, equals the 16-row decode launch bit for bit at the 8B's
shapes (``benchmarks/results/2026-11-29-h200-det-linear/``), and tests/models/test_batch_invariant.py
checks it at every run on a GPU (and interpreted on CPU).

Graph capture: the launch allocates its output and reads no device value (no host sync), so it is
captured like any other kernel.

Imported only where Triton applies (CUDA, or CPU tensors under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specdec.models.ops.launch import pdl_kwargs


class Launch(NamedTuple):
    tile_m: int  # rows of a program's tile: 16 (mma.sync on Hopper) or 64 (wgmma)
    block_n: int  # output columns of a program's tile
    num_warps: int
    num_stages: int
    block_k: int = 64  # the K chunk of one tl.dot


# NOTE: a launch may change only the tiling (module docstring); the fastest of det_linear.py's on an H200
SKINNY = Launch(tile_m=16, block_n=16, num_warps=2, num_stages=8, block_k=128)  # up to 16 rows
WIDE = Launch(tile_m=64, block_n=64, num_warps=4, num_stages=5, block_k=128)  # 17-64 rows
WIDER = Launch(tile_m=64, block_n=128, num_warps=4, num_stages=4, block_k=128)  # more
# weights of fewer rows (an 8B's o and down, N = 4096): narrower tiles, so that ~128 programs share the
# weight's read. H200, an 8B's 32 layers alone in one graph, ms (benchmarks/results/2026-11-29-h200-det-tilings):
# 64 rows, o 0.461 -> 0.391, down 1.401 -> 1.152 (cuBLAS 0.380, 1.143); 128 rows, o 0.639 -> 0.475, down
# 2.116 -> 1.623 (cuBLAS 0.444, 1.204)
NARROW_N = 6144
WIDE_NARROW = Launch(tile_m=64, block_n=32, num_warps=4, num_stages=5, block_k=128)  # 17-64 rows
WIDER_NARROW = Launch(tile_m=64, block_n=64, num_warps=4, num_stages=5, block_k=128)  # more


def launch_for(m: int, n: int) -> Launch:
    """The launch of an M-row product with an [n, K] weight."""
    if m <= 16:
        return SKINNY
    if m <= 64:
        return WIDE_NARROW if n < NARROW_N else WIDE
    return WIDER_NARROW if n < NARROW_N else WIDER


def fit_stages(launch: Launch, elem_bytes: int, shared_bytes: int) -> Launch:
    """``launch`` with no deeper a pipeline than ``shared_bytes`` of shared memory holds (each stage
    an x tile and a W tile), at least 2: the H200's 227 KiB hold launch_for's; fp32 inputs or a GPU
    with less (an A100's 163 KiB, 99 KiB on consumer parts) take fewer stages, the same arithmetic."""
    per_stage = (launch.tile_m + launch.block_n) * launch.block_k * elem_bytes
    return launch._replace(num_stages=max(2, min(launch.num_stages, shared_bytes // per_stage)))


@functools.cache
def _shared_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


@triton.jit(do_not_specialize=["M"])
def _linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                   HAS_BIAS: tl.constexpr, COMPILED: tl.constexpr, IEEE: tl.constexpr, ACC_DTYPE: tl.constexpr,
                   PDL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    m_mask = offs_m < M
    n_mask = offs_n < N
    if PDL:  # specdec.models.ops.launch: wait for the kernel before, then let the next one launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC_DTYPE)  # fp32; fp64 interpreted
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0)
        if COMPILED and IEEE:  # fp32 models: no TF32
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        elif COMPILED:
            acc = tl.dot(x, tl.trans(w), acc)
        else:  # NOTE: interpreted, tl.dot is numpy's (no bf16; its sum order follows the tile shape): fp64,
            # where the products and sums of the tests' values are exact in any order (ACC_DTYPE)
            acc = tl.dot(x.to(tl.float64), tl.trans(w.to(tl.float64)), acc, out_dtype=tl.float64)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(ACC_DTYPE)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
             acc.to(tl.float32).to(out_ptr.dtype.element_ty),  # NOTE: interpreted, fp64 -> bf16 is wrong
             mask=m_mask[:, None] & n_mask[None, :])


def linear(
    x: torch.Tensor,  # [M, K], unit stride along K
    weight: torch.Tensor,  # [N, K] contiguous
    bias: torch.Tensor | None,  # [N]
    *,
    out_dtype: torch.dtype,
    launch: Launch | None = None,  # launch_for's unless given (benchmarks/det_linear.py tries others)
) -> torch.Tensor:  # [M, N]
    """Launch (``specdec.models.ops.batch_invariant`` checks the inputs)."""
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    cfg = launch or launch_for(m, n)
    if not INTERPRETED:
        cfg = fit_stages(cfg, x.element_size(), _shared_bytes(x.device))
    grid = (triton.cdiv(m, cfg.tile_m), triton.cdiv(n, cfg.block_n))
    _linear_kernel[grid](x, weight, bias if bias is not None else x, out, m, n, k, x.stride(0), weight.stride(0),
                         out.stride(0), HAS_BIAS=bias is not None, COMPILED=not INTERPRETED,
                         IEEE=x.dtype == torch.float32, ACC_DTYPE=tl.float64 if INTERPRETED else tl.float32,
                         BLOCK_M=cfg.tile_m, BLOCK_N=cfg.block_n,
                         BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                         **pdl_kwargs(x.device))
    return out


# True when triton was imported with TRITON_INTERPRET=1: the kernel then runs on CPU tensors only.
INTERPRETED = type(_linear_kernel).__name__ == "InterpretedFunction"
