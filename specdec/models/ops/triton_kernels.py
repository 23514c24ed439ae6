"""Triton kernels behind ``specdec.models.ops``; imported only where Triton applies (CUDA, or CPU
under TRITON_INTERPRET=1).

Grids: one program per token row (``rms_norm``, ``add_rms_norm``, and ``apply_rope_``, whose
program rotates every q and k head of its token) or per (row, BLOCK-column slice)
(``silu_and_mul``); no program reads another row, so every row's result is the same whatever
else is in the batch. On Hopper every kernel is launched with programmatic dependent launch
(``specdec.models.ops.launch``): it waits for the previous kernel before its first load.

Matching the references: every launch passes ``enable_fp_fusion=False`` (torch's eager kernels
round each multiply and add separately; a fused multiply-add would not), divisions that the
reference does in IEEE fp32 use ``div_rn`` (Triton's ``/`` is approximate), and on a GPU exp /
cos / sin / rsqrt come from libdevice (the CUDA math library torch's kernels call) rather than the
approximate hardware instructions ``tl.exp`` / ``tl.cos`` lower to. The interpreter has no
libdevice and runs the numpy versions instead (``LIBDEVICE=False``). NOTE: the interpreter also
rounds fp32 -> bf16 toward zero (compiled kernels round to nearest even), so interpreted bf16
results can be one ulp off per rounding.

Each op is also a ``torch.library`` custom op (``torch.ops.specdec.*``) with a fake implementation,
which is what torch.compile traces; eager calls (CUDA-graph capture included) launch directly,
skipping the dispatcher round trip of a Python custom op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra import libdevice
except ImportError:  # older triton 3.x releases
    from triton.language.extra.cuda import libdevice

from specdec.models.ops.launch import pdl_kwargs


def _block(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


# ----------------------------------------------------------------------------- RMSNorm
@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, x_stride, res_stride, n_cols, eps,
                     HAS_RESIDUAL: tl.constexpr, ROUND_FIRST: tl.constexpr, LIBDEVICE: tl.constexpr,
                     PDL: tl.constexpr, BLOCK: tl.constexpr):
    """ROUND_FIRST: the normed row is rounded to x's dtype before the weight multiplies it (Llama's
    ``rms_norm``); else the fp32 scale multiplies it in fp32 and the product is rounded once
    (``scaled_rms_norm``: Gemma's ``x / rms(x) * (1 + w)``)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded to the model dtype, as eager
        tl.store(res_out_ptr + row * n_cols + cols, x, mask=mask)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = weighted_rms_norm(x, w, n_cols, eps, ROUND_FIRST, LIBDEVICE)
    tl.store(out_ptr + row * n_cols + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def weighted_rms_norm(x, w, n_cols, eps, ROUND_FIRST: tl.constexpr, LIBDEVICE: tl.constexpr):
    """A row ``x`` (its dtype; masked columns 0) normed and times ``w`` (fp32), in fp32, not rounded at
    the end: ``_rms_norm_kernel``'s arithmetic, shared with the fused all-reduce kernel."""
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / n_cols
    if LIBDEVICE:
        rstd = libdevice.rsqrt(mean_sq + eps)
    else:
        rstd = tl.rsqrt(mean_sq + eps)
    normed = xf * rstd
    if ROUND_FIRST:
        normed = normed.to(x.dtype).to(tl.float32)  # NOTE: rounded to x's dtype before the weight
    return w * normed


def _rms_norm_launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float, *, scaled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``scaled``: ``scaled_rms_norm``'s arithmetic (an fp32 scale, one rounding to x's dtype)."""
    t, h = x.shape
    out = torch.empty((t, h), dtype=x.dtype if scaled else torch.promote_types(x.dtype, weight.dtype), device=x.device)
    new_residual = torch.empty((t, h), dtype=x.dtype, device=x.device) if residual is not None else out
    if t:
        block = _block(h)
        res = residual if residual is not None else x
        _rms_norm_kernel[(t,)](x, res, weight, out, new_residual, x.stride(0), res.stride(0), h, eps,
                               HAS_RESIDUAL=residual is not None, ROUND_FIRST=not scaled, LIBDEVICE=not INTERPRETED,
                               BLOCK=block,
                               num_warps=min(max(block // 512, 1), 16), enable_fp_fusion=False,
                               **pdl_kwargs(x.device))
    return out, new_residual


@torch.library.custom_op("specdec::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _rms_norm_launch(x, None, weight, eps)[0]


@_rms_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


@torch.library.custom_op("specdec::add_rms_norm", mutates_args=())
def _add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _rms_norm_launch(x, residual, weight, eps)


@_add_rms_norm_op.register_fake
def _(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype)), x.new_empty(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return torch.ops.specdec.rms_norm(x, weight, eps)
    return _rms_norm_launch(x, None, weight, eps)[0]


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if torch.compiler.is_compiling():
        return torch.ops.specdec.add_rms_norm(x, residual, weight, eps)
    return _rms_norm_launch(x, residual, weight, eps)


def scaled_rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    return _rms_norm_launch(x, None, scale, eps, scaled=True)[0]


def add_scaled_rms_norm(x: torch.Tensor, residual: torch.Tensor, scale: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _rms_norm_launch(x, residual, scale, eps, scaled=True)


# ----------------------------------------------------------------------------- RoPE
# A program (2 warps) rotates one token, in tiles of at most _ROPE_TILE elements ([heads, D/2], for
# each half of the heads: 32 a thread). On an H100 at Llama-3.1-8B sizes (bf16, 32 + 8 heads of 128)
# this was the fastest of 1 / 2 / 4 / 8 warps and tiles of 1024 / 2048 / 4096 elements, 1 to 2048 tokens.
_ROPE_TILE = 2048


@triton.jit
def _rope_load(row_ptr, h0, N_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """Heads [h0, h0 + BLOCK_H) of one token's row: the halves (x_i, x_{i + D/2}), [BLOCK_H, BLOCK_D] each."""
    h = h0 + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    offs = h[:, None] * (2 * HALF) + d[None, :]
    mask = (h < N_HEADS)[:, None] & (d < HALF)[None, :]
    return tl.load(row_ptr + offs, mask=mask, other=0.0), tl.load(row_ptr + HALF + offs, mask=mask, other=0.0)


@triton.jit
def _rope_store(row_ptr, h0, x1, x2, cos, sin, N_HEADS: tl.constexpr, HALF: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rotate the tile ``_rope_load`` read and store it back in place."""
    h = h0 + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    offs = h[:, None] * (2 * HALF) + d[None, :]
    mask = (h < N_HEADS)[:, None] & (d < HALF)[None, :]
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    out1 = x1f * cos[None, :] - x2f * sin[None, :]
    out2 = x2f * cos[None, :] + x1f * sin[None, :]
    tl.store(row_ptr + offs, out1.to(x1.dtype), mask=mask)
    tl.store(row_ptr + HALF + offs, out2.to(x1.dtype), mask=mask)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, pos_ptr, inv_freq_ptr, q_stride, k_stride, N_Q_HEADS: tl.constexpr,
                 N_K_HEADS: tl.constexpr, HALF: tl.constexpr, LIBDEVICE: tl.constexpr, PDL: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr):
    """Rotate every head of token ``program_id(0)``, q then k, in place: the pairs (i, i + D/2) of
    each head, in tiles of BLOCK_HQ / BLOCK_HK heads. cos / sin of the token's D/2 angles are
    computed once and shared by all its heads; the first q and k tiles are loaded before, so their
    memory latency overlaps the trigonometry (all of q and k, at Llama sizes)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    q_row, k_row = q_ptr + t * q_stride, k_ptr + t * k_stride
    q1, q2 = _rope_load(q_row, 0, N_Q_HEADS, HALF, BLOCK_HQ, BLOCK_D)
    k1, k2 = _rope_load(k_row, 0, N_K_HEADS, HALF, BLOCK_HK, BLOCK_D)
    d = tl.arange(0, BLOCK_D)
    pos = tl.load(pos_ptr + t).to(tl.float32)
    angle = pos * tl.load(inv_freq_ptr + d, mask=d < HALF, other=0.0)  # [BLOCK_D] fp32, as the ref
    if LIBDEVICE:
        cos, sin = libdevice.cos(angle), libdevice.sin(angle)
    else:
        cos, sin = tl.cos(angle), tl.sin(angle)
    _rope_store(q_row, 0, q1, q2, cos, sin, N_Q_HEADS, HALF, BLOCK_HQ, BLOCK_D)
    for h0 in tl.static_range(BLOCK_HQ, N_Q_HEADS, BLOCK_HQ):
        q1, q2 = _rope_load(q_row, h0, N_Q_HEADS, HALF, BLOCK_HQ, BLOCK_D)
        _rope_store(q_row, h0, q1, q2, cos, sin, N_Q_HEADS, HALF, BLOCK_HQ, BLOCK_D)
    _rope_store(k_row, 0, k1, k2, cos, sin, N_K_HEADS, HALF, BLOCK_HK, BLOCK_D)
    for h0 in tl.static_range(BLOCK_HK, N_K_HEADS, BLOCK_HK):
        k1, k2 = _rope_load(k_row, h0, N_K_HEADS, HALF, BLOCK_HK, BLOCK_D)
        _rope_store(k_row, h0, k1, k2, cos, sin, N_K_HEADS, HALF, BLOCK_HK, BLOCK_D)


def _rope_launch(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> None:
    t = q.shape[0]
    half = inv_freq.shape[0]
    if t:
        hq, hk = q.shape[1] // (2 * half), k.shape[1] // (2 * half)
        block_d = _block(half)
        max_heads = max(1, _ROPE_TILE // block_d)  # NOTE: bounds registers; more heads take more tiles
        # NOTE: head counts and D/2 are constexpr (fixed per model: one compile), so the head loops unroll
        _rope_kernel[(t,)](q, k, positions, inv_freq, q.stride(0), k.stride(0), hq, hk, half,
                           LIBDEVICE=not INTERPRETED, BLOCK_D=block_d,
                           BLOCK_HQ=min(triton.next_power_of_2(max(hq, 1)), max_heads),
                           BLOCK_HK=min(triton.next_power_of_2(max(hk, 1)), max_heads),
                           num_warps=2, enable_fp_fusion=False, **pdl_kwargs(q.device))


@torch.library.custom_op("specdec::apply_rope_", mutates_args=("q", "k"))
def _rope_op(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> None:
    _rope_launch(q, k, positions, inv_freq)


@_rope_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> None:
    return None


def apply_rope_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> None:
    if torch.compiler.is_compiling():
        torch.ops.specdec.apply_rope_(q, k, positions, inv_freq)
    else:
        _rope_launch(q, k, positions, inv_freq)


# ----------------------------------------------------------------------------- SiLU and mul
_SILU_BLOCK = 512


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, n_cols, GELU_TANH: tl.constexpr, LIBDEVICE: tl.constexpr,
                         PDL: tl.constexpr, BLOCK: tl.constexpr):
    """act(gate) * up, act SiLU or (GELU_TANH) GELU's tanh approximation (Gemma's GeGLU): act in fp32,
    rounded to the model dtype, then the product rounded again, as eager torch computes them."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * x_stride + n_cols + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    if GELU_TANH:  # 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), torch's formula and order
        inner = 0.7978845608028654 * (g + 0.044715 * (g * g * g))
        if LIBDEVICE:
            th = libdevice.tanh(inner)
        else:  # the interpreter: tanh from exp (within a few fp32 ulps)
            th = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
        act = (0.5 * g * (1.0 + th)).to(gate.dtype)  # F.gelu's result, in the model dtype
    else:
        if LIBDEVICE:
            e = libdevice.exp(-g)
        else:
            e = tl.exp(-g)
        act = tl.math.div_rn(g, 1.0 + e).to(gate.dtype)  # F.silu's result, in the model dtype
    out = act.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, out.to(gate.dtype), mask=mask)


def _silu_and_mul_launch(gate_up: torch.Tensor, *, gelu_tanh: bool = False) -> torch.Tensor:
    t, n = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((t, n), dtype=gate_up.dtype, device=gate_up.device)
    if t and n:
        _silu_and_mul_kernel[(t, triton.cdiv(n, _SILU_BLOCK))](
            gate_up, out, gate_up.stride(0), n, GELU_TANH=gelu_tanh, LIBDEVICE=not INTERPRETED, BLOCK=_SILU_BLOCK,
            num_warps=4, enable_fp_fusion=False, **pdl_kwargs(gate_up.device))
    return out


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    return _silu_and_mul_launch(gate_up, gelu_tanh=True)


@torch.library.custom_op("specdec::silu_and_mul", mutates_args=())
def _silu_and_mul_op(gate_up: torch.Tensor) -> torch.Tensor:
    return _silu_and_mul_launch(gate_up)


@_silu_and_mul_op.register_fake
def _(gate_up: torch.Tensor) -> torch.Tensor:
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return torch.ops.specdec.silu_and_mul(gate_up)
    return _silu_and_mul_launch(gate_up)


# True when triton was imported with TRITON_INTERPRET=1: the kernels then run on CPU tensors only.
INTERPRETED = type(_rms_norm_kernel).__name__ == "InterpretedFunction"
