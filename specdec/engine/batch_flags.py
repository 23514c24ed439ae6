"""What a batch of requests needs beyond plain sampling, worked out once per membership.

A decode step asks of its batch: does any request need logits processing (penalties, logit_bias,
min_new_tokens, a grammar)? logprobs? its own generator? is every request greedy? which requests
speculate? The answers depend only on the requests' sampling params, grammar and generator, none of
which change while a request runs, so they change only when requests join or leave. Asking every
request every step cost the host ~214 property calls a step at 128 requests (H200 profile,
2026-11-28); ``Memo`` asks once per membership and compares the batch's identities otherwise.

Glossary: bs = requests of the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import torch

from specdec.engine.sampling import SamplingBatch

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class BatchFlags:
    """A batch's sampling needs (objects with ``params`` and optional ``grammar`` / ``generator``)."""

    all_greedy: bool
    # any logits processor: penalties, logit_bias, min_new_tokens, a grammar
    needs_processing: bool
    # a request with a grammar matcher (its mask is built per node on the host)
    grammar: bool
    # None: no request wants logprobs; else the most top logprobs a request wants
    top_logprobs_num: int | None
    # a request draws from its own generator (sampling_seed)
    seeded: bool

    @classmethod
    def of(cls, requests: Sequence[Any]) -> "BatchFlags":
        params = [r.params for r in requests]
        wants = [p.top_logprobs_num for p in params if p.wants_logprobs]
        return cls(
            all_greedy=all(p.is_greedy for p in params),
            needs_processing=any(p.needs_processing for p in params),
            grammar=any(getattr(r, "grammar", None) is not None for r in requests),
            top_logprobs_num=max(wants) if wants else None,
            seeded=any(getattr(r, "generator", None) is not None for r in requests),
        )


class BatchStatics:
    """One batch's requests with what their sampling needs while the membership holds: the flags,
    and the per-request parameter tensors (built on first use, per device)."""

    def __init__(self, requests: Sequence[Any]) -> None:
        self.requests = list(requests)
        self.params = [r.params for r in self.requests]
        self.flags = BatchFlags.of(self.requests)
        self._tensors: dict[torch.device, SamplingBatch] = {}

    def sampling_batch(self, device) -> SamplingBatch:
        key = torch.device(device)
        if key not in self._tensors:
            self._tensors[key] = SamplingBatch.from_params(self.params, device)
        return self._tensors[key]


class Memo(Generic[T]):
    """``build(requests)`` of the last batch asked about, rebuilt only when the batch's requests
    (by identity, in order) differ from that batch's.

    NOTE: the memo keeps the batch's requests alive, so no id of its key can be reused by a new
    object while the key is held. A value must depend only on what stays fixed while a request
    runs (params, grammar, generator), never on its tokens or lengths."""

    def __init__(self, build: Callable[[list[Any]], T]) -> None:
        self._build = build
        self._key: list[int] | None = None
        self._requests: list[Any] = []
        self._value: T | None = None

    def __call__(self, requests: Sequence[Any]) -> T:
        key = list(map(id, requests))
        if key != self._key:
            self._requests = list(requests)
            self._value = self._build(self._requests)
            self._key = key
        return self._value

    def clear(self) -> None:
        self._key, self._requests, self._value = None, [], None
