"""Batch-invariant linear layer for deterministic inference (``specdec.forward.batch_invariant_enabled``).

``linear_batch_invariant(x, W)`` computes ``x @ W^T (+ bias)`` so that row r of the result is the
same bits whatever M is and whatever the other rows hold: every program reduces the whole of K
itself, from 0 in order (no split-K, no atomics), into one fp32 accumulator, and the launch changes
only the tiling (16-row tiles up to 16 rows, 64-row ones above: ``batch_invariant_kernels``, where
the H200 measurements that every tiling gives the same bits are cited). ``specdec.models.ops.gemv``
(the default) picks its kernel by M: its own Triton tilings, which sum K the same way (under the
switch it keeps them: ``gemv._linear_deterministic``), then cuBLAS past 32 or 64 tokens, which picks
its own kernel and split by shape, so a decode step (M = bs) and a verify forward (M = bs * N) may sum
K in different orders: bf16 outputs then differ in the last bit now and then, and the difference
grows through the layers.

``out_dtype`` float32 (logits): the fp32 accumulator is stored as it is, not rounded to the model
dtype first (the default path rounds, as F.linear would), so near-tied logits stay apart.

Dispatch: the Triton kernel on CUDA tensors and on CPU tensors under TRITON_INTERPRET=1;
``linear_batch_invariant_ref`` elsewhere: one ``F.linear`` per row (an M = 1 product for every row,
batch-invariant by construction; slow, for CPU runs and tests).

Measured cost (H200, an 8B forward's linear layers in one CUDA graph, ``benchmarks/det_linear.py``,
with the default kernel where the switch takes it): about the default path's at 1-64 rows, 1.3x at 128
(benchmarks/results/2026-11-29-h200-det-tilings). CUDA-graph safe: no host sync, the output
allocated in the launch.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from specdec.models.ops import _HAS_TRITON

__all__ = ["linear_batch_invariant", "linear_batch_invariant_ref"]


def _use_kernel(x: torch.Tensor) -> bool:
    if not _HAS_TRITON or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    if torch.is_grad_enabled() and x.requires_grad:
        return False
    if x.device.type == "cuda":
        return True
    return x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" and _kernels().INTERPRETED


def _kernels():
    from specdec.models.ops import batch_invariant_kernels  # NOTE: imports triton

    return batch_invariant_kernels


def linear_batch_invariant(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # [M, N], out_dtype or x's
    """``F.linear(x, weight, bias)`` whose rows do not depend on M (module docstring)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: expected [M, K] and [N, K]")
    if weight.dtype != x.dtype or (bias is not None and bias.shape != (weight.shape[0],)):
        raise ValueError(f"weight {weight.dtype} / bias: expected x's dtype {x.dtype} and shape ({weight.shape[0]},)")
    if not _use_kernel(x):
        return linear_batch_invariant_ref(x, weight, bias, out_dtype=out_dtype)
    return _kernels().linear(x if x.stride(1) == 1 else x.contiguous(), weight.contiguous(), bias,
                             out_dtype=out_dtype or x.dtype)


def linear_batch_invariant_ref(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:  # [M, N]
    """Specification: each row alone through ``F.linear`` (a product at M = 1), then widened to
    ``out_dtype``. Equal to F.linear up to summation order."""
    rows = [F.linear(x[i : i + 1], weight, bias) for i in range(x.shape[0])]
    out = torch.cat(rows) if rows else F.linear(x, weight, bias)
    return out if out_dtype is None else out.to(out_dtype)
