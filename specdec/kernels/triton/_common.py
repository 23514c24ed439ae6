"""Launch helpers shared by the Triton kernels: block sizes and error-flag decoding."""

from __future__ import annotations

from typing import Callable

import torch


def next_pow2(n: int, *, minimum: int = 16) -> int:
    """Smallest power of two >= max(n, minimum) (tl.arange needs a power of two >= 16 on GPU)."""
    p = minimum
    while p < n:
        p *= 2
    return p


def error_flag_for(n: int, device: torch.device, error_flag: torch.Tensor | None) -> torch.Tensor:
    """The [n] int32 error-flag buffer a kernel writes (0 = fine); allocated when not given."""
    if error_flag is None:
        return torch.zeros(n, dtype=torch.int32, device=device)
    if error_flag.dtype != torch.int32 or error_flag.shape != (n,) or error_flag.device != device:
        raise ValueError(f"error_flag: expected a [{n}] int32 tensor on {device}, got "
                         f"{error_flag.dtype} {tuple(error_flag.shape)} on {error_flag.device}")
    return error_flag


def raise_on_cpu(error_flag: torch.Tensor, describe: Callable[[int, int], str]) -> None:
    """On CPU, raise ValueError(describe(first_bad_item, code)) if any flag is set.

    NOTE: on CUDA this returns at once; reading the flag would synchronise with the host.
    """
    if error_flag.device.type != "cpu":
        return
    bad = torch.nonzero(error_flag).flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(describe(i, int(error_flag[i])))
