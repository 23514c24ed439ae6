"""``LlamaConfig``: shape and numerics of every target architecture (Llama, Mistral, Qwen2, Qwen3,
Gemma 3), in HF ``config.json`` names; which architecture parses which config lives in
``specdec.models.registry``.

Per-layer variation is answered here, once, for the model to build from: ``layer_window(i)``
(sliding-window width or None), ``layer_rope(i)`` (theta and scaling; Gemma 3's local layers use
their own theta) and ``attn_scaling`` (Gemma 3: ``query_pre_attn_scalar ** -0.5``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

__all__ = ["LlamaConfig", "KVLayout", "default_eagle3_layers", "normalize_rope_scaling",
           "hf_llama_fields", "hf_rope", "FULL_ATTENTION", "SLIDING_ATTENTION", "ACTIVATIONS"]

FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
_ROPE_KEYS = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                 "original_max_position_embeddings")}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Shape and numerics of a decoder-only target (HF ``config.json`` names)."""

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
    # which registry entry builds the model: llama, mistral, qwen2, qwen3, gemma3_text
    model_type: str = "llama"
    hidden_act: str = "silu"  # silu (SwiGLU) or gelu_pytorch_tanh (Gemma's GeGLU)
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3)
    sliding_window: int | None = None  # tokens a sliding layer sees, itself included
    # per layer: "full_attention" | "sliding_attention"; None -> all sliding when sliding_window
    # is set (Mistral), else all full
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None  # Gemma 3: theta of sliding layers (no scaling there)
    query_pre_attn_scalar: float | None = None  # Gemma 3: scores scale by this ** -0.5

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
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"LlamaConfig.hidden_act={self.hidden_act!r} is not supported ({', '.join(ACTIVATIONS)})")
        set_("rope_scaling", normalize_rope_scaling(self.rope_scaling))
        if isinstance(self.eos_token_id, (list, tuple)):
            set_("eos_token_id", tuple(int(i) for i in self.eos_token_id))
        self._check_window()

    def _check_window(self) -> None:
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window < 1):
            raise ValueError(f"LlamaConfig.sliding_window={self.sliding_window!r} must be a positive int or None")
        if self.layer_types is None:
            return
        types = tuple(str(t) for t in self.layer_types)
        object.__setattr__(self, "layer_types", types)
        if len(types) != self.num_hidden_layers:
            raise ValueError(f"LlamaConfig.layer_types has {len(types)} entries for {self.num_hidden_layers} layers")
        bad = sorted(set(types) - {FULL_ATTENTION, SLIDING_ATTENTION})
        if bad:
            raise ValueError(f"LlamaConfig.layer_types: unsupported layer type(s) {bad}")
        if SLIDING_ATTENTION in types and self.sliding_window is None:
            raise ValueError("LlamaConfig: layer_types names sliding_attention layers but sliding_window is None")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        return () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)

    def is_sliding(self, layer_id: int) -> bool:
        if self.layer_types is None:
            return self.sliding_window is not None
        return self.layer_types[layer_id] == SLIDING_ATTENTION

    def layer_window(self, layer_id: int) -> int | None:
        """Keys a query of layer ``layer_id`` sees (itself included), or None for full attention."""
        return self.sliding_window if self.is_sliding(layer_id) else None

    @property
    def has_sliding_layers(self) -> bool:
        return any(self.is_sliding(i) for i in range(self.num_hidden_layers))

    def layer_rope(self, layer_id: int) -> tuple[float, dict[str, Any] | None]:
        """(theta, scaling) of layer ``layer_id``'s RoPE."""
        if self.rope_local_theta is not None and self.is_sliding(layer_id):
            return self.rope_local_theta, None
        return self.rope_theta, self.rope_scaling

    @property
    def attn_scaling(self) -> float:
        return (self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim) ** -0.5

    @classmethod
    def from_hf(cls, d: Mapping[str, Any]) -> "LlamaConfig":
        """Build from a Llama-family HF ``config.json`` dict (Llama, EAGLE heads); other
        architectures go through ``specdec.models.registry.config_from_hf``."""
        return cls(**hf_llama_fields(d))

    def to_hf(self) -> dict[str, Any]:
        """HF ``config.json`` keys (inverse of ``from_hf``)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["attention_bias"] = self.attention_bias
        if self.model_type == "llama" and self.attention_bias and not self.attention_out_bias:
            out["model_type"] = "qwen2"
        del out["attention_out_bias"]
        for key in ("eos_token_id", "layer_types"):
            if isinstance(out[key], tuple):
                out[key] = list(out[key])
        if self.model_type == "gemma3_text":
            out["hidden_activation"] = out.pop("hidden_act")
            out["rope_local_base_freq"] = out.pop("rope_local_theta")
        return out


_REQUIRED_HF_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def hf_rope(d: Mapping[str, Any]) -> tuple[float, Any]:
    """(rope_theta, rope_scaling) of a config.json; transformers >= 5 keeps both in rope_parameters."""
    rope_theta, rope_scaling = d.get("rope_theta", 10000.0), d.get("rope_scaling")
    params = d.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_theta" in params:
        rope_theta = params.get("rope_theta", rope_theta)
        if rope_scaling is None and params.get("rope_type", params.get("type", "default")) != "default":
            rope_scaling = dict(params)
    return float(rope_theta), rope_scaling


def hf_llama_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    """``LlamaConfig`` keyword arguments from a Llama-family HF ``config.json`` dict."""
    missing = [k for k in _REQUIRED_HF_KEYS if d.get(k) is None]
    if missing:
        raise ValueError(f"config.json: missing required key(s) {', '.join(missing)}")
    act = d.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"config.json: hidden_act={act!r} is not supported (only silu)")
    rope_theta, rope_scaling = hf_rope(d)
    qwen2 = d.get("model_type") == "qwen2"
    attn_bias = bool(d.get("attention_bias", False))
    return dict(
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=d["num_attention_heads"],
        num_key_value_heads=d.get("num_key_value_heads"),
        head_dim=d.get("head_dim"),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        attention_bias=attn_bias or qwen2,
        attention_out_bias=attn_bias and not qwen2,
        mlp_bias=bool(d.get("mlp_bias", False)),
        max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=d.get("eos_token_id"),
    )


def normalize_rope_scaling(scaling: Mapping[str, Any] | None) -> dict[str, Any] | None:
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
    """What a KV cache for a model must hold: one K and one V buffer per attention layer (this
    rank's KV heads under tensor parallelism)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


def default_eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """SGLang's default EAGLE-3 capture layers [2, L//2, L-3], clamped into [0, L-1] for tiny L."""
    if num_layers < 1:
        raise ValueError(f"num_layers={num_layers} must be >= 1")
    clamp = lambda i: min(max(i, 0), num_layers - 1)  # noqa: E731
    return (clamp(2), clamp(num_layers // 2), clamp(num_layers - 3))
