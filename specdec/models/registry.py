"""The architecture registry: config.json's ``architectures`` (or a GGUF file's
``general.architecture``) -> how to read the config and which model class to build.

    architecture            model class          what the config parser adds to Llama's
    LlamaForCausalLM        LlamaForCausalLM     -
    MistralForCausalLM      LlamaForCausalLM     sliding_window on every layer (when set)
    Qwen2ForCausalLM        LlamaForCausalLM     q/k/v bias; sliding layers from max_window_layers
    Qwen3ForCausalLM        LlamaForCausalLM     per-head q/k RMSNorm
    Gemma3ForCausalLM       Gemma3ForCausalLM    see specdec.models.gemma3

A config without ``architectures`` falls back on its ``model_type``. Anything else raises a
``ValueError`` that lists what is supported.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

from specdec.models.config import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    LlamaConfig,
    hf_llama_fields,
    hf_rope,
)
from specdec.models.gemma3 import Gemma3ForCausalLM
from specdec.models.llama import LlamaForCausalLM
from specdec.models.parallel import TPGroup, shard_state_dict
from specdec.models.weights import assign_weights, random_state

__all__ = ["Architecture", "ARCHITECTURES", "resolve", "resolve_gguf", "config_from_hf", "model_class", "build_target"]


@dataclasses.dataclass(frozen=True)
class Architecture:
    name: str  # HF ``architectures[0]``
    model_type: str  # HF ``model_type`` (and LlamaConfig.model_type)
    parse: Callable[[Mapping[str, Any]], LlamaConfig]
    model_cls: type[LlamaForCausalLM]
    gguf_arch: str | None  # llama.cpp's ``general.architecture`` for it


def _llama(d: Mapping[str, Any]) -> LlamaConfig:
    return LlamaConfig(**hf_llama_fields(d))


def _mistral(d: Mapping[str, Any]) -> LlamaConfig:
    return LlamaConfig(**{**hf_llama_fields(d), "model_type": "mistral", "sliding_window": d.get("sliding_window")})


def _qwen_window(d: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen2/3: sliding windows only with use_sliding_window, on layers >= max_window_layers."""
    if not d.get("use_sliding_window") or d.get("sliding_window") is None:
        return {}
    n = int(d["num_hidden_layers"])
    types = d.get("layer_types") or [
        SLIDING_ATTENTION if i >= int(d.get("max_window_layers", n)) else FULL_ATTENTION for i in range(n)
    ]
    return {"sliding_window": int(d["sliding_window"]), "layer_types": tuple(types)}


def _qwen2(d: Mapping[str, Any]) -> LlamaConfig:
    return LlamaConfig(**{**hf_llama_fields(d), "model_type": "qwen2", "attention_bias": True,
                          "attention_out_bias": False, **_qwen_window(d)})


def _qwen3(d: Mapping[str, Any]) -> LlamaConfig:
    return LlamaConfig(**{**hf_llama_fields(d), "model_type": "qwen3", "qk_norm": True, **_qwen_window(d)})


def _gemma3_layer_types(d: Mapping[str, Any]) -> tuple[str, ...]:
    if d.get("layer_types"):
        return tuple(d["layer_types"])
    pattern = int(d.get("sliding_window_pattern", d.get("_sliding_window_pattern", 6)))
    # every pattern-th layer is global (transformers' rule for configs before layer_types)
    return tuple(SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(int(d["num_hidden_layers"])))


def _gemma3_rope(d: Mapping[str, Any]) -> tuple[float, Any, float]:
    """(global theta, global scaling, local theta); transformers >= 5 nests them per layer type."""
    params = d.get("rope_parameters")
    if isinstance(params, Mapping) and FULL_ATTENTION in params:
        full, local = params[FULL_ATTENTION], params.get(SLIDING_ATTENTION, {})
        scaling = dict(full) if full.get("rope_type", "default") != "default" else None
        return float(full.get("rope_theta", 1e6)), scaling, float(local.get("rope_theta", 1e4))
    theta, scaling = hf_rope({**d, "rope_theta": d.get("rope_theta", 1e6)})
    return theta, scaling, float(d.get("rope_local_base_freq", 1e4))


