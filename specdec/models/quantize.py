"""``--speculative-draft-model-quantization fp8``: FP8 copies of a draft head's linear weights.

The draft loop reads the head's weights once per draft forward (0.75 GB for an 8B EAGLE-3 head, the
same again for the draft extend); with FP8 copies its GEMMs read half those bytes on a GPU: up to 16
tokens with 16-bit activations (W8A16), past that with FP8 activations on FP8 tensor
cores (W8A8; ``specdec.models.ops.gemv``). Speculation stays lossless whatever the head proposes;
what FP8 costs is acceptance, measured before this was written: 3.905 -> 3.888 tokens a step for
the SmolLM2 EAGLE-3 head on MT-bench at 6x8x32 with W8A16 throughout, 3.872 with W8A8 throughout
(benchmarks/results/2026-11-26-cpu-draft-fp8-acceptance, 2026-11-26-cpu-draft-w8a8-acceptance).

Which weights: every weight a GEMM of the head reads, the fused q/k/v and gate/up weights
(``StackedLinear``), o_proj, down_proj, the fc and the head's own lm_head. Weights the head shares
with the target (its embedding, a borrowed lm_head) are the target's and stay as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from specdec.models.ops.gemv import attach_fp8_copy_
from specdec.models.ops.stacked_linear import FusedGemmModule

__all__ = ["DRAFT_QUANTIZATIONS", "quantize_draft_"]

DRAFT_QUANTIZATIONS = ("fp8",)


def quantize_draft_(model: nn.Module, method: str) -> list[str]:
    """Attach ``method``'s copies to ``model``'s GEMM weights, in place; returns their names.

    NOTE: call it once the model is built and on its device: a later ``.to()`` re-fuses the
    stacked weights and drops the copies.
    """
    if method not in DRAFT_QUANTIZATIONS:
        raise ValueError(f"--speculative-draft-model-quantization={method!r}: choose one of {list(DRAFT_QUANTIZATIONS)}")
    weight = next(model.parameters())
    if weight.device.type == "cuda" and weight.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"--speculative-draft-model-quantization={method}: on a GPU the FP8 GEMM widens to a bf16 or "
                         f"fp16 model's dtype; this head is {weight.dtype} (choose --dtype bfloat16 or float16)")
    names, stacked_members = [], set()
    for prefix, module in model.named_modules():
        if isinstance(module, FusedGemmModule):
            for name in module._stacked_names:
                stacked = getattr(module, name)
                stacked.fuse_()
                stacked_members.update(id(linear) for linear in stacked.linears)
                attach_fp8_copy_(stacked.weight)
                names.append(f"{prefix}.{name}" if prefix else name)
    for prefix, module in model.named_modules():
        if isinstance(module, nn.Linear) and id(module) not in stacked_members:
            attach_fp8_copy_(module.weight)
            names.append(prefix)
    return names
