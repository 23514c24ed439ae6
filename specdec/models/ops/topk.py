"""``softmax_topk``: the k most likely tokens of each row of logits and their probabilities;
``argmax``: each row's most likely token (greedy sampling and the greedy tree verify).

The draft loop runs it on the head's logits once per draft forward (rows = requests x frontier
nodes, columns = the draft vocabulary). ``softmax_topk_ref`` (``torch.softmax`` then
``torch.topk``) is the specification. On a GPU the reference is about fifteen short kernels a call
(the softmax, then torch's radix select: four digit passes of three kernels, a gather and a sort);
the Triton path (``topk_kernels``) is two: one program per (row, chunk of columns) keeps its
chunk's k best and its softmax statistics, one program per row merges them. On an H100 that took
the draft loop of a 6x8x32 step from 2.48 to 2.14 ms at bs 4
(benchmarks/results/2026-11-26-h100-draft-topk).

Dispatch: Triton on CUDA tensors for 1 <= k <= MAX_K (and, in tests, on CPU tensors through the
interpreter by patching ``_applies``); the reference otherwise.

``argmax`` is torch's ``logits.argmax(-1)`` exactly (the first maximum; a NaN counts as the
maximum, the first one). torch reduced a verify's [64, 128256] fp32 logits in 40 us on an H100;
split like softmax_topk (one program per (row, chunk of columns), then one per row), the rows
are read by many more programs at once.

Agreement with the reference: the same tokens in the same order (the k largest logits; among equal
logits the lowest index first, where ``torch.topk`` leaves the order of ties open), probabilities
within a few fp32 ulps: the softmax denominator is summed in another order, and exp on the GPU is
the hardware approximation.
"""

from __future__ import annotations

import functools

import torch

from specdec.models.ops import _HAS_TRITON

__all__ = ["argmax", "argmax_ref", "softmax_topk", "softmax_topk_ref", "MAX_K"]

MAX_K = 16  # the kernels unroll k selection passes; EAGLE trees use topk <= 10


def softmax_topk(
    logits: torch.Tensor,  # [R, V] fp32 / bf16 / fp16
    k: int,
    *,
    id_map: torch.Tensor | None = None,  # [V] int64: the id each column stands for (a draft vocab's target ids)
) -> tuple[torch.Tensor, torch.Tensor]:  # ([R, k] fp32 probabilities, [R, k] int64 token ids)
    """``softmax(logits.float()).topk(k)``, ids through ``id_map``: see the module docstring for the
    dispatch."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(f"logits: expected a [rows, vocab] tensor, got {getattr(logits, 'shape', type(logits))}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"k: expected 1 <= k <= vocab ({logits.shape[1]}), got {k}")
    if id_map is not None and (id_map.dtype != torch.int64 or id_map.shape != (logits.shape[1],)
                               or id_map.device != logits.device or not id_map.is_contiguous()):
        raise ValueError(f"id_map: expected a contiguous [{logits.shape[1]}] int64 tensor on {logits.device}, got "
                         f"{id_map.dtype} {tuple(id_map.shape)} on {id_map.device}")
    if (k <= MAX_K and _HAS_TRITON and _applies(logits.device) and logits.shape[0] > 0
            and logits.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and not (torch.is_grad_enabled() and logits.requires_grad)):
        return _kernels().softmax_topk(logits, k, id_map=id_map)
    return softmax_topk_ref(logits, k, id_map=id_map)


def softmax_topk_ref(logits: torch.Tensor, k: int, *, id_map: torch.Tensor | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Specification of ``softmax_topk``: softmax over each row in fp32, then its k largest, their
    columns mapped through ``id_map`` when given."""
    probs, index = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)
    return probs, index if id_map is None else id_map[index]


def argmax(logits: torch.Tensor) -> torch.Tensor:  # [R, V] -> [R] int64
    """``logits.argmax(-1)`` of a [rows, vocab] tensor: see the module docstring for the dispatch."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits: expected a [rows, vocab] tensor, got {getattr(logits, 'shape', type(logits))}")
    if (_HAS_TRITON and _applies(logits.device) and logits.shape[0] > 0
            and logits.dtype in (torch.float32, torch.bfloat16, torch.float16)):
        return _kernels().argmax(logits)
    return argmax_ref(logits)


def argmax_ref(logits: torch.Tensor) -> torch.Tensor:
    """Specification of ``argmax``."""
    return logits.argmax(dim=-1)


def _applies(device: torch.device) -> bool:
    """CUDA only: on CPU the draft keeps the reference (tests patch this to run the interpreter)."""
    return device.type == "cuda"


@functools.cache
def _kernels():
    from specdec.models.ops import topk_kernels  # NOTE: imports triton

    return topk_kernels
