"""Triton skinny GEMM behind ``specdec.models.ops.gemv``: ``out = x @ W^T (+ bias)`` for a few tokens
(M <= 32, or 64 against wide weights) against a bf16 / fp16 weight ``W [N, K]`` that is streamed from memory once.

Imported only where Triton applies (CUDA, or CPU tensors under TRITON_INTERPRET=1).

Grid: one program per (BLOCK_N rows of W, BLOCK_M tokens). A program streams its BLOCK_N x K slab of
W in BLOCK_K chunks (16-byte loads along K, evicted first: each weight byte is read once) and
reduces over the whole of K itself: no split-K, no atomics, so results are deterministic. Two inner
products, chosen per shape by the caller's config:

  USE_DOT=False  fp32 multiply-adds into a [BLOCK_M, BLOCK_N, BLOCK_K] accumulator, one reduction
                 over BLOCK_K at the end (M <= 2: no tensor-core padding, few registers)
  USE_DOT=True   ``tl.dot`` on [BLOCK_M >= 16, BLOCK_K] x [BLOCK_K, BLOCK_N] tiles (tensor cores,
                 fp32 accumulation; the padding rows cost arithmetic only), software-pipelined;
                 with SWAP_AB the product is taken transposed, W [BLOCK_N, BLOCK_K] x x^T
                 [BLOCK_K, BLOCK_M], so W's rows are the MMA's long side (BLOCK_N 64-128: Hopper's
                 warpgroup MMA) and the few tokens its short one; the [BLOCK_N, BLOCK_M] result is
                 stored transposed

FP8 weights (``HAS_SCALE``): W in float8 e4m3 with one fp32 scale per row. Each chunk is widened
to x's dtype (exactly: every e4m3 value is a bf16 / fp16 value) before the inner product, and the
row's scale multiplies the fp32 result: ``out = (x @ W_fp8^T) * scale (+ bias)``.

FP8 activations (``quantize_rows_fp8``, for the FP8 tensor-core GEMMs (``w8a8_kernels``, ``torch._scaled_mm``) that
``specdec.models.ops.gemv`` runs past FP8_MAX_TOKENS): one program per row of x takes the row's
largest magnitude, ``scale = max|x| * fp32(1/448)`` (at least the smallest normal fp32), and
stores ``e4m3(x / scale)`` and the scale, exactly as ``gemv.quantize_rows_fp8_ref`` computes them
(an IEEE division, rounding to nearest even, saturating). NOTE: Triton's interpreter converts
fp32 to e4m3 wrongly (a value that rounds up to the next power of two loses that power: 127.9 ->
64), so there the kernel stores ``x / scale`` in fp32 and the launch converts it with torch.

With ``PDL`` (see ``specdec.models.ops.launch``) a program waits for the previous kernel before it
reads x, then lets the next kernel launch. ``PREFETCH`` (elementwise path): each iteration issues
the load of the next W chunk before it uses the current one (two chunks in flight per thread), and
the first chunk is loaded before the wait: weights are never written, so their loads may overlap
the previous kernel's tail.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from specdec.models.ops.launch import pdl_kwargs


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """Tiling of one launch; ``block_m`` follows from M (see ``block_m_for``)."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 1
    use_dot: bool = False
    prefetch: bool = False  # elementwise path only
    swap_ab: bool = False  # tensor-core path only: W x x^T

    def block_m_for(self, m: int) -> int:
        p = triton.next_power_of_2(max(m, 1))
        if self.swap_ab:  # the tokens are the MMA's short side: up to 64 in one tile
            return max(16, min(p, 64))
        return max(16, min(p, 32)) if self.use_dot else min(p, 8)


@triton.jit
def _load_w(w_rows, offs_n, offs_k, n_limit, K, EVEN_K: tl.constexpr):
    """The [BLOCK_N, BLOCK_K] chunk of W at (``offs_n`` < ``n_limit``, ``offs_k``). A chunk past
    the end of K is masked off whole by ``n_limit`` = 0 when K is a multiple of BLOCK_K: the mask
    then varies along N only, so the loads along K stay 16 bytes wide."""
    if EVEN_K:
        mask = (offs_n < n_limit)[:, None]
    else:
        mask = (offs_n < n_limit)[:, None] & (offs_k < K)[None, :]
    return tl.load(w_rows + offs_k[None, :], mask=mask, other=0.0, eviction_policy="evict_first")


