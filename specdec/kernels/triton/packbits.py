"""Triton ``segment_packbits``: one program per segment, BLOCK bytes (8 * BLOCK bits) per iteration.

Error codes (``error_flag[i]``): 1 = segment i's bits lie outside x, 2 = its bytes lie outside y;
nothing is read or written for such a segment.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton._common import custom_op, error_flag_for, raise_on_cpu


@triton.jit(do_not_specialize=["x_numel", "y_numel"])
def _segment_packbits_kernel(x_ptr, in_indptr_ptr, out_indptr_ptr, y_ptr, error_ptr, x_numel, y_numel,
                             BLOCK: tl.constexpr):
    i = tl.program_id(0)
    start = tl.load(in_indptr_ptr + i).to(tl.int64)
    end = tl.load(in_indptr_ptr + i + 1).to(tl.int64)
    dst = tl.load(out_indptr_ptr + i).to(tl.int64)
    bad_in = (start < 0) | (end < start) | (end > x_numel)
    num_bytes = tl.where(bad_in, 0, (end - start + 7) // 8)
    bad_out = ~bad_in & ((dst < 0) | (dst + num_bytes > y_numel))
    tl.store(error_ptr + i, tl.where(bad_in, 1, tl.where(bad_out, 2, 0)))
    num_bytes = tl.where(bad_out, 0, num_bytes)
    byte = tl.arange(0, BLOCK)
    bit = tl.arange(0, 8)
    for k0 in range(0, num_bytes, BLOCK):
        k = k0 + byte
        pos = start + k[:, None] * 8 + bit[None, :]
        bits = tl.load(x_ptr + pos, mask=(k[:, None] < num_bytes) & (pos < end), other=0).to(tl.int32)
        packed = tl.sum(bits << bit[None, :], axis=1)
        tl.store(y_ptr + dst + k, packed.to(tl.uint8), mask=k < num_bytes)


@custom_op("segment_packbits", ("y", "error_flag"))
def _segment_packbits_op(x: torch.Tensor, input_indptr: torch.Tensor, output_indptr: torch.Tensor,
                         y: torch.Tensor, error_flag: torch.Tensor, batch_size: int) -> None:
    if batch_size == 0:
        return
    _segment_packbits_kernel[(batch_size,)](
        x.view(torch.uint8), input_indptr, output_indptr, y, error_flag, x.numel(), y.numel(), BLOCK=128,
        num_warps=4,
    )


def segment_packbits(
    x: torch.Tensor,
    input_indptr: torch.Tensor,
    output_indptr: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    *,
    error_flag: torch.Tensor | None = None,  # [batch_size] int32, 0 = segment in range
) -> None:
    """Triton ``segment_packbits`` (inputs validated by the public op)."""
    bs = int(batch_size)
    flag = error_flag_for(bs, x.device, error_flag)
    _segment_packbits_op(x, input_indptr, output_indptr, y, flag, bs)

    def describe(i: int, code: int) -> str:
        start, end = int(input_indptr[i]), int(input_indptr[i + 1])
        if code == 1:
            return f"input_indptr: segment {i} = [{start}, {end}) is outside x of {x.numel()} bits"
        dst, num_bytes = int(output_indptr[i]), (end - start + 7) // 8
        return f"output_indptr: segment {i} needs bytes [{dst}, {dst + num_bytes}) of y ({y.numel()})"

    raise_on_cpu(flag, describe)


IMPLS = {"segment_packbits": segment_packbits}
