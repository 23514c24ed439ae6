"""Pluggable attention: the backend ABC, the KV cache, and a registry of backends by name.

Optional libraries (triton, flashinfer, flash-attn) are imported only when their backend is chosen.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Callable

from specdec.attention.base import AttentionBackend, AttentionLayer
from specdec.attention.kv_cache import KVCache

# name -> (module, class, optional package the backend needs)
_REGISTRY: dict[str, tuple[str, str, str | None]] = {
    "torch_native": ("specdec.attention.torch_native", "TorchNativeBackend", None),
    "triton": ("specdec.attention.triton_backend", "TritonBackend", "triton"),
}


def register_backend(name: str, module: str, cls: str, requires: str | None = None) -> None:
    _REGISTRY[name] = (module, cls, requires)


def available_backends() -> list[str]:
    """Registered backends whose optional dependency is importable here."""
    names = []
    for name, (_, _, requires) in _REGISTRY.items():
        if requires is None or importlib.util.find_spec(requires) is not None:
            names.append(name)
    return names


def create_attention_backend(name: str, **kwargs: object) -> AttentionBackend:
    if name not in _REGISTRY:
        raise ValueError(
            f"--attention-backend: unknown backend {name!r}; registered: {', '.join(sorted(_REGISTRY))}"
        )
    module, cls, requires = _REGISTRY[name]
    if requires is not None and importlib.util.find_spec(requires) is None:
        raise ImportError(
            f"--attention-backend {name} needs the package {requires!r}, which is not installed"
        )
    factory: Callable[..., AttentionBackend] = getattr(importlib.import_module(module), cls)
    return factory(**kwargs)


__all__ = [
    "AttentionBackend",
    "AttentionLayer",
    "KVCache",
    "available_backends",
    "create_attention_backend",
    "register_backend",
]