@triton.jit(do_not_specialize=["M"])
def _gemv_kernel(x_ptr, w_ptr, b_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                 HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, USE_DOT: tl.constexpr, COMPILED: tl.constexpr,
                 EVEN_K: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr, SWAP_AB: tl.constexpr,
                 ROUND_OUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    m_mask = offs_m < M
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n[:, None] * stride_wn
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    if PREFETCH:
        w_next = _load_w(w_rows, offs_n, tl.arange(0, BLOCK_K), N, K, EVEN_K)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    elif USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if PREFETCH:
            w = w_next
            w_next = _load_w(w_rows, offs_n, offs_k + BLOCK_K, tl.where(k0 + BLOCK_K < K, N, 0), K, EVEN_K)
        else:
            w = _load_w(w_rows, offs_n, offs_k, N, K, EVEN_K)
        if EVEN_K:
            x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None], other=0.0)
        else:
            x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & (offs_k < K)[None, :], other=0.0)
        if HAS_SCALE:
            w = w.to(x.dtype)  # NOTE: exact: e4m3 values are bf16 / fp16 values
        if SWAP_AB and COMPILED:
            acc = tl.dot(w, tl.trans(x), acc)
        elif SWAP_AB:  # NOTE: the interpreter's bf16 dot is wrong (numpy has no bf16): fp32 operands
            acc = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), acc, input_precision="ieee")
        elif USE_DOT and COMPILED:
            acc = tl.dot(x, tl.trans(w), acc)
        elif USE_DOT:
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    if SWAP_AB:  # acc [BLOCK_N, BLOCK_M]: scale, bias and the store on the transposed tile
        if HAS_SCALE:
            acc *= tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[:, None]
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        # NOTE: rounded to x's dtype first (ROUND_OUT): a wider out (fp32 logits) holds exactly that result
        if ROUND_OUT:
            acc = acc.to(x_ptr.dtype.element_ty)
        acc = acc.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], acc, mask=m_mask[None, :] & n_mask[:, None])
    else:
        if USE_DOT:
            out = acc
        else:
            out = tl.sum(acc, axis=2)
        if HAS_SCALE:
            out *= tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
        if HAS_BIAS:
            out += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if ROUND_OUT:
            out = out.to(x_ptr.dtype.element_ty)
        out = out.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], out, mask=m_mask[:, None] & n_mask[None, :])


def gemv(
    x: torch.Tensor,  # [M, K], unit stride along K
    weight: torch.Tensor,  # [N, K] contiguous, x's dtype or float8_e4m3fn (then with scale)
    bias: torch.Tensor | None,  # [N]
    config: GemvConfig,
    scale: torch.Tensor | None = None,  # [N] fp32, an FP8 weight's row scales
    out_dtype: torch.dtype | None = None,  # wider than x's: x's rounding, then widened in the store
    round_out: bool = True,  # False: a wider out_dtype holds the fp32 sums themselves
) -> torch.Tensor:  # [M, N]
    """Launch (no input checks: ``specdec.models.ops.gemv`` checks and dispatches)."""
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    block_m = config.block_m_for(m)
    grid = (triton.cdiv(n, config.block_n), triton.cdiv(m, block_m))
    _gemv_kernel[grid](
        x, weight, bias if bias is not None else x, scale if scale is not None else x, out, m, n, k, x.stride(0),
        weight.stride(0), out.stride(0), HAS_BIAS=bias is not None, HAS_SCALE=scale is not None,
        USE_DOT=config.use_dot, COMPILED=not INTERPRETED, EVEN_K=k % config.block_k == 0,
        PREFETCH=config.prefetch and not config.use_dot, SWAP_AB=config.use_dot and config.swap_ab, ROUND_OUT=round_out,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps,
        num_stages=config.num_stages, **pdl_kwargs(x.device))
    return out


@triton.jit
def _quantize_rows_fp8_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, FP8_MAX: tl.constexpr, INV_FP8_MAX: tl.constexpr,
                              TINY: tl.constexpr, COMPILED: tl.constexpr, PDL: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    offs = tl.arange(0, BLOCK_K)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) * INV_FP8_MAX, TINY)
    q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX)
    if COMPILED:
        q = q.to(tl.float8e4nv, fp_downcast_rounding="rtne")  # NOTE: the clamp above keeps it finite
    tl.store(q_ptr + row * K + offs, q, mask=mask)
    tl.store(s_ptr + row, scale)


INV_FP8_MAX = float(torch.tensor(1 / 448.0, dtype=torch.float32))  # 1/448 rounded to fp32, as the reference has it


def quantize_rows_fp8(
    x: torch.Tensor,  # [M, K], unit stride along K
) -> tuple[torch.Tensor, torch.Tensor]:  # ([M, K] float8_e4m3fn, [M] fp32 scales)
    """Launch (no input checks: ``specdec.models.ops.gemv`` checks and dispatches)."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn if not INTERPRETED else torch.float32, device=x.device)
    scale = torch.empty(m, dtype=torch.float32, device=x.device)
    if m > 0:
        block_k = triton.next_power_of_2(k)
        _quantize_rows_fp8_kernel[(m,)](x, q, scale, k, x.stride(0), FP8_MAX=448.0, INV_FP8_MAX=INV_FP8_MAX,
                                        TINY=torch.finfo(torch.float32).tiny,
                                        COMPILED=not INTERPRETED, BLOCK_K=block_k,
                                        num_warps=min(16, max(4, block_k // 1024)), **pdl_kwargs(x.device))
    return q.to(torch.float8_e4m3fn), scale


# True when triton was imported with TRITON_INTERPRET=1: the kernels then run on CPU tensors only.
INTERPRETED = type(_gemv_kernel).__name__ == "InterpretedFunction"
