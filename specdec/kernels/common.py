"""What the ops' references and their Triton implementations share: the tree-mask modes and the
input checks every wrapper runs before it launches."""

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