def _gemma3(d: Mapping[str, Any]) -> LlamaConfig:
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if d.get(key) is not None:
            raise ValueError(f"config.json: Gemma 3 with {key}={d[key]} is not supported (only None)")
    act = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
    theta, scaling, local_theta = _gemma3_rope(d)
    fields = hf_llama_fields({**d, "hidden_act": "silu", "rope_theta": theta, "rope_scaling": None,
                              "rope_parameters": None})
    return LlamaConfig(**{
        **fields, "model_type": "gemma3_text", "hidden_act": act, "qk_norm": True,
        "rope_scaling": scaling, "rope_local_theta": local_theta,
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", True)),
        "head_dim": int(d.get("head_dim", 256)), "rms_norm_eps": float(d.get("rms_norm_eps", 1e-6)),
        "query_pre_attn_scalar": float(d.get("query_pre_attn_scalar", 256)),
        "sliding_window": int(d.get("sliding_window", 4096)), "layer_types": _gemma3_layer_types(d),
        "bos_token_id": d.get("bos_token_id", 2), "eos_token_id": d.get("eos_token_id", 1),
    })


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("LlamaForCausalLM", "llama", _llama, LlamaForCausalLM, "llama"),
    Architecture("MistralForCausalLM", "mistral", _mistral, LlamaForCausalLM, "llama"),
    Architecture("Qwen2ForCausalLM", "qwen2", _qwen2, LlamaForCausalLM, "qwen2"),
    Architecture("Qwen3ForCausalLM", "qwen3", _qwen3, LlamaForCausalLM, "qwen3"),
    Architecture("Gemma3ForCausalLM", "gemma3_text", _gemma3, Gemma3ForCausalLM, "gemma3"),
)}
_BY_MODEL_TYPE = {a.model_type: a for a in ARCHITECTURES.values()}
_BY_GGUF = {"llama": ARCHITECTURES["LlamaForCausalLM"], "qwen2": ARCHITECTURES["Qwen2ForCausalLM"],
            "qwen3": ARCHITECTURES["Qwen3ForCausalLM"], "gemma3": ARCHITECTURES["Gemma3ForCausalLM"]}


def resolve(d: Mapping[str, Any]) -> Architecture:
    """The registry entry for an HF ``config.json`` dict."""
    archs = d.get("architectures") or []
    for name in archs:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    if not archs and d.get("model_type", "llama") in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[d.get("model_type", "llama")]
    raise ValueError(
        f"config.json: architectures={archs!r} (model_type={d.get('model_type')!r}) is not supported; "
        f"supported: {', '.join(ARCHITECTURES)}"
    )


def resolve_gguf(arch: str) -> Architecture:
    if arch not in _BY_GGUF:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(_BY_GGUF)})")
    return _BY_GGUF[arch]


def config_from_hf(d: Mapping[str, Any]) -> LlamaConfig:
    return resolve(d).parse(d)


def model_class(config: LlamaConfig) -> type[LlamaForCausalLM]:
    """The class that builds a model of ``config`` (by its model_type)."""
    if config.model_type not in _BY_MODEL_TYPE:
        raise ValueError(f"model_type={config.model_type!r} is not supported; supported: {', '.join(_BY_MODEL_TYPE)}")
    return _BY_MODEL_TYPE[config.model_type].model_cls


def build_target(
    config: LlamaConfig, state: dict[str, torch.Tensor] | None, *, what: str, dtype: torch.dtype, device: Any,
    aux_hidden_layers: tuple[int, ...] | None, tp: TPGroup, seed: int = 0,
) -> LlamaForCausalLM:
    """The registry's model class for ``config`` with ``state`` (a full checkpoint) sliced for ``tp``;
    ``state=None``: random weights of rank ``tp.rank``'s shapes (``--load-format dummy``, drawn from ``seed``)."""
    with torch.device("meta"):
        model = model_class(config)(config, aux_hidden_layers=aux_hidden_layers, dtype=dtype, device="meta", tp=tp)
    if state is None:
        state = random_state(model, seed=seed + tp.rank, dtype=dtype, device=device)
    else:
        if config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        state = shard_state_dict(state, config, tp)
    assign_weights(model, state, what=what, dtype=dtype, device=device)
    return model.eval()
