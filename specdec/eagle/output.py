"""What a decode step hands back: queued on the device first (``PendingDecode``), read once later.

The split lets a host overlap its work with the device's: it launches step t + 1 from step t's
device-resident outputs (``next_seq_lens``, ``next_tokens``) before it reads step t's results, so
the device never waits for the host between steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from specdec.eagle.acceptance import PathObservations
from specdec.forward import LogitsOutput, deliberate_sync
from specdec.host import SamplingInfo


@dataclasses.dataclass(frozen=True)
class DecodeOutput:
    # committed tokens of each request (accepted drafts + bonus)
    tokens: list[list[int]]
    # tokens in each request's KV cache after the step
    seq_lens: list[int]
    # accepted draft tokens per request (committed - 1)
    accept_lengths: list[int]
    # the tree shape verified, "SxKxN"; None for a plain step (no draft tree)
    shape: str | None = None
    # the draft ranks each request's path tried and accepted per depth (adaptive speculation)
    paths: PathObservations | None = None


class PendingDecode:
    """A decode step queued on the device. ``result()`` waits for it and reads it (once)."""

    def __init__(
        self,
        next_seq_lens: torch.Tensor,  # [bs] device: tokens in KV after the step
        next_tokens: torch.Tensor,  # [bs] device: each request's last committed token (the next root)
        read: Callable[[], DecodeOutput],
    ) -> None:
        self.next_seq_lens = next_seq_lens
        self.next_tokens = next_tokens
        self._read = read
        self._output: DecodeOutput | None = None

    def result(self) -> DecodeOutput:
        if self._output is None:
            self._output = self._read()
        return self._output


def greedy_ids(out: LogitsOutput, sampling: SamplingInfo) -> torch.Tensor | None:
    """The argmax ``out`` carries (``LogitsOutput.greedy_ids``: a captured graph's), when it is what the
    step draws: every request greedy and no logits processor; else None (the caller takes the argmax or
    samples from the processed logits)."""
    if out.greedy_ids is None or not sampling.is_all_greedy or getattr(sampling, "needs_processing", False):
        return None
    return out.greedy_ids


def sample_next(out: LogitsOutput, sampling: SamplingInfo) -> torch.Tensor:  # [bs] int64
    """One token per request from a decode forward's ``out``: its graph's argmax where that is the
    draw (``greedy_ids``) and no logprobs are recorded, else ``sampling.sample`` of its logits."""
    ids = greedy_ids(out, sampling)
    if ids is None or getattr(sampling, "top_logprobs_num", None) is not None:
        return sampling.sample(out.next_token_logits)
    return ids


def pending_one_token(seq_lens: torch.Tensor, next_ids: torch.Tensor,
                      seq_lens_cpu: list[int] | None = None) -> PendingDecode:
    """A queued plain decode step: one committed token per request ([bs] each, on the device).
    ``seq_lens_cpu``: the lengths where the host has them; the step then copies back its tokens alone
    (no stacking launch: a plain step's host time is mostly launches)."""
    if seq_lens_cpu is not None:
        tokens_view = copy_to_host_async(next_ids)

        def read() -> DecodeOutput:
            return DecodeOutput(tokens=[[t] for t in tokens_view()], seq_lens=[s + 1 for s in seq_lens_cpu],
                                accept_lengths=[0] * len(seq_lens_cpu))
    else:
        host_view = copy_to_host_async(torch.stack([seq_lens, next_ids], 1))

        def read() -> DecodeOutput:
            rows = host_view()
            return DecodeOutput(tokens=[[t] for _, t in rows], seq_lens=[s + 1 for s, _ in rows],
                                accept_lengths=[0] * len(rows))

    return PendingDecode(seq_lens + 1, next_ids, read)


def copy_to_host_async(values: torch.Tensor) -> Callable[[], list]:
    """Start copying ``values`` (e.g. [bs, m] int64) to the host; returns a function that waits for
    the copy and gives them as (nested) lists. On CUDA the copy is ordered after the work queued so far
    only: work queued later keeps the device busy while the host waits."""
    if values.device.type != "cuda":
        rows = values.tolist()
        return lambda: rows
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    done = torch.cuda.Event()
    done.record()

    def wait() -> list:
        with deliberate_sync():
            done.synchronize()
        return host.tolist()

    return wait
