"""Llama-family target model (Llama 2/3, Qwen2-style qkv bias) running one ForwardBatch.

Glossary: T = num_tokens of the forward, H = hidden_size, D = head_dim, Hq / Hkv = query / KV
heads, L = num_hidden_layers, I = intermediate_size. Attention goes through ``batch.attn_backend``
(which also writes the KV cache); norms, RoPE and SiLU-and-mul are the fused ops of
``specdec.models.ops`` (Triton on CUDA, the torch reference on CPU). Parameter names equal Hugging
Face's (``model.layers.{i}.self_attn.q_proj.weight``, ...), so a checkpoint loads with
``load_state_dict``; q/k/v and gate/up nevertheless run as one GEMM each (``StackedLinear``).

One decoder layer, as kernels (residual = the residual stream, carried next to each layer's output
so that every residual add happens inside the following norm):

    x, residual = add_rms_norm(x, residual)       input_layernorm (layer 0: rms_norm, residual = x)
    qkv = x @ [Wq | Wk | Wv]^T                     one GEMM, q/k/v are column slices
    apply_rope_(q, k)                              in place
    attn = attention(q, k, v)                      the backend: KV-cache write + attention
    x = attn @ Wo^T
    x, residual = add_rms_norm(x, residual)       post_attention_layernorm
    x = silu_and_mul(x @ [Wgate | Wup]^T) @ Wdown^T

Every linear layer (the lm_head too) goes through ``ops.gemv.linear``: on a GPU, for a few tokens
(decode, small verify forwards), a Triton skinny GEMM where it beats cuBLAS.

What the target hands a draft head (``LogitsOutput.hidden_states``, per ``capture_hidden_mode``):
* EAGLE-1/2 (``aux_hidden_layers=None``): the final normed hidden state, the lm_head input [*, H];
* EAGLE-3: the residual stream entering each listed layer, concatenated in the listed order
  [*, len(aux_hidden_layers) * H]. Index ``i`` means "the input of layer i"; ``i == L`` means the
  output of the last layer before the final norm (SGLang's ``eagle_aux_hidden_state_layer_ids``
  name layer *outputs*, so checkpoint id ``j`` becomes index ``j + 1`` here).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import torch
from torch import nn

from specdec.attention.base import AttentionLayer
from specdec.forward import CaptureHiddenMode, ForwardBatch, LogitsMode, LogitsOutput
from specdec.models.ops import add_rms_norm, apply_rope_, rms_norm, silu_and_mul
from specdec.models.ops.gemv import linear
from specdec.models.ops.stacked_linear import FusedGemmModule, StackedLinear

__all__ = [
    "LlamaConfig",
    "LlamaForCausalLM",
    "KVLayout",
    "default_eagle3_layers",
    "RMSNorm",
    "IdentityNorm",
    "RotaryEmbedding",
    "LlamaAttention",
    "LlamaMLP",
    "LlamaDecoderLayer",
    "select_output",
]


_REQUIRED_HF_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_ROPE_KEYS = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                 "original_max_position_embeddings")}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Shape and numerics of a Llama-family model (HF ``config.json`` names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None  # None -> num_attention_heads (no GQA)
    head_dim: int | None = None  # None -> hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # None, or {"rope_type": "linear" | "llama3", "factor": ..., ...} as in HF
    rope_scaling: dict[str, Any] | None = dataclasses.field(default=None, hash=False)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v (Qwen2 style)
    attention_out_bias: bool = False  # bias on o_proj (HF Llama's attention_bias=True sets both)
    mlp_bias: bool = False
    max_position_embeddings: int = 2048
    bos_token_id: int | None = 1
    eos_token_id: int | tuple[int, ...] | None = 2

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        if self.num_key_value_heads is None:
            set_("num_key_value_heads", self.num_attention_heads)
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"LlamaConfig.{name}={value!r} must be a positive int")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"LlamaConfig: hidden_size={self.hidden_size} is not a multiple of "
                    f"num_attention_heads={self.num_attention_heads}; give head_dim explicitly"
                )
            set_("head_dim", self.hidden_size // self.num_attention_heads)
        if self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"LlamaConfig: num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError(
                f"LlamaConfig: rms_norm_eps={self.rms_norm_eps} and rope_theta={self.rope_theta} must be > 0"
            )
        set_("rope_scaling", _normalize_rope_scaling(self.rope_scaling))
        if isinstance(self.eos_token_id, (list, tuple)):
            set_("eos_token_id", tuple(int(i) for i in self.eos_token_id))

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        return () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)

    @classmethod
    def from_hf(cls, d: Mapping[str, Any]) -> "LlamaConfig":
        """Build from an HF ``config.json`` dict (Llama, Mistral-without-sliding-window, Qwen2)."""
        missing = [k for k in _REQUIRED_HF_KEYS if d.get(k) is None]
        if missing:
            raise ValueError(f"config.json: missing required key(s) {', '.join(missing)} for a Llama-family model")
        act = d.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"config.json: hidden_act={act!r} is not supported (only silu)")
        rope_theta, rope_scaling = d.get("rope_theta", 10000.0), d.get("rope_scaling")
        params = d.get("rope_parameters")  # transformers >= 5 keeps theta and scaling together
        if isinstance(params, Mapping):
            rope_theta = params.get("rope_theta", rope_theta)
            if rope_scaling is None and params.get("rope_type", params.get("type", "default")) != "default":
                rope_scaling = dict(params)
        qwen2 = d.get("model_type") == "qwen2"
        attn_bias = bool(d.get("attention_bias", False))
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=d["num_attention_heads"],
            num_key_value_heads=d.get("num_key_value_heads"),
            head_dim=d.get("head_dim"),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=attn_bias or qwen2,
            attention_out_bias=attn_bias and not qwen2,
            mlp_bias=bool(d.get("mlp_bias", False)),
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
        )

    def to_hf(self) -> dict[str, Any]:
        """HF ``config.json`` keys (inverse of ``from_hf`` for Llama-style configs)."""
        out: dict[str, Any] = {
            "model_type": "llama",
            "hidden_act": "silu",
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
        }
        out["attention_bias"] = self.attention_bias
        if self.attention_bias and not self.attention_out_bias:
            out["model_type"] = "qwen2"
        del out["attention_out_bias"]
        if isinstance(out["eos_token_id"], tuple):
            out["eos_token_id"] = list(out["eos_token_id"])
        return out


def _normalize_rope_scaling(scaling: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if scaling is None:
        return None
    s = dict(scaling)
    kind = s.get("rope_type", s.get("type", "default"))
    s["rope_type"] = kind
    if kind == "default":
        return None
    if kind not in _ROPE_KEYS:
        raise ValueError(f"rope_scaling: rope_type={kind!r} is not supported (default, linear, llama3)")
    missing = [k for k in _ROPE_KEYS[kind] if s.get(k) is None]
    if missing:
        raise ValueError(f"rope_scaling ({kind}): missing key(s) {', '.join(missing)}")
    return s


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """What a KV cache for a model must hold: one K and one V buffer per attention layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def default_eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """SGLang's default EAGLE-3 capture layers [2, L//2, L-3], clamped into [0, L-1] for tiny L."""
    if num_layers < 1:
        raise ValueError(f"num_layers={num_layers} must be >= 1")
    clamp = lambda i: min(max(i, 0), num_layers - 1)  # noqa: E731
    return (clamp(2), clamp(num_layers // 2), clamp(num_layers - 3))


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
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] normed, [T, H] residual stream)
        """``(norm(x + residual), x + residual)`` in one kernel; ``(norm(x), x)`` when residual is None."""
        if residual is None:
            return self(x), x
        return add_rms_norm(x, residual, self.weight, self.eps)


