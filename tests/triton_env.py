"""Importing Triton kernels for tests: interpreted on CPU, compiled on a GPU; seeded test inputs.

NOTE: ``@triton.jit`` reads TRITON_INTERPRET when a kernel module is imported. It is switched on
only while such modules import (and, by each such module's fixture, inside its own tests): left on
for the whole session, every CPU op in every other test would run through the slow interpreter
(tests/conftest.py refuses a session where a module forgot to switch it back).
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest
import torch

INTERPRET = not torch.cuda.is_available()


def import_kernels(module: str) -> ModuleType:
    """Import ``module`` (skipping the test module when triton is missing) in the right mode."""
    saved = os.environ.get("TRITON_INTERPRET")
    if INTERPRET:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        pytest.importorskip("triton")
        return pytest.importorskip(module)
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def kernel_devices(kernel) -> list:
    """The devices a kernel's tests run on: the CPU where ``kernel`` was imported interpreted (else
    skipped), and CUDA (a GPU test)."""
    interpreted = type(kernel).__name__ == "InterpretedFunction"
    return [pytest.param("cpu", marks=pytest.mark.skipif(not interpreted, reason="triton was imported compiled")),
            pytest.param("cuda", marks=pytest.mark.gpu)]


def rand(*shape: int, dtype=torch.float32, device="cpu", seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    """A seeded standard-normal tensor (times ``scale``), drawn on the CPU: the same values on any device."""
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen)).to(dtype=dtype, device=device)
