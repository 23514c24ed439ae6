"""KV cache element types: ``auto`` (the model's dtype) or FP8 (``fp8_e4m3``), and the one cast into them.

An FP8 cache stores e4m3 values at scale 1 (no per-tensor scale): a value past the format's largest
finite one (448) saturates to it, the rest round to nearest even (subnormals kept). Every writer casts
through ``cast_kv`` (or, on a GPU, the store kernel's same in-register cast); readers widen a tile
without rounding (triton: to fp16 under a 16-bit query, to fp32 under an fp32 one; torch_native: to
fp32) and multiply there, so only the stored values are rounded.
Measured cost of an FP8 draft KV cache for the SmolLM2 EAGLE-3 head on MT-bench: -0.3 % acceptance
length (benchmarks/results/2026-11-27-cpu-draft-kv-fp8-acceptance).
"""

from __future__ import annotations

import torch

# flag value -> cache dtype (None: the model's own); the flag's values are specdec.config.DRAFT_KV_CACHE_DTYPES
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {"auto": None, "fp8_e4m3": torch.float8_e4m3fn}


def resolve_kv_dtype(name: str, model_dtype: torch.dtype, *, flag: str) -> torch.dtype:
    """The cache dtype a flag value names (``auto``: ``model_dtype``); the error names ``flag``."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"{flag}={name!r}: choose one of {list(KV_CACHE_DTYPES)}")
    return KV_CACHE_DTYPES[name] or model_dtype


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype.itemsize == 1 and dtype.is_floating_point


def cast_kv(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as the cache stores it: saturating into an FP8 format, a plain cast otherwise (the clamp
    states the saturation the store kernel applies, rather than leaving it to the cast)."""
    if is_fp8(dtype) and x.dtype != dtype:
        limit = torch.finfo(dtype).max
        return x.float().clamp(-limit, limit).to(dtype)
    return x.to(dtype)
