"""Admission under a shared KV pool: which waiting requests start, how much of their prompt each
prefill step computes (chunked prefill), and how much KV the running requests are still promised.

Admission is optimistic, as SGLang's is: a request is promised its prompt (less the prefix the
cache supplies) plus ``ratio`` times the tokens it may still generate, not its worst case, because
most requests stop long before ``max_new_tokens``. ``ratio`` starts at 0.7 x
``--schedule-conservativeness`` and decays per decode step towards a seventh of that; when decode
runs out of KV anyway the scheduler retracts a request (its KV is freed or cached and it is
recomputed later) and the ratio goes back up. A request whose worst case exceeds the whole pool
is refused at submission, so a request running alone always fits and progress is guaranteed.
Alone means no request holds KV: under overlap a finished request holds its pages until the step
launched with it is read. The pool's room counts cached pages no request uses (evicted on
demand); a request admitted on such a prefix locks it, so it is charged those pages too (issue
#40: both overfilled the pool in the adaptive profile's dummy batches).

Chunked prefill (``--chunked-prefill-size``): a prefill step computes at most that many prompt
tokens. The request cut short stays *chunked* and continues in the next prefill step; decode
steps of the running requests run between them, so a long prompt never stalls them for more
than one chunk. Worked example, chunk size 8, running requests R, arrivals A (20 tokens), B (5):

    step 1  prefill  A[0:8]                  A chunked
    step 2  decode   R
    step 3  prefill  A[8:16]
    step 4  decode   R
    step 5  prefill  A[16:20] + B[0:4]       A done (first token sampled), B chunked
    step 6  decode   R + A
    step 7  prefill  B[4:5]                  B done
"""

from __future__ import annotations

import dataclasses
import math

from specdec.attention.base import ChunkRule
from specdec.engine.request import Request

# SGLang's defaults: the initial ratio, its floor as a fraction of it, and the decay steps
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600


def fill_ids(req: Request) -> list[int]:
    """The tokens a request's KV is computed from: its prompt, then its output (a retracted
    request recomputes both)."""
    return req.prompt_ids + req.output_ids


@dataclasses.dataclass(frozen=True)
class PrefillChunk:
    """Positions [start, start + length) of one request, computed in one prefill step."""

    req: Request
    tokens: list[int]  # [fill_len] the request's fill ids
    start: int  # positions already in KV (cached prefix, earlier chunks)
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def is_last(self) -> bool:
        """The chunk ends the request's fill ids: its logits give the next token."""
        return self.end == len(self.tokens)

    @property
    def next_token(self) -> int:
        """The token after the chunk (known unless ``is_last``): the draft input at its last position."""
        return self.tokens[self.end] if not self.is_last else -1


class NewTokenRatio:
    """The fraction of its remaining ``max_new_tokens`` a running request is expected to use."""

    def __init__(self, conservativeness: float) -> None:
        if not conservativeness > 0:
            raise ValueError(f"--schedule-conservativeness must be > 0, got {conservativeness}")
        self.init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
        self.min = min(self.init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.step = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.value = self.init

    def decay(self) -> None:
        """One decode step ran without running out of KV."""
        self.value = max(self.value - self.step, self.min)

    def on_retract(self) -> None:
        """Decode ran out of KV: promise more per request for a while."""
        self.value = min(max(self.value, self.init) * 1.5, 1.0)


@dataclasses.dataclass(frozen=True)
class KVPromise:
    """KV tokens a request is promised beyond what it holds: its estimated further output plus
    what one decode step may hold at once (a draft tree, a step launched ahead, a page of rounding)."""

    step_tokens: int

    def future_tokens(self, req: Request, ratio: float) -> int:
        remaining = max(req.params.max_new_tokens - len(req.output_ids), 0)
        return math.ceil(remaining * ratio) + self.step_tokens

    def admission_tokens(self, req: Request, extend: int, ratio: float) -> int:
        """What admitting ``req`` (``extend`` prompt tokens to compute) takes from the pool."""
        return extend + self.future_tokens(req, ratio)


def decode_steps_during_prefill(num_prompt_tokens: int, chunk_tokens: int | None) -> int:
    """Most decode steps requests already prefilled take while the rest of ``num_prompt_tokens``
    prefills (one between every two chunks): slack for benchmarks that prefill a batch, then time
    its decode steps."""
    return 0 if chunk_tokens is None else max(-(-num_prompt_tokens // chunk_tokens) - 1, 0)


def chunk_request(req: Request, tokens: list[int], start: int, budget: float, rule: ChunkRule = ChunkRule()
                  ) -> PrefillChunk | None:
    """The next chunk of ``req``: from ``start`` to its end, or, if ``budget`` ends before, to the last
    multiple of ``rule.align`` positions within it that leaves a chunk and a rest of ``rule.least`` tokens
    or more (None: no such position)."""
    rest = len(tokens) - start
    if rest <= budget:
        return PrefillChunk(req, tokens, start, rest)
    end = min(start + int(budget), len(tokens) - rule.least) // rule.align * rule.align
    return PrefillChunk(req, tokens, start, end - start) if end - start >= rule.least else None


def retract_order(reqs: list[Request]) -> list[Request]:
    """Running requests in the order they are retracted: the least output first (the least work
    lost), then the longest prompt (the most KV freed)."""
    return sorted(reqs, key=lambda r: (len(r.output_ids), -len(r.prompt_ids)))
