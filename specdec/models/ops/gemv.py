"""The model's linear layers for few tokens: a Triton skinny GEMM (``gemv_kernels``) where it beats
cuBLAS.

A decode step of an 8B model at bs 1-8 (and a verify forward of up to 32 tokens) reads every weight
once; its time is the weight bytes over memory bandwidth plus what the kernels fail to overlap.
cuBLAS's kernels for a few rows leave 5-20% of the bandwidth unused at M = 1 (and cannot take part
in programmatic dependent launch, see ``specdec.models.ops.launch``). ``linear_ref`` (``F.linear``)
is the specification.

Dispatch, decided once per (token bucket, N, K) by ``plan`` from a fixed table measured on an H100
(benchmarks/results/2026-11-22-h100-gemv, 2026-11-26-h100-gemm-dispatch; no timing at run time, so
the eager warm-up and the CUDA-graph capture always take the same kernel):

  Triton   CUDA tensors, bf16 / fp16, 1 <= tokens <= MAX_TOKENS (WIDE_MAX_TOKENS for weights of
           N >= WIDE_N rows), no autograd, contiguous weight, 16-byte rows
  F.linear otherwise (cuBLAS on CUDA; on CPU the model keeps its reference numerics)

``cublas_only()`` switches the Triton path off (the baseline of tests and benchmarks), and with it
the W8A8 path below (its quantization is a Triton kernel).

FP8 copies (``attach_fp8_copy_``, for ``--speculative-draft-model-quantization fp8``): a weight may
carry an FP8 copy of itself (e4m3, one fp32 scale per row). ``linear`` then reads the copy:

  <= FP8_MAX_TOKENS  W8A16: ``(x @ W_fp8^T) * scale``, the Triton kernel widening each FP8 chunk
                     (half the weight bytes; its own tiling, ``_fp8_config``); ``linear_fp8_ref``
                     on CPU. Past 16 tokens the widening cost more than the bytes saved (H100: the
                     6x8x32 step at bs 4 11.73 ms against 11.61 with the 16-bit weights)
  more tokens        W8A8: x quantized per token too (the Triton ``quantize_rows_fp8``: e4m3 and one
                     scale a row), then an FP8 tensor-core GEMM with both scales in its epilogue and
                     fp32 accumulation (Hopper's fast FP8 accumulation saved at most 8 µs a head
                     forward and its errors were 1.3-1.6x the bf16 rounding's, growing with K): the
                     split-K Triton GEMM (``w8a8_kernels``) where its table has a tiling
                     (``_w8a8_config``), else ``torch._scaled_mm`` with row-wise scales;
                     ``linear_w8a8_ref`` on CPU. On a GPU without FP8 tensor cores (before sm89)
                     and for fp16 models (the GEMMs write bf16 only), the 16-bit weight

Measured and rejected (see the results README): fusing the RMSNorm or SiLU-and-mul into the GEMM
as a prologue. Every program must recompute the prologue from the whole input row, so the input is
re-read (from L2) once per program; at M = 1 that cost about what the separate kernel does, and at
M >= 2 it lost by 10-300%. Prefetching each program's weight rows into L2 before PDL's wait
(``cp.async.bulk.prefetch.L2``, 16 or 32 MiB a call), to overlap the kernel before: tp-2 decode at
bs 1 2.96 -> 3.26 / 3.36 ms (benchmarks/results/2026-12-01-h200x2-tp2-floor).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Iterator

import torch
import torch.nn.functional as F

from specdec.forward import batch_invariant_enabled
from specdec.models.ops import _HAS_TRITON
from specdec.models.ops.batch_invariant import linear_batch_invariant

__all__ = ["linear", "linear_ref", "linear_fp8_ref", "linear_w8a8_ref", "quantize_rows_fp8_ref",
           "attach_fp8_copy_", "cublas_only", "cublas_without_workspace", "plan", "MAX_TOKENS",
           "WIDE_MAX_TOKENS", "WIDE_N"]

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value
MAX_TOKENS = 32  # above this a GEMM reuses each weight tile enough for cuBLAS's tensor-core kernels
# ... except against wide weights (qkv, gate_up, lm_head): swap-AB tiles up to this many tokens
WIDE_MAX_TOKENS = 64
WIDE_N = 6144
# weights of this many rows take 32 x 512 chunks, 3 stages at 1-8 tokens (below; the MLP's gate_up
# and the EAGLE-3 head's lm_head, whole or a tensor-parallel shard)
MID_N_LOW, MID_N_HIGH = 12288, 40960
FP8_MAX_TOKENS = 16  # above this an FP8 copy's widening costs more than its bytes save: W8A8 (see the docstring)
_enabled = True


@contextlib.contextmanager
def cublas_only() -> Iterator[None]:
    """Within the block ``linear`` is ``F.linear`` (the model's computation before this module).

    NOTE: read when a layer runs, so a CUDA graph keeps what was in force at its capture.
    """
    global _enabled
    saved, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = saved


CUBLAS_NO_WORKSPACE = ":0:0"  # CUBLAS_WORKSPACE_CONFIG: no workspace


def cublas_without_workspace() -> bool:
    """Give cuBLAS no workspace in this process (``CUBLAS_WORKSPACE_CONFIG=:0:0``), unless the user set
    that variable; returns whether cuBLAS runs without one. The engine calls it on CUDA before loading.

    With a workspace cuBLAS splits K where M leaves too few output tiles (Llama-3.1-8B's o_proj at 33-48
    rows, down_proj at 33-288 on an H200), and a token's row then differs in the last bits from the
    same row at another M: a verify's bs x nodes rows from the decode step's bs rows, so greedy
    answers with speculation part from plain decoding's at near-ties. Without one, at every M from 1 to
    2,048 each row of those shapes has the bits of the Triton kernel's row at M = 1; cuBLAS's time per
    shape moved by -10 to +10 %, whole 8B decode and verify steps not beyond their spread, and the
    captured graphs take 60-190 MiB less (benchmarks/results/2026-12-01-h200-linear-rows).

    NOTE: PyTorch's ``torch.use_deterministic_algorithms(True)`` accepts only ``:4096:8`` / ``:16:8``;
    a user who needs it sets one of those, which this keeps.
    """
    current = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if current is not None:
        return current == CUBLAS_NO_WORKSPACE
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_NO_WORKSPACE
    # PyTorch hands cuBLASLt (``torch._scaled_mm``, GEMMs with a bias) a share of the same workspace: none
    # too, asked for explicitly, else it warns once that it cut the default 1 MiB to nothing
    os.environ.setdefault("CUBLASLT_WORKSPACE_SIZE", "0")
    if torch.cuda.is_initialized():
        torch._C._cuda_clearCublasWorkspaces()  # NOTE: the next call's workspace follows the variable
    return True


@functools.cache
def _kernels():
    from specdec.models.ops import gemv_kernels  # NOTE: imports triton

    return gemv_kernels


def _applies(device: torch.device) -> bool:
    """CUDA only: on CPU the model keeps its reference numerics. (Tests run the kernel on CPU
    tensors through Triton's interpreter by patching this.)"""
    return device.type == "cuda"


def plan(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """The ``GemvConfig`` for this call, or None for ``F.linear``."""
    if not (_enabled and _HAS_TRITON and x.dim() == 2 and weight.dim() == 2 and 1 <= x.shape[0] <= WIDE_MAX_TOKENS):
        return None
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype or not weight.is_contiguous():
        return None
    if bias is not None and (bias.dtype != x.dtype or bias.dim() != 1 or bias.stride(0) != 1):
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return None  # NOTE: the kernel has no backward; autograd differentiates F.linear
    if x.stride(1) != 1 or x.shape[1] != weight.shape[1] or weight.shape[1] % 8 or not _applies(x.device):
        return None  # NOTE: 16-byte rows; shape errors are F.linear's to report
    if weight.device != x.device or (bias is not None and bias.device != x.device):
        return None
    return _config(_bucket(x.shape[0]), weight.shape[0], weight.shape[1])  # None past MAX_TOKENS for narrow weights


def _bucket(m: int) -> int:
    return 1 << (m - 1).bit_length()  # 1, 2, 4, 8, 16, 32, 64


@functools.lru_cache(maxsize=None)
def _config(m: int, n: int, k: int):
    """The kernel's tiling for ``m`` tokens (a bucket) and an [n, k] weight (None: cuBLAS).

    H100, Llama-3.1-8B shapes (qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336,
    lm_head 128256x4096, EAGLE-3 head 6144x8192 / 32000x4096), CUDA-graph replays with PDL:
      M = 1-32  tensor cores, 32 x 256, 4 stages: one tiling from 1 to 8 rows (16 below WIDE_N),
                so a token's row of the result does the same arithmetic whatever M is (a decode
                step and the same token among a verify's rows agree bit for bit; see below). Timed
                alone, cuBLAS is up to 4% faster on gate_up-sized N at M >= 8 and about as fast on
                the layers at M = 17-32; inside a decode step the Triton kernels overlap their
                neighbours (PDL) and cuBLAS's do not,
                and the whole step is faster: plain 8B decode 7.00 -> 6.46 ms at bs 8, 7.38 -> 7.01
                ms at bs 16, the chain 3x1x4 8.82 -> 8.65 ms at bs 8, against the table that left
                them to cuBLAS (2026-11-26-h100-gemm-dispatch)
      M = 9-32  N >= 6144: swap-AB (W x x^T), 128 x 128, 4 stages for N >= 16384 (gate_up at M = 32
                88.7 -> 82.3 µs, lm_head 357.3 -> 353.1; M = 16: 86.6 -> 81.0, 349.6 -> 347.1), 64 x 128,
                6 stages for N = 6144 (qkv 21.7 -> 20.4, M = 16: 20.3 -> 19.8); N = 4096 (o, down)
                kept 32 x 256, which no variant beat by more than 1% (2026-11-26-h100-verify-gemm)
      M = 33-64 N >= 6144 only (trees of 33-64 nodes at bs 1-2, a chain at bs 9-16, plain decode at
                bs 33-64): swap-AB, 64 tokens a tile; 128 x 128, 8 warps, 3 stages for N >= 16384
                (cuBLAS -> this at 48 tokens: gate_up 87.6 -> 83.6 µs, lm_head 384.2 -> 356.6), 64 x
                128, 5 stages for N = 6144 (qkv 21.3 -> 20.6). o and down stay with cuBLAS, which
                was as fast or up to 4% faster (2026-11-26-h100-wide-verify)

      N = 12288-40959 (gate_up 28672 and its tp-2 shard 14336, the EAGLE-3 lm_head 32000 and 16000),
                M = 1-8: 32 x 512, 3 stages, one tiling for all eight as above. H200, µs a call (32 x
                256 -> 32 x 512): gate_up at tp 2 40.7 -> 32.3 (M = 1), 40.5 -> 32.4 (M = 8), the
                head's lm_head at tp 2 41.3 -> 34.6; at tp 1 gate_up 62.2 -> 61.5 / 63.9 -> 61.2 and the
                head's lm_head 67.1 -> 64.1 / 67.0 -> 65.3. Whole steps at tp 2 (one call, A/B): plain
                bs 1 3.56 -> 3.31 ms, the chain 3x1x4 at bs 1 4.51 -> 4.26, bs 16 unchanged. The target's
                lm_head (64128, 128256 rows) and qkv (6144) were 1-12 % slower so, o and down (4096)
                within 3 % (benchmarks/results/2026-11-29-h200x2-relay)

    M = 1 and 2 ran an elementwise kernel until 2026-11-29 (4 x 1024 rows, or 8 x 512 prefetched; 4-22%
    faster than cuBLAS on the H100): its sums differ in the last bits from the tensor cores' sums
    of the verify's rows, which alone parted bf16 greedy answers with speculation at one request
    at a time. The tensor-core tiling at M = 1 cost 2% of the 8B plain decode step at bs 1 on an
    H200 (4.55 -> 4.64 ms; bs 8 and speculative steps unchanged: benchmarks/results/2026-11-29-h200-bf16-agreement).
    """
    cfg = _kernels().GemvConfig
    if m > MAX_TOKENS:
        if n < WIDE_N:
            return None
        if n >= 16384:
            return cfg(128, 128, num_warps=8, num_stages=3, use_dot=True, swap_ab=True)
        return cfg(64, 128, num_warps=4, num_stages=5, use_dot=True, swap_ab=True)
    if m >= 16 and n >= 16384:
        return cfg(128, 128, num_warps=4, num_stages=4, use_dot=True, swap_ab=True)
    if m >= 16 and n >= WIDE_N:
        return cfg(64, 128, num_warps=4, num_stages=6, use_dot=True, swap_ab=True)
    if MID_N_LOW <= n < MID_N_HIGH:
        return cfg(32, 512, num_warps=4, num_stages=3, use_dot=True)
    return cfg(32, 256, num_warps=4, num_stages=4, use_dot=True)


@functools.lru_cache(maxsize=None)
def _fp8_config(m: int, n: int, k: int):
    """The tiling for ``m`` tokens (a bucket) and an FP8 copy of an [n, k] weight: half the bytes a
    chunk of the 16-bit table moves, so the few-program shapes (N = 4096) take longer chunks.

    H100, µs a call, CUDA-graph replays over rotating weights, the 16-bit table's tiling -> this
    one (benchmarks/results/2026-11-26-h100-draft-fp8):
      M = 1     down 4096x14336 34.6 -> 31.9, EAGLE-3 fc 4096x12288 30.1 -> 28.2 (8 x 2048, no
                prefetch, for K >= 12288 at N = 4096); the rest 32 x 256, 4 stages (the 16-bit
                table's before its 32 x 512 for 12 k-40 k rows, not measured on FP8 weights)
      M = 2     tensor cores as for 3-16 (the elementwise 4 x 512 lost to 16-bit weights on the
                N = 4096 shapes: down 44.8 against 42.1)
      M = 2-16  32 x 256, 4 stages for N >= 6144 (gate_up 46-48, EAGLE-3 lm_head 50-52); 32 x 512,
                3 stages for N = 4096 (o 12.1 -> 11.2, down 34.9 -> 31.4, fc 30.4 -> 27.3)
    """
    cfg = _kernels().GemvConfig
    if m == 1 and n < 6144 and k >= 12288:
        return cfg(8, 2048)
    if n < 6144 and m > 1:
        return cfg(32, 512, num_warps=4, num_stages=3, use_dot=True)
    return cfg(32, 256, num_warps=4, num_stages=4, use_dot=True)


def linear(
    x: torch.Tensor,  # [T, K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # [T, N]
    """``F.linear(x, weight, bias)``, or with the weight's FP8 copy if it has one; see the module
    docstring for the dispatch.

    ``out_dtype`` (float32 for logits): ``F.linear(...).to(out_dtype)`` exactly, the result rounded
    to x's dtype and then widened; the Triton kernel does both in its store, which saves the
    separate cast (the verify's [64, 128256] logits: 24.5 us of a bs-1 step on an H100).
    """
    fp8 = getattr(weight, "fp8_copy", None)  # (W_fp8 [N, K], scale [N] fp32) or None
    if fp8 is None and batch_invariant_enabled() and x.dim() == 2:  # --enable-deterministic-inference
        return _linear_deterministic(x, weight, bias, out_dtype)
    if fp8 is not None and torch.is_grad_enabled() and weight.requires_grad:
        fp8 = None  # NOTE: autograd differentiates the 16-bit weight, not its copy
    if fp8 is not None and x.dim() == 2 and x.shape[0] > FP8_MAX_TOKENS:
        out = _linear_w8a8(x, *fp8, bias)
        if out is not None:
            return out if out_dtype is None else out.to(out_dtype)
        fp8 = None  # NOTE: the 16-bit weight
    config = plan(x, weight, bias)
    if config is None:
        if fp8 is None or x.device.type == "cuda":
            out = F.linear(x, weight, bias)
        else:
            out = linear_fp8_ref(x, *fp8, bias)
        return out if out_dtype is None else out.to(out_dtype)
    if bias is not None and bias.shape[0] != weight.shape[0]:
        raise ValueError(f"bias: expected shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if fp8 is None:
        return _kernels().gemv(x, weight, bias, config, out_dtype=out_dtype)
    config = _fp8_config(_bucket(x.shape[0]), weight.shape[0], weight.shape[1])
    return _kernels().gemv(x, fp8[0], bias, config, scale=fp8[1], out_dtype=out_dtype)


def _linear_deterministic(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          out_dtype: torch.dtype | None) -> torch.Tensor:
    """Deterministic inference's product: the table's tensor-core tiling where it has one, else the
    batch-invariant kernel (``specdec.models.ops.batch_invariant``; F.linear row by row off the GPU).

    Both walk K from 0 in order into one fp32 accumulator with no split, and on an H200 every tiling
    of either kernel gives a row the same bits (mma.sync or wgmma, swap-AB or not, 64- to 256-deep K
    chunks: tests/models/test_batch_invariant.py's GPU tests), so the choice by M changes the speed
    only. fp32 logits keep the unrounded sums, as the batch-invariant kernel stores them."""
    config = plan(x, weight, bias)
    if config is None or not config.use_dot or (bias is not None and bias.shape[0] != weight.shape[0]):
        return linear_batch_invariant(x, weight, bias, out_dtype=out_dtype)  # NOTE: it reports bad shapes
    return _kernels().gemv(x, weight, bias, config, out_dtype=out_dtype, round_out=False)


linear_ref = F.linear


def linear_fp8_ref(
    x: torch.Tensor,  # [T, K]
    weight_fp8: torch.Tensor,  # [N, K] float8_e4m3fn
    scale: torch.Tensor,  # [N] fp32
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [T, N], x's dtype
    """Specification of ``linear`` with an FP8 copy: ``x @ (scale * W_fp8)^T + bias``, the weight
    dequantized in fp32 and rounded to x's dtype (exact for fp32 and, up to the scale's rounding,
    what the kernel's fp32 accumulation computes)."""
    dequantized = (weight_fp8.float() * scale[:, None]).to(x.dtype)
    return F.linear(x, dequantized, bias)


def _linear_w8a8(
    x: torch.Tensor,  # [T, K]
    weight_fp8: torch.Tensor,  # [N, K] float8_e4m3fn
    scale: torch.Tensor,  # [N] fp32
    bias: torch.Tensor | None,  # [N]
) -> torch.Tensor | None:  # [T, N], x's dtype; None where no FP8 GEMM applies
    """W8A8 (module docstring): ``linear_w8a8_ref`` on CPU, the Triton quantization and an FP8
    GEMM on a GPU with FP8 tensor cores."""
    if x.device.type == "cpu":
        return linear_w8a8_ref(x, weight_fp8, scale, bias)
    if not _w8a8_applies(x, weight_fp8, bias):
        return None
    return _w8a8_product(x, weight_fp8, scale, bias)


def _w8a8_product(x: torch.Tensor, weight_fp8: torch.Tensor, scale: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """x quantized per token, then the Triton GEMM where its table has a tiling, else
    ``torch._scaled_mm`` (GPU only)."""
    xq, x_scale = _kernels().quantize_rows_fp8(x if x.stride(1) == 1 else x.contiguous())
    config = _w8a8_config(_bucket(x.shape[0]), *weight_fp8.shape)
    if config is not None:
        return _w8a8_kernels().w8a8_gemm(xq, x_scale, weight_fp8, scale, bias, config)
    # NOTE: _scaled_mm wants the second operand column-major: the [N, K] copy transposed is
    return torch._scaled_mm(xq, weight_fp8.t(), scale_a=x_scale[:, None], scale_b=scale[None, :], bias=bias,
                            out_dtype=torch.bfloat16)


@functools.lru_cache(maxsize=None)
def _w8a8_config(m: int, n: int, k: int):
    """The split-K Triton W8A8 GEMM's tiling for ``m`` tokens (a bucket) against an FP8 [n, k]
    weight, or None for ``torch._scaled_mm``.

    H100, µs a call of the GEMM alone (the quantization, 3-7 µs, is the same for both), an 8B
    EAGLE-3 head, ``torch._scaled_mm`` -> this table's tiling (2026-11-27-h100-w8a8-gemm,
    ``w8a8_tune.json``; floors: the FP8 bytes at 2.93 TB/s):
      <= 64 tokens  64 tokens x 64 rows a tile, K split in 2: qkv 6144x8192 31.8 -> 24.6 (32 tokens),
                    26.3 -> 25.0 (64); o 4096x4096 14.1 -> 10.8, 15.3 -> 10.9; down 4096x14336 38.8 ->
                    30.1, 37.6 -> 30.4; fc 4096x12288 33.8 -> 26.2, 32.2 -> 26.5 (floors 16.9, 5.6,
                    19.7, 16.9). N >= 16384: 64 x 128, unsplit: gate_up 28672x4096 48.8 -> 46.6, 48.2
                    -> 47.8; lm_head 32000x4096 51.8 -> 50.1, 53.3 -> 51.7 (floors 39.4, 44.0)
      <= 128        N = 4096 only: o 13.7 -> 12.1 (64 x 64, unsplit); down 37.0 -> 34.0, fc 32.1 ->
                    30.1 (128 x 64, 8 warps, K split in 2). cuBLAS is as fast or faster on the wide
                    weights here (qkv 25.8 against 27.8, gate_up 49.4 against 50.8)
      more          cuBLAS, faster at 256 tokens on every weight but o (down 37.5 against 41.8, gate_up
                    63.8 against 80.8, o 14.0 against 13.7)
    """
    cfg = _w8a8_kernels().W8A8Config
    if m <= 64:
        return cfg(64, 128, 128, split_k=1) if n >= 16384 else cfg(64, 64, 128, split_k=2)
    if m <= 128 and n < WIDE_N:
        return cfg(64, 64, 128, split_k=1) if k < 8192 else cfg(128, 64, 128, split_k=2, num_warps=8)
    return None


@functools.cache
def _w8a8_kernels():
    from specdec.models.ops import w8a8_kernels  # NOTE: imports triton

    return w8a8_kernels


def _w8a8_applies(x: torch.Tensor, weight_fp8: torch.Tensor, bias: torch.Tensor | None) -> bool:
    n, k = weight_fp8.shape
    return (_enabled and x.device.type == "cuda" and _HAS_TRITON and _has_fp8_mma(x.device)
            and x.dtype == torch.bfloat16 and x.dim() == 2 and x.shape[1] == k and k % 16 == 0 and n % 16 == 0
            and weight_fp8.device == x.device and (bias is None or bias.dtype == torch.bfloat16))


@functools.lru_cache(maxsize=None)
def _has_fp8_mma(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_rows_fp8_ref(
    x: torch.Tensor,  # [M, K]
) -> tuple[torch.Tensor, torch.Tensor]:  # ([M, K] float8_e4m3fn, [M] fp32)
    """Specification of the per-token FP8 quantization: per row ``scale = max|x| * fp32(1/448)``
    (at least the smallest normal fp32: a zero row's) and ``e4m3(x / scale)``, rounded to nearest
    even, saturating at +-448.

    NOTE: a product with the rounded reciprocal, not ``max|x| / 448``: torch divides by a Python
    number as a multiplication by its reciprocal on a GPU and as a division on CPU, which differ in
    the last bit for about half of all rows."""
    xf = x.float()
    inv = torch.tensor(1 / FP8_MAX, dtype=torch.float32, device=x.device)
    scale = (xf.abs().amax(dim=1) * inv).clamp_min(torch.finfo(torch.float32).tiny)  # [M]
    return (xf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def linear_w8a8_ref(
    x: torch.Tensor,  # [T, K]
    weight_fp8: torch.Tensor,  # [N, K] float8_e4m3fn
    scale: torch.Tensor,  # [N] fp32
    bias: torch.Tensor | None = None,  # [N]
) -> torch.Tensor:  # [T, N], x's dtype
    """Specification of ``linear`` with an FP8 copy past FP8_MAX_TOKENS tokens: x quantized per
    token (``quantize_rows_fp8_ref``), the FP8 product summed in fp32, both scales (and the bias)
    applied to the sum, one rounding to x's dtype: what ``torch._scaled_mm`` computes up to its
    summation order."""
    xq, x_scale = quantize_rows_fp8_ref(x)
    acc = F.linear(xq.float(), weight_fp8.float()) * x_scale[:, None] * scale[None, :]
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(x.dtype)


def attach_fp8_copy_(weight: torch.Tensor) -> torch.Tensor:
    """Give ``weight`` [N, K] an FP8 copy (``weight.fp8_copy``): per row, ``scale = max|w| / 448``
    and ``W_fp8 = e4m3(w / scale)``. The weight itself is kept; returns it.

    NOTE: the copy is an attribute of this tensor object, so a module that later replaces the
    tensor (``.to()``, a re-fuse) drops it: attach after the model is built and placed.
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight: expected a 2-D floating-point tensor, got {weight.dtype} {tuple(weight.shape)}")
    with torch.no_grad():
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / FP8_MAX  # [N]
        q = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)  # NOTE: a CUDA cast past 448 may give NaN
        weight.fp8_copy = (q.contiguous(), scale.contiguous())
    return weight
