"""Triton kernel behind ``specdec.models.ops.batch_invariant``: ``out = x @ W^T (+ bias)`` with one
fixed reduction for every M.

Grid ``(cdiv(N, BLOCK_N), cdiv(M, BLOCK_M))``; a program owns a BLOCK_M x BLOCK_N output tile and
walks K from 0 in BLOCK_K chunks, accumulating ``tl.dot`` in fp32. Rows past M load as zeros and are
not stored; they change no other row's arithmetic. No split-K, no M-dependent tile height or K chunk,
so each output element is summed in the same order in every launch.

Two launch shapes, one arithmetic: up to BLOCK_M rows (a decode step at bs <= 16, a bs-1 verify)
run ``SMALL`` tiles, BLOCK_N narrowed to 16 columns (4x the programs: a 4096-wide projection at M = 1
had 64 programs for 132 SMs) with a deeper pipeline; more rows run the 64-column tiles. Per output
element nothing changes: the same 16-row x tile, the same BLOCK_K chunks walked from k = 0 in order
into the same fp32 accumulator, and at 16 rows both compile to the same MMA instruction (Triton's
wgmma needs 64 rows), so a row's bits are the same in either (tests/models/test_batch_invariant.py,
bitwise, interpreted on CPU and compiled on a GPU). Not yet timed on a GPU.

Graph capture: the launch allocates its output and reads no device value (no host sync), so it is
captured like any other kernel.

Imported only where Triton applies (CUDA, or CPU tensors under TRITON_INTERPRET=1).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

# the one tiling: rows, output features and the K chunk of a program (16 rows: the MMA's least)
BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64


class Launch(NamedTuple):
    block_n: int
    num_warps: int
    num_stages: int


# NOTE: only the output-column width and the pipeline may differ between launches (module docstring)
LARGE = Launch(block_n=BLOCK_N, num_warps=4, num_stages=3)
SMALL = Launch(block_n=16, num_warps=2, num_stages=8)


def launch_for(m: int) -> Launch:
    """The launch shape of an M-row product: SMALL while all rows fit one BLOCK_M tile."""
    return SMALL if m <= BLOCK_M else LARGE


@triton.jit(do_not_specialize=["M"])
def _linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                   HAS_BIAS: tl.constexpr, COMPILED: tl.constexpr, IEEE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
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
        else:  # NOTE: the interpreter's 16-bit dot is wrong (numpy has no bf16): exact fp32 products
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


def linear(
    x: torch.Tensor,  # [M, K], unit stride along K
    weight: torch.Tensor,  # [N, K] contiguous
    bias: torch.Tensor | None,  # [N]
    *,
    out_dtype: torch.dtype,
) -> torch.Tensor:  # [M, N]
    """Launch (``specdec.models.ops.batch_invariant`` checks the inputs)."""
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    cfg = launch_for(m)
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, BLOCK_M))
    _linear_kernel[grid](x, weight, bias if bias is not None else x, out, m, n, k, x.stride(0), weight.stride(0),
                         out.stride(0), HAS_BIAS=bias is not None, COMPILED=not INTERPRETED,
                         IEEE=x.dtype == torch.float32,
                         BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, BLOCK_K=BLOCK_K, num_warps=cfg.num_warps,
                         num_stages=cfg.num_stages)
    return out


# True when triton was imported with TRITON_INTERPRET=1: the kernel then runs on CPU tensors only.
INTERPRETED = type(_linear_kernel).__name__ == "InterpretedFunction"
