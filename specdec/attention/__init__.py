"""Pluggable attention: the backend ABC, the KV cache, and a registry of backends by name.

Optional libraries (triton, flashinfer, flash-attn) are imported only when their backend is chosen.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from typing import Callable

from specdec.attention.base import AttentionBackend, AttentionLayer
from specdec.attention.hybrid import SEPARATOR, HybridAttentionBackend
from specdec.attention.kv_cache import KVCache


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    module: str
    cls: str
    # top-level modules of which one must be importable (none: always available)
    requires: tuple[str, ...] = ()
    # how to get them, for the error when the backend is chosen without them
    install_hint: str = ""


_REGISTRY: dict[str, BackendEntry] = {
    "torch_native": BackendEntry("specdec.attention.torch_native", "TorchNativeBackend"),
    "triton": BackendEntry("specdec.attention.triton_backend", "TritonBackend", ("triton",), "pip install triton"),
    "flashinfer": BackendEntry("specdec.attention.flashinfer_backend", "FlashInferBackend", ("flashinfer",),
                               "pip install flashinfer-python"),
    "fa3": BackendEntry("specdec.attention.flashattention_backend", "FlashAttentionBackend",
                        ("flash_attn_interface", "sgl_kernel"),
                        "FlashAttention-3 (flash-attention/hopper: `python setup.py install`) or `pip install "
                        "sgl-kernel`; PyPI flash-attn 2.x has no page-size-1 paged KV"),
    # NOTE: flash-attn 2.x owns the top-level name flash_attn too; only FA4 has flash_attn/cute
    "fa4": BackendEntry("specdec.attention.fa4_backend", "FA4Backend", ("flash_attn.cute",),
                        "pip install 'specdec[fa4]' (flash-attn-4: FlashAttention-4 in the CuTe DSL, Hopper or newer)"),
}


def register_backend(name: str, module: str, cls: str, requires: str | tuple[str, ...] | None = None,
                     install_hint: str = "") -> None:
    requires = (requires,) if isinstance(requires, str) else tuple(requires or ())
    _REGISTRY[name] = BackendEntry(module, cls, requires, install_hint or f"pip install {' '.join(requires)}")


def _module_exists(name: str) -> bool:
    """Whether module ``name`` exists, found without importing it (a dotted name: without its package)."""
    top, _, rest = name.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not rest:
        return spec is not None
    path = rest.replace(".", os.sep)
    return any(os.path.exists(os.path.join(loc, path)) or os.path.exists(os.path.join(loc, path + ".py"))
               for loc in spec.submodule_search_locations or ())


def _importable(entry: BackendEntry) -> bool:
    return not entry.requires or any(_module_exists(m) for m in entry.requires)


def available_backends() -> list[str]:
    """Registered backends whose optional dependency is importable here (nothing is imported)."""
    return [name for name, entry in _REGISTRY.items() if _importable(entry)]


def create_attention_backend(name: str, **kwargs: object) -> AttentionBackend:
    """The backend registered as ``name``; ``PREFILL:DECODE`` (``specdec.attention.hybrid``) pairs two."""
    if SEPARATOR in name:
        prefill, _, decode = name.partition(SEPARATOR)
        return HybridAttentionBackend(create_attention_backend(prefill, **kwargs),
                                      create_attention_backend(decode, **kwargs))
    if name not in _REGISTRY:
        raise ValueError(
            f"--attention-backend: unknown backend {name!r}; registered: {', '.join(sorted(_REGISTRY))}"
        )
    entry = _REGISTRY[name]
    if not _importable(entry):
        raise ImportError(
            f"--attention-backend {name} needs {' or '.join(repr(m) for m in entry.requires)}, which is not "
            f"installed: {entry.install_hint}"
        )
    factory: Callable[..., AttentionBackend] = getattr(importlib.import_module(entry.module), entry.cls)
    return factory(**kwargs)


__all__ = [
    "AttentionBackend",
    "AttentionLayer",
    "KVCache",
    "available_backends",
    "create_attention_backend",
    "register_backend",
]
