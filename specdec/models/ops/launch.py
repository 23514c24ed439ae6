"""Programmatic dependent launch (PDL) for the model's Triton kernels (Hopper and newer).

A decode step at small batch is a chain of short kernels (GEMV, norm, RoPE, SiLU-and-mul, ...);
between two of them the GPU idles for the launch of the next (about a microsecond inside a CUDA
graph) and ramps up again. Launched with PDL, a kernel's programs may start while the previous
kernel still runs: each of our kernels first waits (``gdc_wait``: the previous grid has completed
and its writes are visible), then lets the next kernel launch (``gdc_launch_dependents``), so
launch latency overlaps the previous kernel's tail. Correctness does not depend on the kernel
before: ``gdc_wait`` returns at once when that kernel was launched normally (cuBLAS, torch).

NOTE: every kernel launched with PDL must wait before its first read of another kernel's output
and before its first write (another kernel may still read the memory it writes: the caching
allocator reuses freed blocks in stream order).

``programmatic_launch(False)`` switches PDL off (the baseline of tests and benchmarks); it is read
when a kernel is launched, so a CUDA graph keeps what was in force when it was captured. The
environment variable ``SPECDEC_PDL=0`` switches it off for a whole process and the processes it
starts (tensor-parallel ranks): a profile's kernel times then do not overlap (under PDL a kernel's
time includes its wait for the one before).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Iterator

import torch

__all__ = ["PDL_ENV", "programmatic_launch", "pdl_kwargs"]

PDL_ENV = "SPECDEC_PDL"
_forced: bool | None = False if os.environ.get(PDL_ENV) == "0" else None  # None: on wherever the GPU supports it


@contextlib.contextmanager
def programmatic_launch(enabled: bool) -> Iterator[None]:
    global _forced
    saved, _forced = _forced, enabled
    try:
        yield
    finally:
        _forced = saved


@functools.lru_cache(maxsize=None)
def _supported(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def pdl_kwargs(device: torch.device) -> dict[str, bool]:
    """Launch keywords for a kernel with a ``PDL: tl.constexpr`` parameter."""
    if (_forced is False) or not _supported(device):
        return {"PDL": False}
    return {"PDL": True, "launch_pdl": True}
