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

__all__ = ["merge_partials", "merge_partials_ref", "plan_num_splits", "split_buffers", "triton_can_run_on"]


_MERGE_TILE = 4096  # fp32 values a program holds: 32 a thread at 4 warps


@triton.jit
def _merge_kernel(
    P, LSE, O, num_heads, num_splits,
    stride_pr, stride_ph, stride_ps,
    stride_lr, stride_lh,
    stride_or, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, HEADS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)  # [HEADS]
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    h_valid = heads < num_heads
    hs_valid = h_valid[:, None] & (offs_s < num_splits)[None, :]  # [HEADS, BLOCK_S]
    lse = tl.load(LSE + row * stride_lr + heads[:, None] * stride_lh + offs_s[None, :], mask=hs_valid,
                  other=float("-inf"))
    m = tl.max(lse, 1)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m[:, None])  # [HEADS, BLOCK_S], 0 for empty splits
    p = tl.load(
        P + row * stride_pr + heads[:, None, None] * stride_ph + offs_s[None, :, None] * stride_ps
        + offs_d[None, None, :],
        mask=hs_valid[:, :, None] & (offs_d < HEAD_DIM)[None, None, :],
        other=0.0,
    )  # [HEADS, BLOCK_S, BLOCK_D]
    total = tl.sum(w, 1)
    out = tl.sum(w[:, :, None] * p, 1) / tl.where(total > 0, total, 1.0)[:, None]  # [HEADS, BLOCK_D]
    tl.store(O + row * stride_or + heads[:, None] * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=h_valid[:, None] & (offs_d < HEAD_DIM)[None, :])


def split_buffers(
    out: torch.Tensor,  # [rows, heads, head_dim]
    splits: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # (partial [rows, heads, splits, head_dim], lse [rows, heads, splits])
    """Where a kernel of ``splits`` KV splits writes: unsplit, ``out`` itself as its one split (the
    lse is then not written: ``out`` stands in for it); split, fp32 partials and their log-sum-exps
    for ``merge_partials``."""
    if splits == 1:
        return out.unsqueeze(2), out
    rows, heads, d = out.shape
    return (torch.empty(rows, heads, splits, d, dtype=torch.float32, device=out.device),
            torch.empty(rows, heads, splits, dtype=torch.float32, device=out.device))


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
    block_d, block_s = head_dim_block(d), triton.next_power_of_2(splits)
    # NOTE: several heads a program: one (row, head) a program made 2048 programs of 4 KB for a bs-1
    # verify of 64 nodes, 7 us a layer on an H100
    per_program = max(1, min(triton.next_power_of_2(heads), _MERGE_TILE // (block_s * block_d)))
    _merge_kernel[(rows, triton.cdiv(heads, per_program))](
        partial, lse, out, heads, splits,
        partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_S=block_s, HEADS=per_program,
    )


def merge_partials_ref(partial: torch.Tensor, lse: torch.Tensor, out: torch.Tensor) -> None:
    """Specification of ``merge_partials``: a softmax over splits weights their outputs."""
    m = lse.max(dim=-1, keepdim=True).values
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp2(lse - m)  # [rows, heads, num_splits]
    total = w.sum(-1, keepdim=True)
    merged = (w.unsqueeze(-1) * partial).sum(-2) / torch.where(total > 0, total, torch.ones_like(total))
    out.copy_(merged.to(out.dtype))
