"""AsyncEngine: one background thread owns an Engine; asyncio code submits, streams and aborts.

Threads:
    loop thread   the only thread that calls the Engine. Between steps it drains the inbox
                  (submit, abort, call, stop); while there is work it runs ``Engine.step()`` and
                  hands every request the tokens that step committed, as one Event.
    event loops   the HTTP server's asyncio code. It never calls the Engine: it puts commands in
                  the inbox (a thread-safe ``queue.SimpleQueue``), awaits a concurrent Future the
                  loop thread resolves, and reads Events from its request's asyncio.Queue, which
                  the loop thread fills through ``loop.call_soon_threadsafe``.

A speculative step commits k + 1 tokens of a request at once (accepted + bonus): one Event carries
them. The last Event of a request has ``finished=True`` and either ``meta_info`` (Request.result()'s)
or ``error`` (the server aborted it: shutdown, engine failure).

Lifecycle: ``start()`` → submit/abort … → ``drain(timeout)`` (refuse new requests with
EngineUnavailable, wait for in-flight ones, abort those left at the timeout so their clients get
an error Event) → ``stop()`` (ends the thread; aborts anything still running).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
import uuid
from typing import Any, Callable

import torch

from specdec.engine.engine import Engine
from specdec.engine.request import Request
from specdec.engine.tp_worker import TPWorkerError
from specdec.server.metrics import EngineMetrics
from specdec.server.stream import EngineUnavailable, Event, InvalidRequest, RequestStream

logger = logging.getLogger(__name__)

# The loop thread and the event loop share the GIL, and torch lets it go around every op and GPU wait.
# With Python's default switch interval (5 ms) the loop thread, wanting it back while the event loop
# streams a step's tokens, waits up to 5 ms each time: the engine's steps then run in series with the
# streaming (on CPU a 2 us torch op took 5.6 ms beside a busy Python thread; at 0.1 ms, 52 us, the busy
# thread keeping ~80 % of its pace). ``serve`` sets this interval for its process.
GIL_SWITCH_INTERVAL_S = 1e-4


@dataclasses.dataclass
class _Tracked:
    req: Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    sent: int = 0  # output tokens already delivered
    verified: int = 0  # accept_lengths already counted in the metrics


@dataclasses.dataclass
class _Submit:
    rid: str
    text: str | None
    input_ids: list[int] | None
    sampling_params: dict | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    done: concurrent.futures.Future  # -> (prompt ids, SamplingParams), or InvalidRequest


@dataclasses.dataclass
class _Abort:
    rid: str | None  # None: every request in flight
    # True: the request's stream ends with its tokens so far and finish_reason "abort" (SGLang's
    # /abort_request); False: nobody reads the stream any more (the client left)
    notify: bool = False
    events: asyncio.Queue | None = None  # only the request of this stream (None: whichever has rid)


@dataclasses.dataclass
class _Call:
    fn: Callable[[Engine], Any]
    done: concurrent.futures.Future


@dataclasses.dataclass
class _Failed:
    error: TPWorkerError


_STOP = object()


class AsyncEngine:
    def __init__(self, engine: Engine, *, metrics: EngineMetrics | None = None, stream_interval: int = 1) -> None:
        """``stream_interval``: new tokens a request's Event waits for (its first and its last go at once)."""
        self.engine = engine  # NOTE: only the loop thread may call it once start() ran
        self.stream_interval = stream_interval
        spec = engine.spec_config
        self.metrics = metrics or EngineMetrics(num_draft_positions=spec.num_steps if spec else 0)
        # static facts, read once here so the HTTP side never touches the engine
        self.tokenizer = engine.tokenizer
        self.context_length = engine.context_length
        self.vocab_size = engine.target_model.config.vocab_size
        self.speculative_algorithm = spec.algorithm.value if spec else None
        self.memory_info = {"disable_radix_cache": engine.args.disable_radix_cache,
                            "chunked_prefill_size": engine.args.prefill_chunk_tokens,
                            "page_size": engine.memory.page_size, "max_total_tokens": engine.memory.capacity,
                            "kv_bytes_per_token": engine.kv_bytes_per_token}
        # SGLang's flag names (/get_server_info); a torch.dtype given in code reads as its flag value
        self.engine_args = {k: str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v
                            for k, v in dataclasses.asdict(engine.args).items()}
        self.accepting = False
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._active: dict[str, _Tracked] = {}  # loop thread only
        self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)
        # a tensor-parallel rank failed or went away: the engine cannot go on, the server stops
        self.failure: TPWorkerError | None = None
        self.on_failure: Callable[[TPWorkerError], None] | None = None
        engine.watch_workers(lambda error: self._inbox.put(_Failed(error)))

    # ------------------------------------------------------------ asyncio side
    def start(self) -> None:
        if not self._thread.is_alive() and self._thread.ident is None:
            self.accepting = True
            self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    async def submit(self, *, text: str | None = None, input_ids: list[int] | None = None,
                     sampling_params: dict | None = None, rid: str | None = None) -> RequestStream:
        """Validate and queue one request; raises InvalidRequest (400) or EngineUnavailable (503).
        ``rid``: the client's id for it (SGLang's), unique among the requests in flight; default a
        fresh one."""
        if not (self.accepting and self.alive):
            raise EngineUnavailable("the server is shutting down")
        loop = asyncio.get_running_loop()
        rid = rid if rid is not None else uuid.uuid4().hex
        events: asyncio.Queue = asyncio.Queue()
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(_Submit(rid, text, input_ids, sampling_params, loop, events, done))
        try:
            prompt_ids, params = await asyncio.wrap_future(done)
        except asyncio.CancelledError:
            self.abort(rid, events)  # the client left while the request was being validated
            raise
        return RequestStream(self, rid, events, prompt_ids, params)

    def abort(self, rid: str, events: asyncio.Queue | None = None) -> None:
        """Abort a request (no-op once it finished); its stream gets no further Events.
        ``events``: only the request whose stream fills this queue (a client's rid may be reused)."""
        self._inbox.put(_Abort(rid, events=events))

    def abort_request(self, rid: str | None) -> None:
        """SGLang's /abort_request: end request ``rid`` (None: every request in flight) now; its
        stream finishes with the tokens it has and ``meta_info.finish_reason`` "abort". A request
        that already finished, or an unknown rid, is left alone."""
        self._inbox.put(_Abort(rid, notify=True))

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """Run ``fn(engine)`` on the loop thread between steps (e.g. to read the KV allocator)."""
        return await asyncio.wrap_future(self.call_future(fn))

    def call_future(self, fn: Callable[[Engine], Any]) -> concurrent.futures.Future:
        done: concurrent.futures.Future = concurrent.futures.Future()
        if not self.alive:
            done.set_result(fn(self.engine))  # no loop thread: nobody else touches the engine
            return done
        self._inbox.put(_Call(fn, done))
        return done

    async def num_in_flight(self) -> int:
        return await self.call(lambda _: len(self._active))

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
        return await self.call(lambda _: self._abort_all("the server shut down before this request finished"))

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop thread (aborting whatever still runs). Blocking; safe to call twice."""
        self.accepting = False
        if self.alive:
            self._inbox.put(_STOP)
            self._thread.join(timeout)

    # ------------------------------------------------------------ loop thread
    def _run(self) -> None:
        self.engine.bind_thread()
        while True:
            try:
                if not self._iteration():
                    return
            except TPWorkerError as e:
                self._fail(e)
                return
            except Exception:  # noqa: BLE001 — a bug must not leave clients waiting forever
                logger.exception("engine loop failed; aborting all requests")
                self._abort_all("internal engine error", status=500)

    def _iteration(self) -> bool:
        """Handle the inbox, then run one step if there is work; False once stopped."""
        commands = self._take_commands(block=not self.engine.scheduler.has_work)
        for i, cmd in enumerate(commands):
            if cmd is _STOP:
                for rest in commands[i + 1:]:
                    self._handle(rest)
                self._abort_all("the server stopped")
                return False
            try:
                if isinstance(cmd, _Failed):
                    raise cmd.error
                self._handle(cmd)
            except TPWorkerError:
                for rest in commands[i + 1:]:
                    self._inbox.put(rest)  # answered by _fail
                raise
            except Exception as e:  # noqa: BLE001 — answer this command, keep the others
                logger.exception("engine command %s failed", type(cmd).__name__)
                done = getattr(cmd, "done", None)
                if done is not None and not done.done():
                    done.set_exception(e)
        if self.engine.scheduler.has_work:
            self._step()
        self.metrics.set_load(num_running=len(self.engine.scheduler.running),
                              num_queue=len(self.engine.scheduler.waiting))
        return True

    def _take_commands(self, *, block: bool) -> list:
        commands = [self._inbox.get()] if block else []
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                return commands

    def _handle(self, cmd) -> None:
        if isinstance(cmd, _Submit):
            self._submit(cmd)
        elif isinstance(cmd, _Abort):
            self._abort(cmd)
        elif isinstance(cmd, _Call) and cmd.done.set_running_or_notify_cancel():
            try:
                cmd.done.set_result(cmd.fn(self.engine))
            except Exception as e:  # noqa: BLE001 — handed to the caller
                cmd.done.set_exception(e)

    def _abort(self, cmd: _Abort) -> None:
        out: dict[asyncio.AbstractEventLoop, list] = {}
        for rid in list(self._active) if cmd.rid is None else [cmd.rid]:
            t = self._active.get(rid)
            if t is None or (cmd.events is not None and t.events is not cmd.events):
                continue
            del self._active[rid]
            self.engine.abort(rid)
            self.metrics.requests.labels(finish_reason="abort").inc()
            if cmd.notify:
                out.setdefault(t.loop, []).append((t, self._event(t)))
        self._post(out)

    def _event(self, t: _Tracked) -> Event:
        """What ``t``'s stream has not had yet, as one Event: the last one once the request finished."""
        req, new = t.req, t.req.output_ids[t.sent:]
        lp = {}
        if req.params.wants_logprobs:
            lp = dict(logprobs=req.output_logprobs[t.sent:], top_logprobs=req.output_top_logprobs[t.sent:])
        t.sent += len(new)
        if req.finished:
            return Event(new, finished=True, meta_info=req.result()["meta_info"], cached_tokens=req.cached_tokens, **lp)
        return Event(new, cached_tokens=req.cached_tokens, **lp)

    def _submit(self, cmd: _Submit) -> None:
        if not cmd.done.set_running_or_notify_cancel():
            return  # the client left while this waited in the inbox
        if cmd.rid in self._active:
            cmd.done.set_exception(InvalidRequest(f"rid {cmd.rid!r} is already in use by a request in flight"))
            return
        try:
            req = self.engine.make_request(cmd.text, cmd.input_ids, cmd.sampling_params, rid=cmd.rid,
                                           clamp_max_new_tokens=True)
        except (ValueError, TypeError) as e:
            cmd.done.set_exception(InvalidRequest(str(e)))
            return
        self.engine.add_request(req)
        self._active[cmd.rid] = _Tracked(req, cmd.loop, cmd.events)
        self.metrics.prompt_tokens.inc(len(req.prompt_ids))
        cmd.done.set_result((req.prompt_ids, req.params))

    def _step(self) -> None:
        start = time.perf_counter()
        try:
            self.engine.step()
        except TPWorkerError:
            raise
        except Exception:  # noqa: BLE001 — keep serving; fail the requests in flight, not the server
            logger.exception("engine step failed; aborting all running requests")
            self._abort_all("internal engine error", status=500)
            return
        self.metrics.observe_step(time.perf_counter() - start, num_running=len(self.engine.scheduler.running),
                                  num_queue=len(self.engine.scheduler.waiting))
        self.metrics.observe_shapes(self.engine.scheduler.spec_shape_steps)
        self.metrics.observe_cache(self.engine.cache_stats())
        out: dict[asyncio.AbstractEventLoop, list] = {}
        verified: list[int] = []  # this step's accept lengths, every request's: one metrics update a step
        for rid, t in list(self._active.items()):
            req = t.req
            if len(req.accept_lengths) > t.verified:
                verified += req.accept_lengths[t.verified:]
                t.verified = len(req.accept_lengths)
            unsent = len(req.output_ids) - t.sent
            if not req.finished and (unsent == 0 or (t.sent and unsent < self.stream_interval)):
                continue
            if req.finished:
                del self._active[rid]
                self.metrics.requests.labels(finish_reason=req.finish_reason.value).inc()
            out.setdefault(t.loop, []).append((t, self._event(t)))
        self.metrics.observe_verify(verified)
        self._post(out)

    def _fail(self, error: TPWorkerError) -> None:
        """A rank failed: end every request with the cause, refuse new ones, tell ``on_failure``."""
        logger.error("the engine's tensor-parallel group failed; the server stops:\n%s", error)
        self.failure, self.accepting = error, False
        self._abort_all(f"the engine failed: {error}", status=500, free_kv=False)
        for cmd in self._take_commands(block=False):
            done = getattr(cmd, "done", None)
            if done is not None and done.set_running_or_notify_cancel():
                done.set_exception(EngineUnavailable(f"the engine failed: {error}"))
        if self.on_failure is not None:
            self.on_failure(error)

    def _abort_all(self, reason: str, *, status: int = 503, free_kv: bool = True) -> int:
        out: dict[asyncio.AbstractEventLoop, list] = {}
        for rid, t in list(self._active.items()):
            try:
                if free_kv:
                    self.engine.abort(rid)
            except Exception:  # noqa: BLE001 — the KV of a broken step is lost, the server is not
                logger.exception("abort of %s failed", rid)
            self.metrics.requests.labels(finish_reason="abort").inc()
            out.setdefault(t.loop, []).append((t, Event([], finished=True, error=reason, status=status)))
        n = len(self._active)
        self._active.clear()
        self._post(out)
        return n

    def _post(self, out: dict[asyncio.AbstractEventLoop, list]) -> None:
        """Hand the Events to their streams (one call_soon_threadsafe per event loop per step, not one per
        request) and count the tokens they carry."""
        self.metrics.generation_tokens.inc(sum(len(e.token_ids) for items in out.values() for _, e in items))
        for loop, items in out.items():
            try:
                loop.call_soon_threadsafe(_deliver, [(t.events, e) for t, e in items])
            except RuntimeError:  # that event loop is closed: nobody listens, free the KV
                for t, event in items:
                    if not event.finished:
                        self._active.pop(t.req.rid, None)
                        self.engine.abort(t.req.rid)


def _deliver(items: list[tuple[asyncio.Queue, Event]]) -> None:
    for events, event in items:
        events.put_nowait(event)
