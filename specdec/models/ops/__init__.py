"""Fused per-layer ops of the Llama block: RMSNorm (optionally with the residual add), RoPE, SiLU-and-mul.

Each op is a thin wrapper that checks its inputs and dispatches; ``<op>_ref`` has the same
signature and is the specification: plain, differentiable torch with exactly the eager model's
numerics (the CPU path, and what training runs). Dispatch:

  Triton    on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1 (Triton's interpreter, so
            CI runs the kernels themselves); see ``specdec.models.ops.triton_kernels``
  reference otherwise: plain CPU, float64, triton missing, and whenever autograd records the op
            (a CUDA training step still differentiates through the reference)

The kernels do the reference's per-element arithmetic in the same order, in fp32, and round to the
model dtype wherever the reference does. They differ from it only in (a) the summation order of
the RMS statistic and (b) the library behind exp / cos / sin (on CUDA libdevice, which is the CUDA
math library torch's own kernels use; numpy in the interpreter). One program owns each token's
row (silu_and_mul: a fixed slice of it) with block sizes fixed by the feature size, so results are
deterministic and batch-invariant: a token's output does not depend on the other tokens of the
forward, which keeps speculative verification token-for-token equal to plain decoding.

``specdec.models.ops.stacked_linear`` fuses the other half of a layer's small kernels: q/k/v (and
gate/up) as one GEMM each, with the checkpoint's Parameters as views into the fused weight.

Glossary: T = num_tokens, H = hidden_size, D = head_dim, Hq / Hkv = query / KV heads,
I = intermediate_size.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import torch
import torch.nn.functional as F

__all__ = [
    "rms_norm",
    "rms_norm_ref",
    "add_rms_norm",
    "add_rms_norm_ref",
    "scaled_rms_norm",
    "scaled_rms_norm_ref",
    "add_scaled_rms_norm",
    "add_scaled_rms_norm_ref",
    "gelu_tanh_and_mul",
    "gelu_tanh_and_mul_ref",
    "apply_rope_",
    "apply_rope_ref",
    "silu_and_mul",
    "silu_and_mul_ref",
]

_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # float64 (tests) runs the reference


# ----------------------------------------------------------------------------- dispatch


_HAS_TRITON = importlib.util.find_spec("triton") is not None  # without importing it


def _load_kernels() -> ModuleType | None:
    """``specdec.models.ops.triton_kernels``, imported on first use; None when triton is missing."""
    if not _HAS_TRITON:
        return None
    from specdec.models.ops import triton_kernels  # NOTE: errors in our kernels must surface

    return triton_kernels


def _kernels_for(*tensors: torch.Tensor) -> ModuleType | None:
    """The Triton kernel module if it applies to ``tensors`` (all on one device), else None."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None  # NOTE: the kernels have no backward; autograd differentiates the reference
    if any(t.dtype not in _KERNEL_DTYPES for t in tensors):
        return None
    device = tensors[0].device.type
    if device == "cuda":
        return _load_kernels()
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        kernels = _load_kernels()
        # NOTE: triton reads TRITON_INTERPRET at import; compiled kernels cannot take CPU tensors.
        return kernels if kernels is not None and kernels.INTERPRETED else None
    return None


