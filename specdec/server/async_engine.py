"""The HTTP side's engine: submit, stream, abort from asyncio code; the engine runs elsewhere.

``EngineClient`` is what the routes use. It never calls the Engine: it sends commands to an
``EngineLoop`` (``engine_loop.py``) and reads the loop's messages, handing each stream its Events
(an ``EventBox`` per stream, filled through ``loop.call_soon_threadsafe``, one call per event
loop per step) and resolving the futures its calls await. Where the loop runs:

    AsyncEngine     a thread of this process (tests, and code that built its own Engine)
    ProcessEngine   a process of its own (``engine_process.py``; what ``specdec serve`` runs): the
                    engine's steps never wait for the GIL while this process streams

Lifecycle: ``start()`` → submit/abort … → ``drain(timeout)`` (refuse new requests with
EngineUnavailable, wait for in-flight ones, abort those left at the timeout so their clients get
an error Event) → ``stop()`` (ends the loop; aborts anything still running).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import threading
import time
import uuid
from typing import Any, Callable

from specdec.engine.engine import Engine
from specdec.server import engine_loop as msg
from specdec.server.engine_loop import EngineFacts, EngineLoop
from specdec.server.metrics import EngineMetrics
from specdec.server.profiler import ProfileOptions
from specdec.server.stream import EngineUnavailable, Event, EventBox, InvalidRequest, RequestStream


class EngineClient:
    """The asyncio side of an EngineLoop; subclasses say where the loop runs (``_send``, ``alive``)."""

    def __init__(self, facts: EngineFacts) -> None:
        self.tokenizer = facts.tokenizer
        self.context_length = facts.context_length
        self.vocab_size = facts.vocab_size
        self.speculative_algorithm = facts.speculative_algorithm
        self.memory_info = facts.memory_info
        self.engine_args = facts.engine_args
        self.accepting = False
        # a tensor-parallel rank (or the engine's process) failed: the engine cannot go on, the server stops
        self.failure: Exception | None = None
        self.on_failure: Callable[[Exception], None] | None = None
        self._ids = itertools.count()
        # sid -> (event loop, EventBox) of the streams in flight; a submit or call waiting for its answer: id -> future
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, EventBox]] = {}
        self._pending: dict[int, concurrent.futures.Future] = {}  # sids and call ids

    # ------------------------------------------------------------ where the loop runs
    @property
    def alive(self) -> bool:
        raise NotImplementedError

    def _send(self, command) -> None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ asyncio side
    async def submit(self, *, text: str | None = None, input_ids: list[int] | None = None,
                     sampling_params: dict | None = None, rid: str | None = None) -> RequestStream:
        """Validate and queue one request; raises InvalidRequest (400) or EngineUnavailable (503).
        ``rid``: the client's id for it (SGLang's), unique among the requests in flight; default a
        fresh one. Text is tokenized here, not in the engine's loop."""
        if not (self.accepting and self.alive):
            raise EngineUnavailable("the server is shutting down")
        if text is not None and input_ids is None and self.tokenizer is not None:
            try:
                text, input_ids = None, self.tokenizer.encode(text)
            except (ValueError, TypeError) as e:  # text this tokenizer cannot encode
                raise InvalidRequest(str(e)) from None
        rid = rid if rid is not None else uuid.uuid4().hex
        sid = next(self._ids)
        events = EventBox()
        accepted = self._expect(sid)
        self._streams[sid] = (asyncio.get_running_loop(), events)
        try:
            self._send(msg.Submit(sid, rid, input_ids, text, sampling_params))
        except EngineUnavailable:
            self._streams.pop(sid, None)
            self._pending.pop(sid, None)
            raise
        try:
            reply: msg.Accepted = await asyncio.wrap_future(accepted)
        except asyncio.CancelledError:
            self.abort(rid, sid)  # the client left while the request was being validated
            raise
        if reply.error is not None:
            self._streams.pop(sid, None)
            raise {400: InvalidRequest, 503: EngineUnavailable}.get(reply.status, RuntimeError)(reply.error)
        return RequestStream(self, rid, sid, events, reply.prompt_ids, reply.params)

    def abort(self, rid: str, sid: int | None = None) -> None:
        """Abort a request (no-op once it finished); its stream gets no further Events.
        ``sid``: only the request of that stream (a client's rid may be reused)."""
        if sid is not None:
            self._streams.pop(sid, None)
        self._send(msg.Abort(rid, sid=sid))

    def abort_request(self, rid: str | None) -> None:
        """SGLang's /abort_request: end request ``rid`` (None: every request in flight) now; its
        stream finishes with the tokens it has and ``meta_info.finish_reason`` "abort". A request
        that already finished, or an unknown rid, is left alone."""
        self._send(msg.Abort(rid, notify=True))

    async def flush_cache(self) -> int:
        """Drop every cached KV page no request uses; how many pages were freed."""
        return await self.call("flush_cache")

    async def render_metrics(self) -> bytes:
        """The engine's Prometheus metrics, in the text format."""
        return await self.call("render_metrics")

    async def start_profile(self, options: ProfileOptions) -> str:
        """Profile the engine's next steps (``specdec.server.profiler``); ValueError names a field
        it cannot honor, ProfileConflict says that a profile already runs."""
        return await self.call("start_profile", options)

    async def stop_profile(self) -> list[str]:
        """End the profile and write it; the files written (ProfileConflict: none runs)."""
        return await self.call("stop_profile")

    async def num_in_flight(self) -> int:
        return await self.call("num_in_flight")

    async def call(self, method: str, *args) -> Any:
        """``EngineLoop.<method>(*args)``, run between the engine's steps."""
        return await asyncio.wrap_future(self.call_future(method, *args))

    def call_future(self, method: str, *args) -> concurrent.futures.Future:
        call_id = next(self._ids)
        done = self._expect(call_id)
        try:
            if not self.alive:
                raise EngineUnavailable("the engine is not running")
            self._send(msg.Call(call_id, method, args))
        except EngineUnavailable as e:
            self._pending.pop(call_id, None)
            done.set_exception(e)
        return done

    async def drain(self, timeout: float, *, poll_s: float = 0.05) -> int:
        """Refuse new requests, wait up to ``timeout`` s for in-flight ones, abort the rest.

        Returns how many were aborted; their streams end with an error Event.
        """
        self.accepting = False
        if not self.alive:
            return 0
        deadline = time.monotonic() + timeout
        while await self.num_in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(poll_s)
        return await self.call("abort_all", "the server shut down before this request finished")

    # ------------------------------------------------------------ the loop's messages
    def _expect(self, key: int) -> concurrent.futures.Future:
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._pending[key] = done
        return done

    def receive(self, message) -> None:
        """One message of the loop (called from the thread that reads them)."""
        if isinstance(message, msg.Events):
            self._deliver(message.items)
        elif isinstance(message, msg.Accepted):
            self._resolve(message.sid, message)
        elif isinstance(message, msg.Reply):
            self._resolve(message.call_id, message.result, error=message.error)
        elif isinstance(message, msg.Failed):
            self._failed(RuntimeError(f"the engine failed: {message.message}"))

    def _resolve(self, key: int, result: Any = None, *, error: BaseException | None = None) -> None:
        done = self._pending.pop(key, None)
        if done is None or done.done():
            return  # NOTE: a call the caller gave up on
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def _deliver(self, items: list[tuple[int, Event]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for sid, event in items:
            stream = self._streams.pop(sid, None) if event.finished else self._streams.get(sid)
            if stream is not None:
                by_loop.setdefault(stream[0], []).append((sid, stream[1], event))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # that event loop is closed: nobody listens, free what its streams hold
                for sid, _, event in batch:
                    if not event.finished and self._streams.pop(sid, None) is not None:
                        with contextlib.suppress(EngineUnavailable):  # gone too: nothing holds the KV
                            self._send(msg.Abort(None, sid=sid))

    def _failed(self, error: Exception) -> None:
        """The engine is gone: refuse requests, end the streams and calls left, tell ``on_failure``."""
        self.failure, self.accepting = error, False
        self._deliver([(sid, Event([], finished=True, error=str(error), status=500)) for sid in list(self._streams)])
        for key in list(self._pending):
            self._resolve(key, error=EngineUnavailable(str(error)))
        if self.on_failure is not None:
            self.on_failure(error)


def _put_all(batch: list[tuple[int, EventBox, Event]]) -> None:
    for _, events, event in batch:
        events.put(event)


class AsyncEngine(EngineClient):
    """An EngineLoop in a thread of this process ("specdec-engine")."""

    def __init__(self, engine: Engine, *, metrics: EngineMetrics | None = None, stream_interval: int = 1) -> None:
        """``stream_interval``: new tokens a request's Event waits for (its first and its last go at once)."""
        super().__init__(EngineFacts.of(engine))
        self.engine = engine  # NOTE: only the loop thread may call it once start() ran
        self.loop = EngineLoop(engine, self.receive, stream_interval=stream_interval, metrics=metrics)
        self.metrics = self.loop.metrics
        self._thread = threading.Thread(target=self.loop.run, name="specdec-engine", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _send(self, command) -> None:
        self.loop.inbox.put(command)

    def start(self) -> None:
        if not self._thread.is_alive() and self._thread.ident is None:
            self.accepting = True
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop thread (aborting whatever still runs). Blocking; safe to call twice."""
        self.accepting = False
        if self.alive:
            self._send(msg.Stop())
            self._thread.join(timeout)

    def on_engine(self, fn: Callable[[Engine], Any]) -> concurrent.futures.Future:
        """``fn(engine)`` run between steps on the loop thread (here, once the loop stopped)."""
        if not self.alive:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(fn(self.engine))  # no loop thread: nobody else touches the engine
            return done
        return self.call_future("on_engine", fn)
