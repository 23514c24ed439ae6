"""The Llama family's layers: RMSNorm, RoPE, attention, the gated MLP and the decoder layer that
``specdec.models.llama``'s target stacks (Gemma 3 and the EAGLE heads reuse them).

Glossary: T = num_tokens of the forward, H = hidden_size, D = head_dim, Hq / Hkv = query / KV
heads, I = intermediate_size. Attention goes through ``batch.attn_backend`` (which also writes the
KV cache); norms, RoPE and SiLU-and-mul are the fused ops of ``specdec.models.ops`` (Triton on
CUDA, the torch reference on CPU). q/k/v and gate/up run as one GEMM each (``StackedLinear``), and
every linear layer goes through ``ops.gemv.linear``.

One decoder layer, as kernels (residual = the residual stream, carried next to each layer's output
so that every residual add happens inside the following norm):

    x, residual = add_rms_norm(x, residual)       input_layernorm (layer 0: rms_norm, residual = x)
    qkv = x @ [Wq | Wk | Wv]^T                     one GEMM, q/k/v are column slices
    apply_rope_(q, k)                              in place
    attn = attention(q, k, v)                      the backend: KV-cache write + attention
    x = attn @ Wo^T
    x, residual = add_rms_norm(x, residual)       post_attention_layernorm
    x = silu_and_mul(x @ [Wgate | Wup]^T) @ Wdown^T

Variation is resolved once, at construction: ``config.qk_norm`` adds per-head q/k RMSNorms before
RoPE (Qwen3), ``config.layer_window(i)`` gives a layer a sliding window (Mistral), ``hidden_act``
picks the gated activation, and ``tp`` (``specdec.models.parallel.TPGroup``) shards heads and
intermediate features over tensor-parallel ranks: o_proj and down_proj then return partial sums,
and the norm after each all-reduces them in the same kernel as its residual add
(``TPGroup.all_reduce_add_rms_norm``), so a layer's two all-reduces add no kernel of their own
where the group's all-reduce fuses (our push kernel, one host's GPUs).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch
from torch import nn

from specdec.attention.base import AttentionLayer
from specdec.forward import ForwardBatch
from specdec.models.config import LlamaConfig
from specdec.models.ops import add_rms_norm, apply_rope_, gelu_tanh_and_mul, rms_norm, silu_and_mul
from specdec.models.ops.gemv import linear
from specdec.models.ops.stacked_linear import FusedGemmModule, StackedLinear
from specdec.models.parallel import SINGLE, TPGroup

__all__ = [
    "RMSNorm",
    "IdentityNorm",
    "rope_inv_freq",
    "RotaryEmbedding",
    "row_parallel",
    "LlamaAttention",
    "gelu_tanh_and_mul",
    "LlamaMLP",
    "LlamaDecoderLayer",
]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, *, dtype: torch.dtype, device: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        # NOTE: statistics in fp32, then back to the input dtype before the weight (as HF does).
        return rms_norm(x, self.weight, self.eps)

    def forward_add(
        self,
        x: torch.Tensor,  # [T, H]
        residual: torch.Tensor | None,  # [T, H]
        tp: TPGroup = SINGLE,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] normed, [T, H] residual stream)
        """``(norm(x + residual), x + residual)`` in one kernel; ``(norm(x), x)`` when residual is None.
        With several ``tp`` ranks and a residual, ``x`` is this rank's partial sum, all-reduced first
        (in the same kernel where the group's all-reduce can: ``TPGroup.all_reduce_add_rms_norm``)."""
        if residual is None:
            return self(x), x
        if tp.size > 1:
            return tp.all_reduce_add_rms_norm(x, residual, self.weight, self.eps)
        return add_rms_norm(x, residual, self.weight, self.eps)


class IdentityNorm(nn.Module):
    """No norm (EAGLE-1's first draft layer; no weight in the checkpoint), with RMSNorm's interface."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward_add(
        self, x: torch.Tensor, residual: torch.Tensor | None, tp: TPGroup = SINGLE
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stream = x if residual is None else tp.all_reduce(x) + residual  # NOTE: RMSNorm.forward_add's tp
        return stream, stream


def rope_inv_freq(head_dim: int, theta: float, scaling: Mapping[str, Any] | None) -> torch.Tensor:
    """[D/2] fp32 inverse frequencies, with HF's "linear" and "llama3" rope scaling."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return inv
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv / factor
    # llama3: long wavelengths are divided by factor, short ones kept, the band between smoothed.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """HF rotate_half RoPE; cos/sin computed in fp32 from the positions of this forward."""

    def __init__(self, head_dim: int, theta: float, scaling: Mapping[str, Any] | None) -> None:
        super().__init__()
        self.head_dim = head_dim
        # NOTE: a plain attribute, not a buffer, so model.to(bfloat16) cannot round it.
        self._inv_freq = rope_inv_freq(head_dim, theta, scaling)
        self._by_device: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._by_device:
            self._by_device[device] = self._inv_freq.to(device)
        return self._by_device[device]

    def forward(
        self,
        positions: torch.Tensor,  # [T]
        q: torch.Tensor,  # [T, Hq * D] rotated in place
        k: torch.Tensor,  # [T, Hkv * D] rotated in place
    ) -> None:
        apply_rope_(q, k, positions, self.inv_freq(q.device))


def row_parallel(x: torch.Tensor, proj: nn.Linear, tp: TPGroup, *, reduce: bool = True) -> torch.Tensor:
    """``proj(x)`` for a row-parallel ``proj``: partial sums all-reduced, then the bias once.
    ``reduce=False``: this rank's partial sum (the bias in rank 0's), for a caller whose next norm
    all-reduces (``RMSNorm.forward_add``'s ``tp``)."""
    if tp.size == 1:
        return linear(x, proj.weight, proj.bias)
    if not reduce:
        return linear(x, proj.weight, proj.bias if tp.rank == 0 else None)
    out = tp.all_reduce(linear(x, proj.weight))
    return out if proj.bias is None else out + proj.bias


class LlamaAttention(FusedGemmModule):
    """q/k/v as one GEMM, optional per-head q/k norms (``config.qk_norm``), RoPE, the backend's
    attention (a sliding window where ``config.layer_window`` says), o_proj."""

    _stacked_names = ("qkv_proj",)

    def __init__(
        self,
        config: LlamaConfig,
        layer_id: int,
        *,
        dtype: torch.dtype,
        device: Any,
        in_features: int | None = None,
        qkv_bias: bool | None = None,
        norm_cls: type[nn.Module] | None = None,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        shard, d = tp.heads(config), config.head_dim
        hq, hkv = shard.num_q, shard.num_kv
        in_f = in_features or config.hidden_size
        bias = config.attention_bias if qkv_bias is None else qkv_bias
        kw = dict(dtype=dtype, device=device)
        self.q_proj = nn.Linear(in_f, hq * d, bias=bias, **kw)
        self.k_proj = nn.Linear(in_f, hkv * d, bias=bias, **kw)
        self.v_proj = nn.Linear(in_f, hkv * d, bias=bias, **kw)
        self.o_proj = nn.Linear(hq * d, config.hidden_size, bias=config.attention_out_bias, **kw)
        self.qkv_proj = StackedLinear(self.q_proj, self.k_proj, self.v_proj)
        if config.qk_norm:
            norm_cls = norm_cls or RMSNorm
            self.q_norm = norm_cls(d, config.rms_norm_eps, dtype=dtype, device=device)
            self.k_norm = norm_cls(d, config.rms_norm_eps, dtype=dtype, device=device)
        self.qk_norm = config.qk_norm
        self.q_size, self.kv_size, self.head_dim = hq * d, hkv * d, d
        self.tp = tp
        self.rotary = RotaryEmbedding(d, *config.layer_rope(layer_id))
        self.layer = AttentionLayer(
            layer_id=layer_id, num_heads=hq, num_kv_heads=hkv, head_dim=d, scaling=config.attn_scaling,
            sliding_window=config.layer_window(layer_id),
        )

    def forward(self, positions: torch.Tensor, x: torch.Tensor, batch: ForwardBatch, *,
                reduce: bool = True) -> torch.Tensor:
        """``reduce=False``: this rank's partial sum of the output (``row_parallel``)."""
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 * Hkv) * D]
        # NOTE: slices, not split(): autograd allows the in-place RoPE only on single-output views.
        q = qkv[:, : self.q_size]  # [T, Hq * D]
        k = qkv[:, self.q_size : self.q_size + self.kv_size]  # [T, Hkv * D]
        v = qkv[:, self.q_size + self.kv_size :]  # [T, Hkv * D]
        if self.qk_norm:
            t, d = q.shape[0], self.head_dim
            q = self.q_norm(q.reshape(-1, d)).view(t, -1)  # per head: [T * Hq, D]
            k = self.k_norm(k.reshape(-1, d)).view(t, -1)
        self.rotary(positions, q, k)
        out = batch.attn_backend.forward(q, k, v, self.layer, batch)
        return row_parallel(out, self.o_proj, self.tp, reduce=reduce)