class IdentityNorm(nn.Module):
    """No norm (EAGLE-1's first draft layer; no weight in the checkpoint), with RMSNorm's interface."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward_add(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stream = x if residual is None else x + residual
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


class LlamaAttention(FusedGemmModule):
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
    ) -> None:
        super().__init__()
        hq, hkv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        in_f = in_features or config.hidden_size
        bias = config.attention_bias if qkv_bias is None else qkv_bias
        kw = dict(dtype=dtype, device=device)
        self.q_proj = nn.Linear(in_f, hq * d, bias=bias, **kw)
        self.k_proj = nn.Linear(in_f, hkv * d, bias=bias, **kw)
        self.v_proj = nn.Linear(in_f, hkv * d, bias=bias, **kw)
        self.o_proj = nn.Linear(hq * d, config.hidden_size, bias=config.attention_out_bias, **kw)
        self.qkv_proj = StackedLinear(self.q_proj, self.k_proj, self.v_proj)
        self.q_size, self.kv_size = hq * d, hkv * d
        self.rotary = RotaryEmbedding(d, config.rope_theta, config.rope_scaling)
        self.layer = AttentionLayer(
            layer_id=layer_id, num_heads=hq, num_kv_heads=hkv, head_dim=d, scaling=d**-0.5
        )

    def forward(self, positions: torch.Tensor, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 * Hkv) * D]
        # NOTE: slices, not split(): autograd allows the in-place RoPE only on single-output views.
        q = qkv[:, : self.q_size]  # [T, Hq * D]
        k = qkv[:, self.q_size : self.q_size + self.kv_size]  # [T, Hkv * D]
        v = qkv[:, self.q_size + self.kv_size :]  # [T, Hkv * D]
        self.rotary(positions, q, k)
        out = batch.attn_backend.forward(q, k, v, self.layer, batch)
        return linear(out, self.o_proj.weight, self.o_proj.bias)


class LlamaMLP(FusedGemmModule):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one GEMM."""

    _stacked_names = ("gate_up_proj",)

    def __init__(self, config: LlamaConfig, *, dtype: torch.dtype, device: Any) -> None:
        super().__init__()
        h, i, b = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=b, dtype=dtype, device=device)
        self.up_proj = nn.Linear(h, i, bias=b, dtype=dtype, device=device)
        self.down_proj = nn.Linear(i, h, bias=b, dtype=dtype, device=device)
        self.gate_up_proj = StackedLinear(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        gate_up = self.gate_up_proj(x)  # [T, 2I]
        return linear(silu_and_mul(gate_up), self.down_proj.weight, self.down_proj.bias)  # [T, I] -> [T, H]


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block on a split residual stream (see the module docstring).

    ``input_norm=False`` gives EAGLE-1's first draft layer (identity input norm).
    """

    def __init__(
        self, config: LlamaConfig, layer_id: int, *, dtype: torch.dtype, device: Any, input_norm: bool = True
    ) -> None:
        super().__init__()
        eps, h = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = RMSNorm(h, eps, dtype=dtype, device=device) if input_norm else IdentityNorm()
        self.self_attn = LlamaAttention(config, layer_id, dtype=dtype, device=device)
        self.post_attention_layernorm = RMSNorm(h, eps, dtype=dtype, device=device)
        self.mlp = LlamaMLP(config, dtype=dtype, device=device)

    def forward(
        self,
        positions: torch.Tensor,  # [T]
        x: torch.Tensor,  # [T, H] previous layer's MLP output (or the layer input when residual is None)
        residual: torch.Tensor | None,  # [T, H]
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] MLP output, [T, H] residual)
        """The residual stream entering the layer is ``x + residual`` (``x`` when residual is None);
        the one leaving it is the sum of the two returned tensors."""
        h, residual = self.input_layernorm.forward_add(x, residual)
        h = self.self_attn(positions, h, batch)
        h, residual = self.post_attention_layernorm.forward_add(h, residual)
        return self.mlp(h), residual


def last_token_rows(batch: ForwardBatch, device: torch.device) -> torch.Tensor:
    """[bs] packed row of each request's last new token (requests are extend_lens segments)."""
    if batch.output_rows is not None:
        return batch.output_rows
    lens = batch.extend_lens.to(device=device, dtype=torch.int64)
    return torch.cumsum(lens, 0) - 1


def select_output(
    x: torch.Tensor,  # [T, F]
    batch: ForwardBatch,
    *,
    last: bool,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:  # [bs, F] when last, else [T, F]
    if not last:
        return x
    return x[rows if rows is not None else last_token_rows(batch, x.device)]


def logits_and_hidden(
    logits_input: torch.Tensor,  # [T, H] what the lm_head reads
    hidden: torch.Tensor | None,  # [T, F] what a draft head conditions on
    lm_head_weight: torch.Tensor,  # [vocab, H]
    batch: ForwardBatch,
) -> LogitsOutput:
    """Apply logits_mode / capture_hidden_mode; logits are returned in fp32."""
    needs_last = batch.logits_mode == LogitsMode.LAST or batch.capture_hidden_mode == CaptureHiddenMode.LAST
    rows = last_token_rows(batch, logits_input.device) if needs_last else None
    x = select_output(logits_input, batch, last=batch.logits_mode == LogitsMode.LAST, rows=rows)
    logits = linear(x, lm_head_weight).float()
    captured = None
    if batch.capture_hidden_mode != CaptureHiddenMode.NULL and hidden is not None:
        captured = select_output(hidden, batch, last=batch.capture_hidden_mode == CaptureHiddenMode.LAST, rows=rows)
    return LogitsOutput(next_token_logits=logits, hidden_states=captured)


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig, *, dtype: torch.dtype, device: Any) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, dtype=dtype, device=device) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        config: LlamaConfig,
        *,
        aux_hidden_layers: tuple[int, ...] | list[int] | None = None,
        dtype: torch.dtype = torch.float32,
        device: Any = "cpu",
    ) -> None:
        super().__init__()
        self.config = config
        if aux_hidden_layers is not None:
            aux_hidden_layers = tuple(int(i) for i in aux_hidden_layers)
            bad = [i for i in aux_hidden_layers if not 0 <= i <= config.num_hidden_layers]
            if not aux_hidden_layers or bad:
                raise ValueError(
                    f"aux_hidden_layers={aux_hidden_layers}: need one or more layer indices in "
                    f"[0, {config.num_hidden_layers}] (num_hidden_layers={config.num_hidden_layers})"
                )
        # layer indices whose input is captured for EAGLE-3, or None (capture the final normed state)
        self.aux_hidden_layers: tuple[int, ...] | None = aux_hidden_layers
        self.model = LlamaModel(config, dtype=dtype, device=device)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, dtype=dtype, device=device)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.embed_tokens

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [vocab, H]
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    @property
    def hidden_feature_size(self) -> int:
        """Features per token of the captured hidden state (what a draft head's fc reads)."""
        n = 1 if self.aux_hidden_layers is None else len(self.aux_hidden_layers)
        return n * self.config.hidden_size

    @property
    def kv_layout(self) -> KVLayout:
        c = self.config
        return KVLayout(c.num_hidden_layers, c.num_key_value_heads, c.head_dim)

    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        x = self.model.embed_tokens(batch.input_ids)  # [T, H]
        residual: torch.Tensor | None = None  # the stream is x + residual (see the module docstring)
        capture = batch.capture_hidden_mode != CaptureHiddenMode.NULL and self.aux_hidden_layers is not None
        # residual stream entering each layer, kept only for the captured ones (index L = last output)
        streams: dict[int, torch.Tensor] = {}
        layers = self.model.layers if batch.num_tokens > 0 else []  # NOTE: no attention call when idle
        for i, layer in enumerate(layers):
            if capture and i in self.aux_hidden_layers:
                streams[i] = x if residual is None else x + residual
            x, residual = layer(batch.positions, x, residual, batch)
        normed, h = self.model.norm.forward_add(x, residual)  # h: the stream leaving the last layer
        if self.aux_hidden_layers is None:
            hidden = normed
        elif capture:
            hidden = torch.cat([streams.get(i, h) for i in self.aux_hidden_layers], dim=-1)  # [T, len * H]
        else:
            hidden = None
        return logits_and_hidden(normed, hidden, self.lm_head_weight, batch)
