"""Launch helpers shared by the Triton kernels: op registration, block sizes and error flags."""

from __future__ import annotations

import functools
from typing import Callable

import torch


def next_pow2(n: int, *, minimum: int = 16) -> int:
    """Smallest power of two >= max(n, minimum) (tl.arange needs a power of two >= 16 on GPU)."""
    p = minimum
    while p < n:
        p *= 2
    return p


def custom_op(name: str, mutates_args: tuple[str, ...]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register the decorated launch function as ``torch.ops.specdec.<name>``, with a fake that does
    nothing (every output is written in place), and return what the wrappers call: the registered
    op while torch.compile traces, the launch function itself otherwise.

    NOTE: eager calls, CUDA-graph capture included, skip the dispatcher: a Python custom op costs
    20-60 µs of host time a call (more arguments, more time), more than most of these kernels take.
    """
    def wrap(launch: Callable[..., None]) -> Callable[..., None]:
        op = torch.library.custom_op(f"specdec::{name}", mutates_args=mutates_args)(launch)
        op.register_fake(lambda *args, **kwargs: None)
        traced = getattr(torch.ops.specdec, name)

        @functools.wraps(launch)
        def run(*args) -> None:
            if torch.compiler.is_compiling():
                return traced(*args)
            return launch(*args)

        run.custom_op = op  # NOTE: torch's registry of CustomOpDefs holds them weakly
        return run
    return wrap


def error_flag_for(n: int, device: torch.device, error_flag: torch.Tensor | None) -> torch.Tensor:
    """The [n] int32 error-flag buffer a kernel writes (0 = fine); allocated when not given.

    NOTE: allocated uninitialised (no fill kernel): every kernel here writes its flag entry
    unconditionally, one entry per program.
    """
    if error_flag is None:
        return torch.empty(n, dtype=torch.int32, device=device)
    if error_flag.dtype != torch.int32 or error_flag.shape != (n,) or error_flag.device != device:
        raise ValueError(f"error_flag: expected a [{n}] int32 tensor on {device}, got "
                         f"{error_flag.dtype} {tuple(error_flag.shape)} on {error_flag.device}")
    return error_flag


def raise_on_cpu(error_flag: torch.Tensor, describe: Callable[[int, int], str], *, first: int = 0) -> None:
    """On CPU, raise ValueError(describe(first_bad_item, code)) if any flag is set; items whose
    code has a bit of ``first`` set are reported before the others.

    NOTE: on CUDA this returns at once; reading the flag would synchronise with the host.
    """
    if error_flag.device.type != "cpu":
        return
    bad = torch.nonzero(error_flag & first if first else error_flag).flatten()
    if not bad.numel() and first:
        bad = torch.nonzero(error_flag).flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(describe(i, int(error_flag[i])))
