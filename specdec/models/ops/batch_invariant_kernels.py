"""Triton kernel behind ``specdec.models.ops.batch_invariant``: ``out = x @ W^T (+ bias)`` with one
fixed reduction for every M.

Grid ``(cdiv(M, rows a program), cdiv(N, block_n))``, the M index fastest, so the programs that share
a weight tile run side by side. A program owns ``row_tiles`` x 16 rows by ``block_n`` output columns:
it walks K from 0 in BLOCK_K chunks, loads each chunk of W once, and multiplies it into each 16-row
tile of x with its own ``tl.dot`` into that tile's fp32 accumulator. Every dot is the same
[16, BLOCK_K] x [BLOCK_K, block_n] product whatever the launch (16 rows: one MMA's least, and
Triton's wgmma needs 64, so each compiles to the same MMA instruction), so each output element is
summed in the same order in every launch: no split-K, no M-dependent tile height or K chunk. Rows
past M load as zeros and are not stored; they change no other row's arithmetic.

The launch (``launch_for``) sets only what changes no element's arithmetic: how many 16-row tiles a
program carries (1 up to 16 rows; 8 past 64 rows, so a bs-128 step reads each weight tile once, not
eight times), the output-column width (narrowed until the grid fills the GPU: a 4096-wide projection
in 64-column tiles is 64 programs for 132 SMs) and the pipeline. tests/models/test_batch_invariant.py
checks a row's bits across launches (interpreted on CPU, compiled on a GPU);
benchmarks/det_linear.py times the launches against cuBLAS.

Graph capture: the launch allocates its output and reads no device value (no host sync), so it is
captured like any other kernel.

Imported only where Triton applies (CUDA, or CPU tensors under TRITON_INTERPRET=1).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

# the one arithmetic: each dot's rows (the MMA's least) and the K chunk
BLOCK_M, BLOCK_K = 16, 64
# a grid of fewer programs leaves SMs idle (an H200 has 132): narrower columns until it has this many
MIN_PROGRAMS = 256


class Launch(NamedTuple):
    row_tiles: int  # row tiles a program carries: 1, 2, 4 or 8
    block_n: int  # output columns a program owns: 16, 32 or 64
    num_warps: int
    num_stages: int
    tile_m: int = BLOCK_M  # rows of one dot: 16 (mma.sync on Hopper) or 64 (wgmma)


def launch_for(m: int, n: int) -> Launch:
    """The launch of an [m, K] x [K, n] product (none changes a row's bits: module docstring)."""
    row_tiles = 1 if m <= BLOCK_M else 2 if m <= 2 * BLOCK_M else 4 if m <= 4 * BLOCK_M else 8
    programs_m = triton.cdiv(m, row_tiles * BLOCK_M)
    block_n = 64
    while block_n > 16 and programs_m * triton.cdiv(n, block_n) < MIN_PROGRAMS:
        block_n //= 2
    if row_tiles == 1:  # a skinny product: weight bandwidth, a deep pipeline
        return Launch(row_tiles, block_n, num_warps=2, num_stages=8 if block_n == 16 else 6)
    return Launch(row_tiles, block_n, num_warps=4, num_stages=4 if row_tiles <= 4 else 3)


@triton.jit
def _dot_rows(acc, x_ptr, row0, offs_k, k_mask, M, stride_xm, w_t,
              COMPILED: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] += x[row0 : row0 + BLOCK_M, offs_k] @ w_t (rows past M as zeros)."""
    offs_m = (row0 + tl.arange(0, BLOCK_M)).to(tl.int64)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=(offs_m < M)[:, None] & k_mask[None, :],
                other=0.0)
    if COMPILED and IEEE:  # fp32 models: no TF32
        return tl.dot(x, w_t, acc, input_precision="ieee")
    elif COMPILED:
        return tl.dot(x, w_t, acc)
    else:  # NOTE: the interpreter's 16-bit dot is wrong (numpy has no bf16): exact fp32 products
        return tl.dot(x.to(tl.float32), w_t.to(tl.float32), acc, input_precision="ieee")


@triton.jit
def _store_rows(acc, b_ptr, out_ptr, row0, offs_n, n_mask, M, stride_om, HAS_BIAS: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """out[row0 : row0 + BLOCK_M, offs_n] = acc (+ bias), rows past M left alone."""
    offs_m = (row0 + tl.arange(0, BLOCK_M)).to(tl.int64)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(offs_m < M)[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["M"])
def _linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                   HAS_BIAS: tl.constexpr, COMPILED: tl.constexpr, IEEE: tl.constexpr, ROW_TILES: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    row0 = tl.program_id(0) * (ROW_TILES * BLOCK_M)
    offs_n = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    n_mask = offs_n < N
    # one accumulator per 16-row tile (those past ROW_TILES are never used: compiled away)
    a0 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    a1, a2, a3, a4, a5, a6, a7 = a0, a0, a0, a0, a0, a0, a0
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=n_mask[:, None] & k_mask[None, :],
                    other=0.0)
        w_t = tl.trans(w)  # [BLOCK_K, BLOCK_N], loaded once for every row tile
        a0 = _dot_rows(a0, x_ptr, row0, offs_k, k_mask, M, stride_xm, w_t, COMPILED, IEEE, BLOCK_M)
        if ROW_TILES > 1:
            a1 = _dot_rows(a1, x_ptr, row0 + BLOCK_M, offs_k, k_mask, M, stride_xm, w_t, COMPILED, IEEE, BLOCK_M)
        if ROW_TILES > 2:
            a2 = _dot_rows(a2, x_ptr, row0 + 2 * BLOCK_M, offs_k, k_mask, M, stride_xm, w_t, COMPILED, IEEE, BLOCK_M)
            a3 = _dot_rows(a3, x_ptr, row0 + 3 * BLOCK_M, offs_k, k_mask, M, stride_xm, w_t, COMPILED, IEEE, BLOCK_M)
        if ROW_TILES > 4:
            a4 = _dot_rows(a4, x_ptr, row0 + 4 * BLOCK_M, offs_k, k_mask, M, stride_xm, w_t, COMPILED, IEEE, BLOCK_M)
            a5 = _dot_rows(a5, x_ptr, row0 + 5 * BLOCK_M, offs_k, k_mask, M, stride_xm, w_t, COMPILED, IEEE, BLOCK_M)
            a6 = _dot_rows(a6, x_ptr, row0 + 6 * BLOCK_M, offs_k, k_mask, M, stride_xm, w_t, COMPILED, IEEE, BLOCK_M)
            a7 = _dot_rows(a7, x_ptr, row0 + 7 * BLOCK_M, offs_k, k_mask, M, stride_xm, w_t, COMPILED, IEEE, BLOCK_M)
    _store_rows(a0, b_ptr, out_ptr, row0, offs_n, n_mask, M, stride_om, HAS_BIAS, BLOCK_M)
    if ROW_TILES > 1:
        _store_rows(a1, b_ptr, out_ptr, row0 + BLOCK_M, offs_n, n_mask, M, stride_om, HAS_BIAS, BLOCK_M)
    if ROW_TILES > 2:
        _store_rows(a2, b_ptr, out_ptr, row0 + 2 * BLOCK_M, offs_n, n_mask, M, stride_om, HAS_BIAS, BLOCK_M)
        _store_rows(a3, b_ptr, out_ptr, row0 + 3 * BLOCK_M, offs_n, n_mask, M, stride_om, HAS_BIAS, BLOCK_M)
    if ROW_TILES > 4:
        _store_rows(a4, b_ptr, out_ptr, row0 + 4 * BLOCK_M, offs_n, n_mask, M, stride_om, HAS_BIAS, BLOCK_M)
        _store_rows(a5, b_ptr, out_ptr, row0 + 5 * BLOCK_M, offs_n, n_mask, M, stride_om, HAS_BIAS, BLOCK_M)
        _store_rows(a6, b_ptr, out_ptr, row0 + 6 * BLOCK_M, offs_n, n_mask, M, stride_om, HAS_BIAS, BLOCK_M)
        _store_rows(a7, b_ptr, out_ptr, row0 + 7 * BLOCK_M, offs_n, n_mask, M, stride_om, HAS_BIAS, BLOCK_M)


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
    grid = (triton.cdiv(m, cfg.row_tiles * cfg.tile_m), triton.cdiv(n, cfg.block_n))
    _linear_kernel[grid](x, weight, bias if bias is not None else x, out, m, n, k, x.stride(0), weight.stride(0),
                         out.stride(0), HAS_BIAS=bias is not None, COMPILED=not INTERPRETED,
                         IEEE=x.dtype == torch.float32, ROW_TILES=cfg.row_tiles,
                         BLOCK_M=cfg.tile_m, BLOCK_N=cfg.block_n, BLOCK_K=BLOCK_K, num_warps=cfg.num_warps,
                         num_stages=cfg.num_stages)
    return out


# True when triton was imported with TRITON_INTERPRET=1: the kernel then runs on CPU tensors only.
INTERPRETED = type(_linear_kernel).__name__ == "InterpretedFunction"
