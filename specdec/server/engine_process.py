"""ProcessEngine: the engine's loop in a process of its own, the HTTP server its client over a pipe.

Why a process: torch lets the GIL go around every op and GPU wait, so an engine in a thread of the
server's process takes turns with the event loop that parses requests, detokenizes and streams. At
a hundred streams that streaming is more Python a step than the step itself, and the two ran in
series: on one H200 the engine served 15,000 tok/s through the server and 57,000 alone. In a
process of its own the engine steps while the server streams, and a server that falls behind sends
fewer, larger chunks (a stream reads the Events waiting for it as one). vLLM and SGLang split the
same way.

    server process                              engine process ("specdec-engine")
      EngineClient ── Submit / Abort / Call ──▶   reader thread ─▶ EngineLoop inbox
        reader thread ◀── Accepted / Events ───   EngineLoop.run() (main thread): steps, emits
                          / Reply / Failed

Start-up: the engine process builds the Engine from EngineArgs and sends its ``EngineFacts`` (the
tokenizer included), or why it failed; ``ProcessEngine(...)`` returns once the engine is built.
Stopping: ``stop()`` sends ``Stop``; the engine process aborts what runs, releases the engine and
exits. It ignores SIGINT and SIGTERM (a terminal's Ctrl-C reaches it too): the server drains it
first. A server that dies closes the pipe, which stops the engine the same way.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import queue
import signal
import threading
import traceback
from typing import Any, Callable

from specdec.engine.args import EngineArgs
from specdec.server import engine_loop as msg
from specdec.server.async_engine import EngineClient
from specdec.server.stream import EngineUnavailable

logger = logging.getLogger(__name__)


class EngineStartError(RuntimeError):
    """The engine process could not build its engine; the message is its error."""


class ProcessEngine(EngineClient):
    def __init__(self, engine_args: EngineArgs, *, stream_interval: int = 1, log_level: str = "info",
                 engine_factory: Callable[[EngineArgs], Any] | None = None) -> None:
        """Start the engine process and wait until its engine is built (raises EngineStartError).
        ``engine_factory(engine_args)`` builds it there (default ``Engine(args=...)``; picklable: a
        module-level function or class)."""
        context = multiprocessing.get_context("spawn")  # NOTE: CUDA cannot be used in a forked child
        self._conn, child_end = context.Pipe()
        self._process = context.Process(target=engine_main, name="specdec-engine",
                                        args=(child_end, engine_args, stream_interval, log_level, engine_factory))
        self._process.start()
        child_end.close()
        try:
            first = self._conn.recv()
        except EOFError:
            self._process.join()
            raise EngineStartError(f"the engine process exited (status {self._process.exitcode})") from None
        except BaseException:  # e.g. Ctrl-C while the engine builds: it ignores SIGINT and SIGTERM
            self._process.kill()
            raise
        if isinstance(first, str):
            self._process.join()
            raise EngineStartError(first)
        super().__init__(first)
        self._send_lock = threading.Lock()
        self._stopping = False
        self._reader = threading.Thread(target=self._read, name="specdec-engine-reader", daemon=True)

    @property
    def alive(self) -> bool:
        return self._process.is_alive() and self._reader.is_alive() and self.failure is None

    def start(self) -> None:
        if self._reader.ident is None:
            self.accepting = True
            self._reader.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine process (aborting whatever still runs). Blocking; safe to call twice."""
        self.accepting = False
        self._stopping = True
        if self._process.is_alive():
            try:
                self._send(msg.Stop())
            except EngineUnavailable:
                pass
            self._process.join(timeout)
        if self._process.is_alive():
            logger.warning("the engine process did not stop in %.0f s: killed", timeout)
            self._process.kill()  # NOTE: it ignores SIGTERM
            self._process.join()
        self._conn.close()
        if self._reader.ident is not None:
            self._reader.join(timeout)

    def _send(self, command) -> None:
        try:
            with self._send_lock:
                self._conn.send(command)
        except (OSError, ValueError) as e:  # a closed pipe: the engine process is gone
            raise EngineUnavailable(f"the engine process is gone ({e})") from None

    def _read(self) -> None:
        """The engine process's messages, until it exits."""
        try:
            while True:
                self.receive(self._conn.recv())
        except (EOFError, OSError):
            pass
        if not self._stopping and self.failure is None:
            self._process.join(5)
            self._failed(RuntimeError(f"the engine process exited (status {self._process.exitcode})"))


def engine_main(conn: multiprocessing.connection.Connection, engine_args: EngineArgs, stream_interval: int,
                log_level: str, engine_factory: Callable[[EngineArgs], Any] | None = None) -> None:
    """The engine process: build the Engine, send its facts (or the error, as a string), run the loop."""
    from specdec.engine.engine import Engine
    from specdec.engine.gc_heap import frozen_heap

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        engine = engine_factory(engine_args) if engine_factory is not None else Engine(args=engine_args)
    except Exception as e:  # noqa: BLE001 — handed to the server, which exits with it
        if not isinstance(e, (ValueError, OSError)):  # a bad flag or path says enough in one line
            logger.error("the engine did not start:\n%s", traceback.format_exc())
        conn.send(f"{type(e).__name__}: {e}")
        return
    try:
        loop = msg.EngineLoop(engine, _emitter(conn), stream_interval=stream_interval)
        conn.send(msg.EngineFacts.of(engine))
        threading.Thread(target=_pump, args=(conn, loop.inbox), name="specdec-engine-inbox", daemon=True).start()
        with frozen_heap():  # the built engine kept out of the collector's passes
            loop.run()
    finally:
        engine.shutdown()


def _emitter(conn: multiprocessing.connection.Connection):
    def emit(message) -> None:
        try:
            conn.send(message)
        except (OSError, ValueError):  # the server is gone: the pump stops the loop
            pass
        except Exception:  # noqa: BLE001 — a call's error that does not pickle: its name and message do
            if not (isinstance(message, msg.Reply) and message.error is not None):
                raise
            error = message.error
            emit(msg.Reply(message.call_id, error=RuntimeError(f"{type(error).__name__}: {error}")))

    return emit


def _pump(conn: multiprocessing.connection.Connection, inbox: queue.SimpleQueue) -> None:
    """The server's commands into the loop's inbox; a closed pipe (the server is gone) stops the loop."""
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError):
        inbox.put(msg.Stop())
