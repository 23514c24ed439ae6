"""``segment_packbits``: pack ragged bool segments into bytes (FlashInfer / sgl_kernel semantics).

Used to turn per-request boolean masks into the bit-packed form attention kernels read.
"""

from __future__ import annotations

import torch

from specdec.kernels.common import check_tensor, matches
from specdec.kernels.dispatch import select_impl


def segment_packbits(
    x: torch.Tensor,  # [total_bits] bool
    input_indptr: torch.Tensor,  # [batch_size + 1] int32, segment i is x[indptr[i]:indptr[i+1]]
    output_indptr: torch.Tensor,  # [>= batch_size + 1] int32, segment i's bytes start at output_indptr[i]
    y: torch.Tensor,  # [total_bytes] uint8
    batch_size: int,
) -> None:
    """Pack each bool segment into ceil(len / 8) bytes of ``y``, little-endian bits (see the ref)."""
    bs = int(batch_size)
    if bs < 0:
        raise ValueError(f"batch_size: expected >= 0, got {bs}")
    device = _check_inputs(x, input_indptr, output_indptr, y, bs=bs)
    impl = select_impl("segment_packbits", segment_packbits_ref, device)
    impl(x, input_indptr, output_indptr, y, bs)


def _check_inputs(
    x: torch.Tensor, input_indptr: torch.Tensor, output_indptr: torch.Tensor, y: torch.Tensor, *, bs: int
) -> torch.device:
    """Flat tensors on x's device (indptrs with at least bs + 1 entries); fast path first (see
    ``matches``). Returns the device."""
    if isinstance(x, torch.Tensor):
        device = x.device
        if (matches(x, torch.bool, None, device) and matches(input_indptr, torch.int32, None, device)
                and matches(output_indptr, torch.int32, None, device) and matches(y, torch.uint8, None, device)
                and x.dim() == input_indptr.dim() == output_indptr.dim() == y.dim() == 1
                and input_indptr.shape[0] > bs and output_indptr.shape[0] > bs):
            return device
    check_tensor("x", x, dtype=torch.bool, dim=1)
    device = x.device
    check_tensor("input_indptr", input_indptr, dtype=torch.int32, dim=1, device=device)
    check_tensor("output_indptr", output_indptr, dtype=torch.int32, dim=1, device=device)
    check_tensor("y", y, dtype=torch.uint8, dim=1, device=device)
    for name, indptr in (("input_indptr", input_indptr), ("output_indptr", output_indptr)):
        if indptr.shape[0] < bs + 1:
            raise ValueError(f"{name}: expected at least batch_size + 1 = {bs + 1} entries, got {indptr.shape[0]}")
    return device


def segment_packbits_ref(
    x: torch.Tensor,
    input_indptr: torch.Tensor,
    output_indptr: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
) -> None:
    """Specification of ``segment_packbits``.

    Segment i (bits ``x[input_indptr[i] : input_indptr[i+1]]``) becomes ceil(len / 8) bytes written
    at ``y[output_indptr[i]:]``: bit k of byte j is bit ``8j + k`` of the segment, missing bits are 0
    (numpy.packbits(bitorder="little") per segment). Only those bytes are written;
    ``output_indptr[i+1]`` is not read. Example::

        x = [1 0 1 1 0 0 0 0 1 | 0 1]   input_indptr = [0, 9, 11]   output_indptr = [0, 2, 3]
        y = [0b00001101, 0b00000001 | 0b00000010] = [13, 1 | 2]
    """
    in_ptr, out_ptr = input_indptr.tolist(), output_indptr.tolist()
    weights = torch.tensor([1 << k for k in range(8)], dtype=torch.int32, device=x.device)
    for i in range(batch_size):
        start, end, dst = in_ptr[i], in_ptr[i + 1], out_ptr[i]
        if not 0 <= start <= end <= x.numel():
            raise ValueError(f"input_indptr: segment {i} = [{start}, {end}) is outside x of {x.numel()} bits")
        num_bytes = (end - start + 7) // 8
        if not 0 <= dst <= dst + num_bytes <= y.numel():
            raise ValueError(f"output_indptr: segment {i} needs bytes [{dst}, {dst + num_bytes}) of y ({y.numel()})")
        if num_bytes == 0:
            continue
        bits = torch.zeros(num_bytes * 8, dtype=torch.int32, device=x.device)
        bits[: end - start] = x[start:end].to(torch.int32)
        y[dst : dst + num_bytes] = (bits.view(num_bytes, 8) * weights).sum(dim=-1).to(torch.uint8)
