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

    def __reduce__(self):
        # NOTE: the engine's process pickles a step's Events for the server's: by its fields in order, 73 us
        # a step of 128 (189 us by the slots default) and 53 us to unpickle (194 us), on our CPU
        return Event, (self.token_ids, self.finished, self.meta_info, self.error, self.status, self.logprobs,
                       self.top_logprobs, self.cached_tokens)

    @staticmethod
    def joined(events: list["Event"]) -> "Event":
        """Several Events of a stream as one: their tokens (and logprobs) in order, the last one's end."""
        if len(events) == 1:
            return events[0]
        tokens = [t for e in events for t in e.token_ids]
        if events[0].logprobs is None:  # a request's Events all carry logprobs or none does (an error's: none)
            return dataclasses.replace(events[-1], token_ids=tokens)
        return dataclasses.replace(events[-1], token_ids=tokens,
                                   logprobs=[v for e in events for v in e.logprobs or ()],
                                   top_logprobs=[v for e in events for v in e.top_logprobs or ()])


class EventBox:
    """Where a stream's Events wait to be read, on the stream's event loop: ``put`` one, ``take`` all that
    wait as one (up to a finished one), their tokens joined once."""

    __slots__ = ("_events", "_waiter")

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._waiter: asyncio.Future | None = None

    def put(self, event: Event) -> None:
        self._events.append(event)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> Event:
        while not self._events:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        end = next((i + 1 for i, e in enumerate(self._events) if e.finished), len(self._events))
        taken, self._events = self._events[:end], self._events[end:]
        return Event.joined(taken)


class Aborter(Protocol):
    """What a stream needs of its engine (``EngineClient``): aborting its request."""

    def abort(self, rid: str, sid: int | None = None) -> None: ...


class RequestStream:
    """The asyncio side of one request: iterate for Events; ``cancel()`` when the client leaves."""

    def __init__(self, owner: Aborter, rid: str, sid: int, events: EventBox, prompt_ids: list[int],
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
        event = await self._events.take()
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
            self._events.put(Event([], finished=True, error=reason, status=499))
