"""EngineLoop: the one thread that calls an Engine, driven by commands, answering with messages.

Between steps the loop drains its inbox (a thread-safe ``queue.SimpleQueue`` of the commands below);
while there is work it runs ``Engine.step()`` and hands every stream the tokens that step committed, as
one Event, all of the step's Events in one ``Events`` message. Every message goes out through
``emit``: in the server's process (``AsyncEngine``) a call into the client, from another process
(``ProcessEngine``) a pipe. Commands and messages are plain picklable dataclasses for that reason.

A stream is a client's reading of one request, named by the client's stream id (``sid``): a client's
``rid`` may be reused once its request ended, a sid never is.

A speculative step commits k + 1 tokens of a request at once (accepted + bonus): one Event carries
them. The last Event of a request has ``finished=True`` and either ``meta_info`` (Request.result()'s)
or ``error`` (the server aborted it: shutdown, engine failure).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from typing import Any, Callable

import torch

from specdec.engine.engine import Engine
from specdec.engine.request import Request
from specdec.engine.tp_worker import TPWorkerError
from specdec.kernels.jit_watch import JitWatch, log_build
from specdec.server.metrics import EngineMetrics
from specdec.server.profiler import ProfileOptions, StepProfiler
from specdec.server.stream import Event, InvalidRequest

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------- commands (client -> loop)
@dataclasses.dataclass
class Submit:
    sid: int
    rid: str
    input_ids: list[int] | None
    text: str | None  # only where the client has no tokenizer (the engine's error names the field)
    sampling_params: dict | None


@dataclasses.dataclass
class Abort:
    rid: str | None  # None: every request in flight (with sid: the request of that stream)
    # True: the request's stream ends with its tokens so far and finish_reason "abort" (SGLang's
    # /abort_request); False: nobody reads the stream any more (the client left)
    notify: bool = False
    sid: int | None = None  # only the request of this stream (None: whichever has rid)


@dataclasses.dataclass
class Call:
    """Run ``EngineLoop.<method>(*args)`` between steps; answered by a ``Reply``."""
    call_id: int
    method: str
    args: tuple = ()


CALLS = ("num_in_flight", "flush_cache", "render_metrics", "on_engine", "abort_all",  # EngineLoop's
         "start_profile", "stop_profile")


@dataclasses.dataclass
class Stop:
    """End the loop, aborting whatever still runs."""


@dataclasses.dataclass
class _WorkerFailed:  # from the engine's tensor-parallel watcher, inside the loop's process
    error: TPWorkerError


# ---------------------------------------------------------------- messages (loop -> client)
@dataclasses.dataclass
class Accepted:
    sid: int
    prompt_ids: list[int] | None = None
    params: Any = None  # SamplingParams
    error: str | None = None  # nothing was queued: the request is invalid, or the engine failed
    status: int = 400  # with error: its HTTP status


@dataclasses.dataclass
class Events:
    items: list[tuple[int, Event]]  # (sid, Event) of one step, or of one abort


@dataclasses.dataclass
class Reply:
    call_id: int
    result: Any = None
    error: BaseException | None = None


@dataclasses.dataclass
class Failed:
    """A tensor-parallel rank failed: the engine cannot go on (every stream already got its error)."""
    message: str


@dataclasses.dataclass
class EngineFacts:
    """What the HTTP side knows of the engine without asking it: read once, when it is built."""
    tokenizer: Any
    context_length: int
    vocab_size: int
    speculative_algorithm: str | None
    memory_info: dict
    engine_args: dict  # SGLang's flag names (/get_server_info)

    @classmethod
    def of(cls, engine: Engine) -> "EngineFacts":
        spec = engine.spec_config
        memory = {"disable_radix_cache": engine.args.disable_radix_cache,
                  "chunked_prefill_size": engine.args.prefill_chunk_tokens, "page_size": engine.memory.page_size,
                  "max_total_tokens": engine.memory.capacity, "kv_bytes_per_token": engine.kv_bytes_per_token}
        # a torch.dtype given in code reads as its flag value
        args = {k: str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v
                for k, v in dataclasses.asdict(engine.args).items()}
        return cls(engine.tokenizer, engine.context_length, engine.target_model.config.vocab_size,
                   spec.algorithm.value if spec else None, memory, args)


@dataclasses.dataclass
class _Tracked:
    req: Request
    sid: int
    sent: int = 0  # output tokens already delivered
    verified: int = 0  # accept_lengths already counted in the metrics


class EngineLoop:
    """Owns an Engine once ``run()`` started: only the thread that runs it may call the engine."""

    def __init__(self, engine: Engine, emit: Callable[[Any], None], *, stream_interval: int = 1,
                 metrics: EngineMetrics | None = None) -> None:
        """``stream_interval``: new tokens a request's Event waits for (its first and its last go at once)."""
        self.engine = engine
        self.emit = emit
        self.stream_interval = stream_interval
        spec = engine.spec_config
        self.metrics = metrics or EngineMetrics(num_draft_positions=spec.num_steps if spec else 0)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._active: dict[str, _Tracked] = {}
        self.profiler = StepProfiler(cuda=lambda: engine.memory.req_to_token.device.type == "cuda")
        engine.watch_workers(lambda error: self.inbox.put(_WorkerFailed(error)))

    def run(self) -> None:
        """Serve commands and steps until ``Stop`` (or a failed rank)."""
        self.engine.bind_thread()
        with JitWatch(on_build=self._kernel_built):
            while True:
                try:
                    if not self._iteration():
                        return
                except TPWorkerError as e:
                    self._fail(e)
                    return
                except Exception:  # noqa: BLE001 — a bug must not leave clients waiting forever
                    logger.exception("engine loop failed; aborting all requests")
                    self.abort_all("internal engine error", status=500)

    def _kernel_built(self, name: str, seconds: float) -> None:
        log_build(name, seconds)
        self.metrics.observe_kernel_build(seconds)

    # ------------------------------------------------------------ what a Call may run
    def num_in_flight(self) -> int:
        return len(self._active)

    def flush_cache(self) -> int:
        return self.engine.flush_cache()

    def render_metrics(self) -> bytes:
        return self.metrics.render()

    def start_profile(self, options: ProfileOptions) -> str:
        """/start_profile: profile the next steps (``specdec.server.profiler``); its message."""
        return self.profiler.start(options)

    def stop_profile(self) -> list[str]:
        """/stop_profile: end the profile and write it; the files written."""
        return self.profiler.stop()

    def on_engine(self, fn: Callable[[Engine], Any]) -> Any:
        """``fn(engine)`` (a test's look at the engine's state; picklable where the loop is in another process)."""
        return fn(self.engine)

    def abort_all(self, reason: str, *, status: int = 503, free_kv: bool = True) -> int:
        """End every request in flight with an error Event; how many there were."""
        items = []
        for rid, t in list(self._active.items()):
            try:
                if free_kv:
                    self.engine.abort(rid)
            except Exception:  # noqa: BLE001 — the KV of a broken step is lost, the server is not
                logger.exception("abort of %s failed", rid)
            self.metrics.requests.labels(finish_reason="abort").inc()
            items.append((t.sid, Event([], finished=True, error=reason, status=status)))
        self._active.clear()
        self._post(items)
        return len(items)

    # ------------------------------------------------------------ the loop
    def _iteration(self) -> bool:
        """Handle the inbox, then run one step if there is work; False once stopped."""
        commands = self._take_commands(block=not self.engine.scheduler.has_work)
        for i, cmd in enumerate(commands):
            if isinstance(cmd, Stop):
                for rest in commands[i + 1:]:
                    self._handle(rest)
                self.abort_all("the server stopped")
                if self.profiler.active:  # what it has so far is written
                    try:
                        logger.info("profile written at shutdown: %s", ", ".join(self.profiler.stop()))
                    except Exception:  # noqa: BLE001 — the loop stops all the same
                        logger.exception("the profile could not be written")
                return False
            try:
                if isinstance(cmd, _WorkerFailed):
                    raise cmd.error
                self._handle(cmd)
            except TPWorkerError:
                for rest in commands[i + 1:]:
                    self.inbox.put(rest)  # answered by _fail
                raise
            except Exception as e:  # noqa: BLE001 — answer this command, keep the others
                logger.exception("engine command %s failed", type(cmd).__name__)
                if isinstance(cmd, Submit):
                    self.emit(Accepted(cmd.sid, error=f"internal engine error: {e}", status=500))
        if self.engine.scheduler.has_work:
            self._step()
        self.metrics.set_load(num_running=len(self.engine.scheduler.running),
                              num_queue=len(self.engine.scheduler.waiting))
        return True

    def _take_commands(self, *, block: bool) -> list:
        commands = [self.inbox.get()] if block else []
        while True:
            try:
                commands.append(self.inbox.get_nowait())
            except queue.Empty:
                return commands

    def _handle(self, cmd) -> None:
        if isinstance(cmd, Submit):
            self._submit(cmd)
        elif isinstance(cmd, Abort):
            self._abort(cmd)
        elif isinstance(cmd, Call):
            try:
                if cmd.method not in CALLS:
                    raise ValueError(f"no such engine call: {cmd.method}")
                self.emit(Reply(cmd.call_id, getattr(self, cmd.method)(*cmd.args)))
            except TPWorkerError:
                raise
            except Exception as e:  # noqa: BLE001 — handed to the caller
                self.emit(Reply(cmd.call_id, error=e))

    def _submit(self, cmd: Submit) -> None:
        if cmd.rid in self._active:
            self.emit(Accepted(cmd.sid, error=f"rid {cmd.rid!r} is already in use by a request in flight"))
            return
        try:
            req = self.engine.make_request(cmd.text, cmd.input_ids, cmd.sampling_params, rid=cmd.rid,
                                           clamp_max_new_tokens=True)
        except (ValueError, TypeError) as e:
            self.emit(Accepted(cmd.sid, error=str(e)))
            return
        self.engine.add_request(req)
        self._active[cmd.rid] = _Tracked(req, cmd.sid)
        self.metrics.prompt_tokens.inc(len(req.prompt_ids))
        self.emit(Accepted(cmd.sid, req.prompt_ids, req.params))

    def _abort(self, cmd: Abort) -> None:
        items = []
        for rid in list(self._active) if cmd.rid is None else [cmd.rid]:
            t = self._active.get(rid)
            if t is None or (cmd.sid is not None and t.sid != cmd.sid):
                continue
            del self._active[rid]
            self.engine.abort(rid)
            self.metrics.requests.labels(finish_reason="abort").inc()
            if cmd.notify:
                items.append((t.sid, self._event(t)))
        self._post(items)

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

    def _step(self) -> None:
        scheduler = self.engine.scheduler
        prefills, start = scheduler.prefill_steps, time.perf_counter()
        try:
            self.engine.step()
        except TPWorkerError:
            raise
        except Exception:  # noqa: BLE001 — keep serving; fail the requests in flight, not the server
            logger.exception("engine step failed; aborting all running requests")
            self.abort_all("internal engine error", status=500)
            return
        self.profiler.after_step()
        self.metrics.observe_step(time.perf_counter() - start, num_running=len(scheduler.running),
                                  num_queue=len(scheduler.waiting), prefill=scheduler.prefill_steps != prefills)
        self.metrics.observe_shapes(scheduler.spec_shape_steps)
        self.metrics.observe_cache(self.engine.cache_stats())
        items = []
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
            items.append((t.sid, self._event(t)))
        self.metrics.observe_verify(verified)
        self._post(items)

    def _fail(self, error: TPWorkerError) -> None:
        """A rank failed: end every request with the cause, answer what waits, tell the client."""
        logger.error("the engine's tensor-parallel group failed; the server stops:\n%s", error)
        self.abort_all(f"the engine failed: {error}", status=500, free_kv=False)
        for cmd in self._take_commands(block=False):
            if isinstance(cmd, Submit):
                self.emit(Accepted(cmd.sid, error=f"the engine failed: {error}", status=503))
            elif isinstance(cmd, Call):
                self.emit(Reply(cmd.call_id, error=RuntimeError(f"the engine failed: {error}")))
        self.emit(Failed(str(error)))

    def _post(self, items: list[tuple[int, Event]]) -> None:
        """Hand a step's Events to the client as one message and count the tokens they carry."""
        if items:
            self.metrics.generation_tokens.inc(sum(len(e.token_ids) for _, e in items))
            self.emit(Events(items))