def _check(name: str, t: object, *, dim: int, dtypes: tuple[torch.dtype, ...] = _FLOATS) -> None:
    """Raise ValueError naming ``name`` unless ``t`` is a ``dim``-D tensor of ``dtypes`` with unit
    stride along its last dimension (rows may be strided, e.g. column slices of a fused GEMM)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name}: expected {dim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: expected dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: expected unit stride along the last dimension, got strides {t.stride()}")


def _same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"tensors on different devices: {devices}")


# ----------------------------------------------------------------------------- RMSNorm


def _check_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _check("x", x, dim=2)
    _check("weight", weight, dim=1)
    if weight.shape[0] != x.shape[1]:
        raise ValueError(f"weight: expected shape ({x.shape[1]},) to match x {tuple(x.shape)}, got {tuple(weight.shape)}")
    if not eps > 0:
        raise ValueError(f"eps={eps} must be > 0")
    _same_device(x=x, weight=weight)


def _check_residual(x: torch.Tensor, residual: torch.Tensor) -> None:
    _check("residual", residual, dim=2, dtypes=(x.dtype,))
    if residual.shape != x.shape:
        raise ValueError(f"residual: expected shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    _same_device(x=x, residual=residual)


def _normed_fp32(x: torch.Tensor, eps: float) -> torch.Tensor:  # [T, H] float32
    """x in fp32 times rsqrt(mean(x^2) + eps): the statistic every RMSNorm reference shares."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
) -> torch.Tensor:  # [T, H], dtype promote(x, weight)
    """``weight * (x / sqrt(mean(x^2) + eps))``; statistics in fp32, see ``rms_norm_ref``."""
    _check_norm(x, weight, eps)
    kernels = _kernels_for(x, weight)
    if kernels is None:
        return rms_norm_ref(x, weight, eps)
    return kernels.rms_norm(x, weight, eps)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Specification of ``rms_norm`` (HF Llama's RMSNorm): x in fp32 times rsqrt(mean(x^2) + eps),
    rounded back to x's dtype, then multiplied by the weight in the promoted dtype."""
    return weight * _normed_fp32(x, eps).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor,  # [T, H] e.g. a sublayer's output
    residual: torch.Tensor,  # [T, H] the residual stream so far
    weight: torch.Tensor,  # [H]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] normed, [T, H] new residual)
    """``(rms_norm(x + residual), x + residual)`` in one pass; see ``add_rms_norm_ref``."""
    _check_norm(x, weight, eps)
    _check_residual(x, residual)
    kernels = _kernels_for(x, residual, weight)
    if kernels is None:
        return add_rms_norm_ref(x, residual, weight, eps)
    return kernels.add_rms_norm(x, residual, weight, eps)


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Specification of ``add_rms_norm``: the sum is rounded to the model dtype (as the eager
    ``h = h + sublayer(h)`` does), and that rounded sum is what gets normalised."""
    new_residual = x + residual
    return rms_norm_ref(new_residual, weight, eps), new_residual


def _check_scale(x: torch.Tensor, scale: torch.Tensor, eps: float) -> None:
    _check_norm(x, scale, eps)
    if scale.dtype != torch.float32:
        raise ValueError(f"scale: expected float32 (Gemma's 1 + weight, exact), got {scale.dtype}")


def scaled_rms_norm(
    x: torch.Tensor,  # [T, H]
    scale: torch.Tensor,  # [H] float32
    eps: float,
) -> torch.Tensor:  # [T, H], x's dtype
    """``(x / sqrt(mean(x^2) + eps)) * scale`` in fp32, rounded once (Gemma's norm with ``scale = 1 +
    weight``, HF ``Gemma3RMSNorm``); see ``scaled_rms_norm_ref``."""
    _check_scale(x, scale, eps)
    kernels = _kernels_for(x, scale)
    if kernels is None:
        return scaled_rms_norm_ref(x, scale, eps)
    return kernels.scaled_rms_norm(x, scale, eps)


def scaled_rms_norm_ref(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """Specification of ``scaled_rms_norm``: x in fp32 times rsqrt(mean(x^2) + eps) times the fp32
    scale, rounded to x's dtype (unlike ``rms_norm_ref``, which rounds before the weight)."""
    return (_normed_fp32(x, eps) * scale).to(x.dtype)


def add_scaled_rms_norm(
    x: torch.Tensor,  # [T, H]
    residual: torch.Tensor,  # [T, H]
    scale: torch.Tensor,  # [H] float32
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] normed, [T, H] new residual)
    """``(scaled_rms_norm(x + residual), x + residual)`` in one pass; see ``add_scaled_rms_norm_ref``."""
    _check_scale(x, scale, eps)
    _check_residual(x, residual)
    kernels = _kernels_for(x, residual, scale)
    if kernels is None:
        return add_scaled_rms_norm_ref(x, residual, scale, eps)
    return kernels.add_scaled_rms_norm(x, residual, scale, eps)


