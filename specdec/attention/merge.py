"""Merging two attention results over disjoint KV sets by their log-sum-exp (torch, any device).

A query row that attends to KV set A and KV set B can be computed as two attentions and merged:
with ``lse_x = log(sum_{j in X} exp(s_j))`` (natural log, scores already scaled) and ``o_x`` the
softmax-weighted values over X,

    lse = log(exp(lse_a) + exp(lse_b))
    o   = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b

The FlashAttention backend uses it for TARGET_VERIFY (flash-attn has no arbitrary mask): part A is
the request's prefix, part B the tree nodes that row may see.

An empty KV set contributes nothing. NOTE: flash-attn reports the LSE of a row that saw no key as
+inf (-inf inside split-KV), not -inf, so every non-finite LSE is read as "empty" here; a real
LSE is always finite.
"""

from __future__ import annotations

import torch


def merge_attention_states(
    out_a: torch.Tensor,  # [num_rows, num_heads, head_dim]
    lse_a: torch.Tensor,  # [num_rows, num_heads] natural log
    out_b: torch.Tensor,  # [num_rows, num_heads, head_dim]
    lse_b: torch.Tensor,  # [num_rows, num_heads] natural log
) -> tuple[torch.Tensor, torch.Tensor]:  # ([num_rows, num_heads, head_dim] in out_a's dtype, [num_rows, num_heads] fp32)
    """Attention over A ∪ B from the attentions over A and over B. Rows empty in both give 0 and -inf."""
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or out_a.shape[:2] != lse_a.shape:
        raise ValueError(
            f"merge_attention_states: shapes differ: out {tuple(out_a.shape)} / {tuple(out_b.shape)}, "
            f"lse {tuple(lse_a.shape)} / {tuple(lse_b.shape)}"
        )
    # NOTE: python scalars, not a new tensor: a host-to-device copy cannot be captured in a CUDA graph
    neg_inf = float("-inf")
    la = torch.where(torch.isfinite(lse_a), lse_a.float(), neg_inf)
    lb = torch.where(torch.isfinite(lse_b), lse_b.float(), neg_inf)
    peak = torch.maximum(la, lb)
    # NOTE: rows empty in both parts have peak = -inf; shifting by 0 keeps exp() at 0, not nan
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    wa, wb = torch.exp(la - peak), torch.exp(lb - peak)  # [num_rows, num_heads]
    total = wa + wb
    safe = torch.where(total > 0, total, torch.ones_like(total))
    # NOTE: an empty part's output is garbage to ignore (flash-attn writes 0, others may leave nan)
    part_a = torch.where((wa > 0)[..., None], (wa / safe)[..., None] * out_a.float(), 0.0)
    part_b = torch.where((wb > 0)[..., None], (wb / safe)[..., None] * out_b.float(), 0.0)
    out = part_a + part_b
    lse = torch.where(total > 0, peak + torch.log(safe), neg_inf)
    return out.to(out_a.dtype), lse
