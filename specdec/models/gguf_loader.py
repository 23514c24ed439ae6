"""llama.cpp GGUF targets: Llama (Mistral converts to it), Qwen2, Qwen3 and Gemma 3 weights,
dequantized to ``dtype``; the embedded tokenizer lives in ``gguf_tokenizer``.

Weights: llama.cpp names map onto HF names (``blk.N.attn_q.weight`` ->
``model.layers.N.self_attn.q_proj.weight`` ...). Per architecture:
* llama: ``convert_hf_to_gguf.py`` permutes the q/k rows of each head from HF's rotate_half order
  into interleaved-pair order; that is undone here, exactly as for llama2.c checkpoints. The other
  architectures use NEOX (rotate_half) RoPE in llama.cpp and are stored unpermuted.
* qwen3 / gemma3: ``attn_q_norm`` / ``attn_k_norm`` are the per-head q/k norms.
* gemma3: ``ffn_norm`` is the pre-feedforward norm, ``post_attention_norm`` / ``post_ffw_norm``
  the sandwich norms, and the converter stores every norm weight as ``1 + w`` (subtracted here).
  llama.cpp fixes what the file does not say: every 6th layer is global, local layers use RoPE
  theta 10000, and scores scale by head_dim ** -0.5 (hidden / heads for the 62-layer 27B).
A file without ``output.weight`` has a tied head.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specdec.models.config import FULL_ATTENTION, SLIDING_ATTENTION, LlamaConfig
from specdec.models.gguf_file import GGUFMeta, dequantize, f32, open_reader
from specdec.models.gguf_tokenizer import GGUFTokenizer, load_gguf_tokenizer
from specdec.models.llama import LlamaForCausalLM
from specdec.models.parallel import SINGLE, TPGroup
from specdec.models.registry import build_target, resolve_gguf
from specdec.models.weights import merged_ids, unpermute_rope

__all__ = ["load_gguf_target", "load_gguf_llama", "read_gguf_num_layers", "read_gguf_config", "gguf_config", "GGUFTokenizer",
           "load_gguf_tokenizer", "SUPPORTED_ARCHITECTURES"]

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")

# llama.cpp per-layer tensor name -> HF name (without the "model.layers.N." prefix)
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GEMMA3_NORM_SHIFT = 1.0
_GEMMA3_PATTERN, _GEMMA3_LOCAL_THETA = 6, 10000.0


def _architecture(meta: GGUFMeta) -> str:
    arch = meta.require("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{meta.path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return arch


def read_gguf_num_layers(path: str | Path) -> int:
    """``{arch}.block_count`` of a GGUF file, without dequantizing any tensor."""
    path = Path(path)
    meta = GGUFMeta(open_reader(path), path)
    return int(meta.require(f"{_architecture(meta)}.block_count"))


def read_gguf_config(path: str | Path) -> LlamaConfig:
    """The config of a GGUF file, without dequantizing any tensor."""
    path = Path(path)
    reader = open_reader(path)
    return gguf_config(GGUFMeta(reader, path), tied="output.weight" not in {t.name for t in reader.tensors})


def _rope_scaling(meta: GGUFMeta, k: Any) -> dict[str, Any] | None:
    scaling_type = meta.get(k("rope.scaling.type"), "none")
    if scaling_type == "linear":
        return {"rope_type": "linear", "factor": f32(meta.require(k("rope.scaling.factor")))}
    if scaling_type not in ("none", None):
        raise ValueError(f"{meta.path}: {k('rope.scaling.type')}={scaling_type!r} is not supported (none / linear)")
    return None


def _gemma3_fields(meta: GGUFMeta, k: Any, layers: int, hidden: int, heads: int, head_dim: int) -> dict[str, Any]:
    pattern = meta.get(k("attention.sliding_window_pattern"), _GEMMA3_PATTERN)
    if isinstance(pattern, (list, tuple)):  # one bool per layer: True = sliding
        types = tuple(SLIDING_ATTENTION if p else FULL_ATTENTION for p in pattern)
    else:
        types = tuple(SLIDING_ATTENTION if (i + 1) % int(pattern) else FULL_ATTENTION for i in range(layers))
    return dict(
        model_type="gemma3_text", hidden_act="gelu_pytorch_tanh", qk_norm=True,
        sliding_window=int(meta.require(k("attention.sliding_window"))), layer_types=types,
        rope_local_theta=_GEMMA3_LOCAL_THETA,
        query_pre_attn_scalar=float(hidden // heads if layers == 62 else head_dim),
    )


def gguf_config(meta: GGUFMeta, *, tied: bool) -> LlamaConfig:
    arch = _architecture(meta)
    k = lambda name: f"{arch}.{name}"  # noqa: E731
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.get(k("vocab_size"))
    if vocab is None:
        if tokens is None:
            raise ValueError(f"{meta.path}: GGUF metadata key 'tokenizer.ggml.tokens' (or {k('vocab_size')!r}) is missing")
        vocab = len(tokens)
    hidden = int(meta.require(k("embedding_length")))
    n_heads = int(meta.require(k("attention.head_count")))
    layers = int(meta.require(k("block_count")))
    head_dim = int(meta.get(k("attention.key_length"), hidden // n_heads))
    rope_dim = meta.get(k("rope.dimension_count"))
    if rope_dim is not None and int(rope_dim) != head_dim:
        raise ValueError(f"{meta.path}: {k('rope.dimension_count')}={rope_dim} != head_dim={head_dim} (partial RoPE unsupported)")
    extra: dict[str, Any] = {"model_type": "llama"}
    if arch == "qwen2":
        extra = {"model_type": "qwen2", "attention_bias": True}
    elif arch == "qwen3":
        extra = {"model_type": "qwen3", "qk_norm": True}
    elif arch == "gemma3":
        extra = _gemma3_fields(meta, k, layers, hidden, n_heads, head_dim)
    return LlamaConfig(**{
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(meta.require(k("feed_forward_length"))),
        "num_hidden_layers": layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(meta.get(k("attention.head_count_kv"), n_heads)),
        "head_dim": head_dim,
        "rms_norm_eps": f32(meta.require(k("attention.layer_norm_rms_epsilon"))),
        "rope_theta": f32(meta.get(k("rope.freq_base"), 10000.0)),
        "rope_scaling": _rope_scaling(meta, k),
        "tie_word_embeddings": tied,
        "max_position_embeddings": int(meta.get(k("context_length"), 2048)),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        # llama.cpp ends a generation at the end of turn too
        "eos_token_id": merged_ids(meta.get("tokenizer.ggml.eos_token_id"), meta.get("tokenizer.ggml.eot_token_id")),
        **extra,
    })


def _hf_name(name: str, layer_names: dict[str, str]) -> str | None:
    """llama.cpp tensor name -> HF name (None when it has no counterpart)."""
    base, _, suffix = name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{suffix}"
    return None


def _gguf_state(reader: Any, path: Path, arch: str, config: LlamaConfig) -> dict[str, torch.Tensor]:
    layer_names = _GEMMA3_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
    state: dict[str, torch.Tensor] = {}
    unknown = []
    for tensor in reader.tensors:
        hf = _hf_name(tensor.name, layer_names)
        if hf is None:
            unknown.append(tensor.name)
            continue
        w = dequantize(tensor)
        if arch == "llama" and tensor.name.endswith("attn_q.weight"):
            w = unpermute_rope(w, config.num_attention_heads)
        elif arch == "llama" and tensor.name.endswith("attn_k.weight"):
            w = unpermute_rope(w, config.num_key_value_heads)
        elif arch == "gemma3" and tensor.name.endswith("norm.weight"):
            w = w - _GEMMA3_NORM_SHIFT
        state[hf] = w.contiguous()
    if unknown:
        raise ValueError(f"{path}: GGUF tensors with no {arch} counterpart: {unknown[:8]}")
    return state


def load_gguf_target(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: Any = "cpu",
    aux_hidden_layers: tuple[int, ...] | None = None,
    tp: TPGroup = SINGLE,
) -> LlamaForCausalLM:
    """A GGUF file of a supported architecture as a target (weights dequantized, then cast to ``dtype``)."""
    path = Path(path)
    reader = open_reader(path)
    meta = GGUFMeta(reader, path)
    arch = _architecture(meta)
    resolve_gguf(arch)
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError(f"{path}: rope_freqs.weight (Llama 3.1-style RoPE scaling in GGUF) is not supported")
    config = gguf_config(meta, tied="output.weight" not in names)
    state = _gguf_state(reader, path, arch, config)
    return build_target(config, state, what=f"GGUF {path}", dtype=dtype, device=device,
                        aux_hidden_layers=aux_hidden_layers, tp=tp)


load_gguf_llama = load_gguf_target  # the name before the registry
