"""What the HTTP side of the server holds of a request: its ``RequestStream`` of ``Event``s (the
tokens each engine step committed, then the end), and the errors the engine hands back
(``InvalidRequest``: HTTP 400; ``EngineUnavailable``: 503). An ``EngineClient`` (``async_engine.py``)
fills the streams with what its engine's loop sends."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Protocol

from specdec.engine.sampling import SamplingParams


class InvalidRequest(ValueError):
    """The engine rejected a request (HTTP 400); the message names the field."""


class EngineUnavailable(RuntimeError):
    """The engine is draining or stopped (HTTP 503)."""


@dataclasses.dataclass(slots=True)  # not frozen: the engine's thread makes one a request a step (2 us -> 0.6)
class Event:
    token_ids: list[int]  # tokens committed since the previous Event (may be empty)
    finished: bool = False
    meta_info: dict | None = None  # on the last Event of a request that ran to its end
    error: str | None = None  # on the last Event of a request the server aborted
    status: int = 200  # with error: 503 (shutdown) or 500 (engine failure), as an HTTP status
    # with logprobs requested: per token of token_ids its logprob and [(token id, logprob)] list
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # prompt tokens the prefix cache supplied (Request.cached_tokens), on every Event after the
    # prefill: streamed chunks report it before the request's meta_info exists
    cached_tokens: int = 0

    def then(self, later: "Event") -> "Event":
        """This Event followed by ``later`` as one: their tokens (and logprobs) in order, ``later``'s end."""
        def joined(a: list | None, b: list | None) -> list | None:
            return None if a is None and b is None else (a or []) + (b or [])

        return dataclasses.replace(later, token_ids=self.token_ids + later.token_ids,
                                   logprobs=joined(self.logprobs, later.logprobs),
                                   top_logprobs=joined(self.top_logprobs, later.top_logprobs))


class Aborter(Protocol):
    """What a stream needs of its engine (``EngineClient``): aborting its request."""

    def abort(self, rid: str, sid: int | None = None) -> None: ...


class RequestStream:
    """The asyncio side of one request: iterate for Events; ``cancel()`` when the client leaves."""

    def __init__(self, owner: Aborter, rid: str, sid: int, events: asyncio.Queue, prompt_ids: list[int],
                 params: SamplingParams | None = None) -> None:
        self.owner = owner
        self.rid = rid
        self.sid = sid  # the client's name of this stream (a rid may be reused, a sid is not)
        self.prompt_ids = prompt_ids
        self.prompt_tokens = len(prompt_ids)
        self.wants_logprobs = params is not None and params.wants_logprobs
        self.top_logprobs_num = params.top_logprobs_num if params is not None else 0
        self._events = events
        self.finished = False

    async def next_event(self) -> Event:
        """The next Event; when several are waiting (the engine stepped faster than this stream was
        read), all of them as one, so a slow reader sends fewer, larger chunks."""
        event = await self._events.get()
        while not event.finished and not self._events.empty():
            event = event.then(self._events.get_nowait())
        self.finished = self.finished or event.finished
        return event

    async def __aiter__(self):
        while not self.finished:
            yield await self.next_event()

    def close(self) -> None:
        """Stop reading: abort in the engine (frees its KV) unless it already finished."""
        if not self.finished:
            self.owner.abort(self.rid, self.sid)
            self.finished = True

    def cancel(self, reason: str = "client disconnected") -> None:
        """Abort in the engine (frees its KV) and end this stream with an error Event."""
        if not self.finished:
            self.owner.abort(self.rid, self.sid)
            self._events.put_nowait(Event([], finished=True, error=reason, status=499))
