"""What the ops' references and their Triton implementations share: the tree-mask modes and the
input checks every wrapper runs before it launches (those of a request's row of ``req_to_token``
shared by ``cache_ops`` and ``kv_indices``)."""

from __future__ import annotations

import enum
from typing import Sequence

import torch


class TreeMaskMode(enum.IntEnum):
    FULL_MASK = 0  # per request: N rows x (seq_len + N) columns, prefix then tree block
    QLEN_ONLY = 1  # per request: N x N tree block
    QLEN_ONLY_BITPACKING = 2  # per request: N packed rows, bit j of row t = node t sees node j


MASK_MODES = {int(mode): mode for mode in TreeMaskMode}  # int -> mode without an enum call


def check_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    shape: Sequence[int] | None = None,
    dim: int | None = None,
    device: torch.device | None = None,
) -> None:
    """Raise ValueError naming ``name`` unless ``t`` is a contiguous tensor as described."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    dtypes = (dtype,) if isinstance(dtype, torch.dtype) else dtype
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{name}: expected dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name}: expected {dim} dims, got shape {tuple(t.shape)}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")


def matches(
    t: object,
    dtype: torch.dtype | tuple[torch.dtype, ...],
    shape: tuple[int, ...] | None,
    device: torch.device,
) -> bool:
    """``check_tensor``'s success case (``shape`` None: any) in a few attribute reads.

    NOTE: the ops run eagerly between graph replays, where host time is the step's critical path:
    each op's checks test valid input in one pass of ``matches`` and only on a mismatch rerun the
    ``check_tensor`` calls one by one, in the same order, to raise the error naming the argument.
    """
    return (isinstance(t, torch.Tensor)
            and (t.dtype in dtype if type(dtype) is tuple else t.dtype == dtype)
            and (shape is None or t.shape == shape)
            and t.device == device
            and t.is_contiguous())


def packed_mask_bytes(draft_token_num: int) -> int:
    """Bytes per packed mask row in QLEN_ONLY_BITPACKING (sgl_kernel: 1, 2 or 4)."""
    if draft_token_num > 32:
        raise ValueError(f"QLEN_ONLY_BITPACKING supports draft_token_num <= 32, got {draft_token_num}")
    return 1 if draft_token_num <= 8 else 2 if draft_token_num <= 16 else 4


INDEX_DTYPES = (torch.int32, torch.int64)  # what a slot or row index may be


def check_rows(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, lens: dict[str, torch.Tensor]
) -> tuple[int, torch.device]:
    """req_to_token [max_reqs, max_context], req_pool_indices [bs] and each of ``lens`` [bs], int32
    or int64 on one device; returns (bs, device). Fast path first (see ``matches``), as in every
    op's checks."""
    if (isinstance(req_to_token, torch.Tensor) and req_to_token.dim() == 2
            and isinstance(req_pool_indices, torch.Tensor) and req_pool_indices.dim() == 1):
        device, bs = req_to_token.device, req_pool_indices.shape[0]
        if (matches(req_to_token, INDEX_DTYPES, None, device)
                and matches(req_pool_indices, INDEX_DTYPES, None, device)):
            for t in lens.values():  # a loop: all(<generator>) costs 0.3 µs more
                if not matches(t, INDEX_DTYPES, (bs,), device):
                    break
            else:
                return bs, device
    check_tensor("req_to_token", req_to_token, dtype=INDEX_DTYPES, dim=2)
    device = req_to_token.device
    check_tensor("req_pool_indices", req_pool_indices, dtype=INDEX_DTYPES, dim=1, device=device)
    bs = req_pool_indices.shape[0]
    for name, t in lens.items():
        check_tensor(name, t, dtype=INDEX_DTYPES, shape=(bs,), device=device)
    return bs, device


def table_row(req_to_token: torch.Tensor, row: int, b: int) -> torch.Tensor:
    """Row ``row`` of req_to_token, for request ``b`` of the batch (a reference's bounds check)."""
    if not 0 <= row < req_to_token.shape[0]:
        raise ValueError(f"req_pool_indices: request {b} has row {row} outside [0, {req_to_token.shape[0]})")
    return req_to_token[row]


def ngram_merge_buffer(num_requests: int, device) -> torch.Tensor:
    """``ngram_match``'s merge state for launches of up to ``num_requests`` requests: [2, num_requests]
    int64, row 0 at -1 and row 1 at 0 (every launch leaves it so). Here, below both ``ngram_match``
    modules, so that the Triton one builds it too without importing the public one."""
    buf = torch.zeros(2, num_requests, dtype=torch.int64, device=device)
    buf[0] = -1
    return buf
