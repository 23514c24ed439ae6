"""Which implementation of an op runs: Triton where it applies, the torch reference elsewhere."""

from __future__ import annotations

import functools
import os
from typing import Callable

import torch

# Triton implementations by op name, filled by ``specdec.kernels.triton.load_impls`` the first time
# an op runs where Triton applies; empty (every device uses the reference) if triton won't import.
TRITON_IMPLS: dict[str, Callable[..., None]] = {}


@functools.cache
def _load_triton_impls() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    from specdec.kernels.triton import load_impls  # NOTE: errors in our kernels must surface

    TRITON_IMPLS.update(load_impls())
    return True


def select_impl(name: str, ref: Callable[..., None], device: torch.device) -> Callable[..., None]:
    """The implementation of op ``name`` for tensors on ``device``.

    Triton on CUDA tensors, and on CPU tensors when ``TRITON_INTERPRET=1`` (Triton's interpreter,
    so CI exercises the kernels themselves); the torch reference otherwise or if triton is missing.
    NOTE: the variable is read per call, but triton honours it only if it was set before triton
    was first imported.
    """
    use_triton = device.type == "cuda" or (
        device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    )
    if use_triton and _load_triton_impls() and name in TRITON_IMPLS:
        return TRITON_IMPLS[name]
    return ref