def add_scaled_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, scale: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Specification of ``add_scaled_rms_norm``: the sum rounded to the model dtype, then normed."""
    new_residual = x + residual
    return scaled_rms_norm_ref(new_residual, scale, eps), new_residual


# ----------------------------------------------------------------------------- RoPE


def apply_rope_(
    q: torch.Tensor,  # [T, Hq * D] rotated in place
    k: torch.Tensor,  # [T, Hkv * D] rotated in place
    positions: torch.Tensor,  # [T] int
    inv_freq: torch.Tensor,  # [D/2] fp32, any rope scaling already applied
) -> None:
    """HF rotate_half RoPE of every head of q and k in place; see ``apply_rope_ref``.

    q and k may be column slices of one fused qkv GEMM output (strided rows) but must not overlap.
    """
    _check("q", q, dim=2)
    _check("k", k, dim=2, dtypes=(q.dtype,))
    _check("positions", positions, dim=1, dtypes=(torch.int32, torch.int64))
    _check("inv_freq", inv_freq, dim=1, dtypes=(torch.float32,))
    d = 2 * inv_freq.shape[0]
    t = q.shape[0]
    if k.shape[0] != t or positions.shape[0] != t:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, positions {tuple(positions.shape)}: token counts differ")
    if d == 0 or q.shape[1] % d or k.shape[1] % d:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)}: feature sizes must be multiples of head_dim={d}")
    _same_device(q=q, k=k, positions=positions, inv_freq=inv_freq)
    kernels = _kernels_for(q, k)
    if kernels is None:
        apply_rope_ref(q, k, positions, inv_freq)
    else:
        kernels.apply_rope_(q, k, positions, inv_freq)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> None:
    """Specification of ``apply_rope_`` (HF's rotate_half convention, angles in fp32).

    With a = position * inv_freq[i] and the head's pair (x_i, x_{i + D/2}), i < D/2::

        out_i       = x_i       * cos(a) - x_{i+D/2} * sin(a)
        out_{i+D/2} = x_{i+D/2} * cos(a) + x_i       * sin(a)

    computed in fp32 and rounded once to the tensor's dtype.
    """
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None]  # [T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, :]  # [T, 1, D]
    cos, sin = emb.cos(), emb.sin()
    for x in (q, k):
        xf = x.view(x.shape[0], -1, emb.shape[-1]).float()  # [T, heads, D]
        x.copy_((xf * cos + _rotate_half(xf) * sin).to(x.dtype).view(x.shape))


# ----------------------------------------------------------------------------- gated activations (SiLU, GELU) and mul


def _check_gate_up(gate_up: torch.Tensor) -> None:
    _check("gate_up", gate_up, dim=2)
    if gate_up.shape[1] % 2:
        raise ValueError(f"gate_up: expected an even feature size [T, 2I], got {tuple(gate_up.shape)}")


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    """``silu(gate) * up`` for the fused gate/up GEMM output ``[gate | up]``; see ``silu_and_mul_ref``."""
    _check_gate_up(gate_up)
    kernels = _kernels_for(gate_up)
    if kernels is None:
        return silu_and_mul_ref(gate_up)
    return kernels.silu_and_mul(gate_up)


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    """``gelu(gate, approximate="tanh") * up`` (Gemma's GeGLU) in one kernel; see ``gelu_tanh_and_mul_ref``."""
    _check_gate_up(gate_up)
    kernels = _kernels_for(gate_up)
    if kernels is None:
        return gelu_tanh_and_mul_ref(gate_up)
    return kernels.gelu_tanh_and_mul(gate_up)


def gelu_tanh_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """Specification of ``gelu_tanh_and_mul``: ``F.gelu(gate, approximate="tanh")`` rounded to the dtype,
    then multiplied by ``up`` and rounded again, as eager torch does."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """Specification of ``silu_and_mul``: ``silu(gate)`` (``gate / (1 + exp(-gate))`` in fp32) is
    rounded to the dtype, then multiplied by ``up`` and rounded again, as eager torch does."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
