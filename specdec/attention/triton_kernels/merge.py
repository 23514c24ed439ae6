"""``merge_partials``: combine split-KV partial attention outputs by their log-sum-exp.

Split s of a query row attended to a disjoint part of its KV list and wrote its normalised output
``o_s`` and ``lse_s = log2(sum_j exp2(score_j))`` over that part (-inf when the part was empty).
The full output is ``sum_s w_s o_s / sum_s w_s`` with ``w_s = exp2(lse_s - max_s lse_s)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.attention.triton_kernels.common import head_dim_block, check_device, plan_num_splits, triton_can_run_on
from specdec.kernels.common import check_tensor

__all__ = ["merge_partials", "merge_partials_ref", "plan_num_splits", "triton_can_run_on"]


@triton.jit
def _merge_kernel(
    P, LSE, O, num_splits,
    stride_pr, stride_ph, stride_ps,
    stride_lr, stride_lh,
    stride_or, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_valid = offs_s < num_splits
    d_valid = offs_d < HEAD_DIM
    lse = tl.load(LSE + row * stride_lr + head * stride_lh + offs_s, mask=s_valid, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)  # [BLOCK_S], 0 for empty splits
    p = tl.load(
        P + row * stride_pr + head * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=s_valid[:, None] & d_valid[None, :],
        other=0.0,
    )
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * p, 0) / tl.where(total > 0, total, 1.0)
    tl.store(O + row * stride_or + head * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=d_valid)


def merge_partials(
    partial: torch.Tensor,  # [rows, heads, num_splits, head_dim] fp32
    lse: torch.Tensor,  # [rows, heads, num_splits] fp32, log2 units
    out: torch.Tensor,  # [rows, heads, head_dim] (written)
) -> None:
    rows, heads, splits, d = partial.shape
    check_device(partial.device)
    check_tensor("partial", partial, dtype=torch.float32, dim=4)
    check_tensor("lse", lse, dtype=torch.float32, shape=(rows, heads, splits), device=partial.device)
    if tuple(out.shape) != (rows, heads, d) or out.stride(-1) != 1 or out.device != partial.device:
        raise ValueError(f"out: expected [{rows}, {heads}, {d}] on {partial.device} with unit last stride")
    if rows == 0:
        return
    _merge_kernel[(rows, heads)](
        partial, lse, out, splits,
        partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=d, BLOCK_D=head_dim_block(d), BLOCK_S=triton.next_power_of_2(splits),
    )


def merge_partials_ref(partial: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> None:
    """Specification of ``merge_partials``: a softmax over splits weights their outputs."""
    m = lse.max(dim=-1, keepdim=True).values
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp2(lse - m)  # [rows, heads, num_splits]
    total = w.sum(-1, keepdim=True)
    merged = (w.unsqueeze(-1) * partial).sum(-2) / torch.where(total > 0, total, torch.ones_like(total))
    out.copy_(merged.to(out.dtype))
