"""Triton kernel behind ``specdec.models.ops.batch_invariant``: ``out = x @ W^T (+ bias)`` with one
fixed tiling for every M.

Grid ``(cdiv(N, BLOCK_N), cdiv(M, BLOCK_M))``; a program owns a BLOCK_M x BLOCK_N output tile and
walks K from 0 in BLOCK_K chunks, accumulating ``tl.dot`` in fp32. Rows past M load as zeros and are
not stored; they change no other row's arithmetic. Nothing depends on M but the grid's second
dimension, so each output element is summed in the same order in every launch.

Imported only where Triton applies (CUDA, or CPU tensors under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# the one tiling: rows, output features and the K chunk of a program (16 rows: the MMA's least)
BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64


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
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(m, BLOCK_M))
    _linear_kernel[grid](x, weight, bias if bias is not None else x, out, m, n, k, x.stride(0), weight.stride(0),
                         out.stride(0), HAS_BIAS=bias is not None, COMPILED=not INTERPRETED,
                         IEEE=x.dtype == torch.float32,
                         BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=4, num_stages=3)
    return out


# True when triton was imported with TRITON_INTERPRET=1: the kernel then runs on CPU tensors only.
INTERPRETED = type(_linear_kernel).__name__ == "InterpretedFunction"