_GATED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": silu_and_mul,
    "gelu_pytorch_tanh": gelu_tanh_and_mul,
}


class LlamaMLP(FusedGemmModule):
    """Gated MLP: down(act(gate(x)) * up(x)), gate and up as one GEMM (SwiGLU, or Gemma's GeGLU)."""

    _stacked_names = ("gate_up_proj",)

    def __init__(self, config: LlamaConfig, *, dtype: torch.dtype, device: Any, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        h, i, b = config.hidden_size, config.intermediate_size // tp.size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=b, dtype=dtype, device=device)
        self.up_proj = nn.Linear(h, i, bias=b, dtype=dtype, device=device)
        self.down_proj = nn.Linear(i, h, bias=b, dtype=dtype, device=device)
        self.gate_up_proj = StackedLinear(self.gate_proj, self.up_proj)
        self.act = _GATED_ACTIVATIONS[config.hidden_act]
        self.tp = tp

    def forward(self, x: torch.Tensor, *, reduce: bool = True) -> torch.Tensor:  # [T, H] -> [T, H]
        """``reduce=False``: this rank's partial sum (``row_parallel``)."""
        gate_up = self.gate_up_proj(x)  # [T, 2I]
        return row_parallel(self.act(gate_up), self.down_proj, self.tp, reduce=reduce)  # [T, I] -> [T, H]


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block on a split residual stream (see the module docstring).

    ``input_norm=False`` gives EAGLE-1's first draft layer (identity input norm).

    With several ``tp`` ranks the MLP output it returns is this rank's partial sum, and so is the
    attention output inside: each norm after them all-reduces together with its residual add and
    norm, in one kernel where the group's all-reduce can (``partial_sums``; the caller's final norm
    takes ``tp`` as well).
    """

    partial_sums = True  # the x it returns (and takes, beside a residual) is a partial sum over tp ranks

    def __init__(
        self, config: LlamaConfig, layer_id: int, *, dtype: torch.dtype, device: Any, input_norm: bool = True,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        eps, h = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = RMSNorm(h, eps, dtype=dtype, device=device) if input_norm else IdentityNorm()
        self.self_attn = LlamaAttention(config, layer_id, dtype=dtype, device=device, tp=tp)
        self.post_attention_layernorm = RMSNorm(h, eps, dtype=dtype, device=device)
        self.mlp = LlamaMLP(config, dtype=dtype, device=device, tp=tp)
        self.tp = tp

    def forward(
        self,
        positions: torch.Tensor,  # [T]
        x: torch.Tensor,  # [T, H] previous layer's MLP output (or the layer input when residual is None)
        residual: torch.Tensor | None,  # [T, H]
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] MLP output, [T, H] residual)
        """The residual stream entering the layer is ``x + residual`` (``x`` when residual is None);
        the one leaving it is the sum of the two returned tensors (``x`` all-reduced first: class
        docstring)."""
        return self.forward_normed(positions, *self.enter(x, residual), batch)

    def enter(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """([T, H] the input norm's output, [T, H] the residual stream entering the layer)."""
        return self.input_layernorm.forward_add(x, residual, self.tp)

    def forward_normed(self, positions: torch.Tensor, h: torch.Tensor, stream: torch.Tensor,
                       batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer after ``enter``: ([T, H] MLP output, [T, H] residual), as ``forward``'s."""
        h = self.self_attn(positions, h, batch, reduce=False)
        h, residual = self.post_attention_layernorm.forward_add(h, stream, self.tp)
        return self.mlp(h, reduce=False), residual
