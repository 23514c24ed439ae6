"""Tensor parallelism for the reference engine (``--tp-size N``, over ``--nnodes``): processes.

Rank 0 is the ``Engine`` the user holds. It starts its node's other ranks as worker processes
(``spawn``); every other node runs ``specdec serve ... --node-rank k`` (``serve_node``), which
starts that node's ranks the same way and serves no HTTP. Each rank builds the same Engine over its
own shard of the target (``specdec.models.parallel``); where they run and how they reach rank 0 is
``tp_control``. Every rank runs the same scheduler over the same requests, as SGLang's TP
schedulers do: rank 0 forwards each scheduler call (add, step, abort, drain) over its control
connections before running it itself, so all ranks launch the same forwards in the same order and
meet in the same collectives. Logits are all-gathered, so every rank samples the same tokens from
the same seeded generator; only rank 0's results are read.

Failure, never a hang:
* a node that never joins: rank 0 raises ``TPWorkerError`` after ``--dist-timeout`` seconds naming
  the nodes missing (and a rank that cannot reach rank 0 gives up after as long);
* a rank that raises sends its traceback and exits; rank 0 raises ``TPWorkerError`` with it at its
  next call, or as soon as the collective it waits in fails;
* a rank that dies (its process, or its whole node) closes its connection: gloo collectives fail at
  once when a peer's connection drops; a monitor thread sees the connection close, aborts an NCCL
  process group so a blocked collective returns, and tells its listeners (the server, which stops
  with the cause); the process-group timeout is the last resort;
* rank 0 gone: a rank's control read ends with EOF and the rank exits.
"""

from __future__ import annotations

import dataclasses
import multiprocessing.connection
from multiprocessing.reduction import ForkingPickler
import sys
import threading
import time
import traceback
from typing import Any, Callable

import torch

from specdec.engine.tp_control import (Topology, TPJoinError, accept, connect, differing_flags, init_distributed,
                                       listen, rank_device)
from specdec.models.parallel import TPGroup

__all__ = ["TPWorkerError", "TPWorkers", "MirroredScheduler", "rank_device", "worker_main", "serve_node"]

_STARTUP_POLL_S, _CAUSE_WAIT_S, _JOIN_S = 0.2, 10.0, 10.0
# a message inside a step: rank 0's speculation choice, these bytes and its name (not pickled: no
# pickled message starts so)
_CHOICE = b"\x00choice:"


class TPWorkerError(RuntimeError):
    """A tensor-parallel rank failed; the message names the rank and the cause."""


# ---------------------------------------------------------------- the ranks other than 0
def worker_main(rank: int, topo: Topology, args: Any, engine_cls: type, threads: int) -> bool:
    """A rank other than 0: join, build its engine, run rank 0's scheduler calls until told to stop.
    True: rank 0 shut it down; False: rank 0 went away. A failure is reported to rank 0 (and
    printed), then the process ends with status 1."""
    import os

    torch.set_num_threads(threads)
    conn = None
    try:
        conn = connect(topo, rank, args)
        device = rank_device(args.device, topo.local_rank(rank))
        tp = init_distributed(rank, topo, device, custom_all_reduce=not args.disable_custom_all_reduce)
        engine = engine_cls(args=dataclasses.replace(args, device=device), tp_group=tp)
        engine.relay_speculation_choices(receive=lambda: _receive_choice(conn))
        conn.send(("ready", None))
        stopped = _run_calls(conn, engine)
    except BaseException as e:  # noqa: BLE001 - every failure goes to rank 0, then the process ends
        message = str(e) if isinstance(e, TPJoinError) else traceback.format_exc()
        print(f"specdec tensor-parallel rank {rank}: {message}", file=sys.stderr, flush=True)
        try:
            if conn is not None:
                conn.send(("error", message))
        finally:
            os._exit(1)
    _destroy_process_group()
    return stopped


def _run_calls(conn: Any, engine: Any) -> bool:
    while True:
        try:
            name, call_args = conn.recv()
            if name == "shutdown":
                engine.release_cuda_graphs()  # NOTE: before the process group's teardown (Engine.shutdown)
                return True
            getattr(engine.scheduler, name)(*call_args)
        except EOFError:  # rank 0 is gone (also while a step waited for its choice)
            return False


def _receive_choice(conn: Any) -> str:
    """Rank 0's speculation choice for the step this rank is running (``TPWorkers.relay_choice``)."""
    data = conn.recv_bytes()
    if not data.startswith(_CHOICE):
        raise RuntimeError("rank 0 sent a scheduler call where this rank waited for its speculation choice: "
                           "the ranks' steps diverged")
    return data[len(_CHOICE):].decode()


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _spawn(ranks: range, topo: Topology, args: Any, engine_cls: type) -> list[Any]:
    ctx = torch.multiprocessing.get_context("spawn")
    procs = []
    for rank in ranks:
        proc = ctx.Process(target=worker_main, name=f"specdec-tp{rank}", daemon=True,
                           args=(rank, topo, args, engine_cls, torch.get_num_threads()))
        proc.start()
        procs.append(proc)
    return procs


def serve_node(args: Any, engine_cls: type) -> None:
    """Node ``--node-rank k`` > 0: run its ranks (the first in this process; each an ``engine_cls``)
    until rank 0 stops them. Raises ``SystemExit`` with the cause when a rank fails or rank 0 goes away."""
    topo = Topology.of(args)
    first, *rest = topo.node_ranks(args.node_rank)
    procs = _spawn(range(first + 1, first + 1 + len(rest)), topo, args, engine_cls)
    stopped = worker_main(first, topo, args, engine_cls, torch.get_num_threads())
    for proc in procs:
        proc.join(_JOIN_S)
        if proc.exitcode is None:
            proc.terminate()
    if not stopped:
        raise SystemExit(f"specdec serve --node-rank {args.node_rank}: node 0 ({topo.host}) went away")


# ---------------------------------------------------------------- rank 0
class TPWorkers:
    """Rank 0's handle on ranks 1..N-1: start, forward calls, notice failures, shut down."""

    def __init__(self, topo: Topology, procs: list[Any], nccl: bool) -> None:
        self.topo, self.nccl = topo, nccl
        self.procs = procs  # this node's ranks 1..R-1, in rank order
        self.conns: dict[int, Any] = {}  # rank -> control connection, every rank but 0
        self.closing = False
        self._lock = threading.Lock()
        self._error: TPWorkerError | None = None
        self._lost = False  # a rank's connection closed
        self._listeners: list[Callable[[TPWorkerError], None]] = []
        # the monitor thread watches every rank's connection and process (from ``wait_ready`` on)
        self._watching = False
        # argument-less calls (``step``), pickled once
        self._encoded: dict[str, bytes] = {}

    @classmethod
    def start(cls, args: Any, engine_cls: type) -> tuple["TPWorkers", TPGroup]:
        """Start this node's ranks, wait for every node's, and join their process group as rank 0."""
        topo = Topology.of(args)
        server = listen(topo)
        workers = cls(topo, _spawn(topo.node_ranks(0)[1:], topo, args, engine_cls),
                      nccl=str(args.device).startswith("cuda"))
        try:
            workers._accept_all(server, args)
        finally:
            server.close()
        result: dict[str, Any] = {}

        def join() -> None:
            try:
                result["tp"] = init_distributed(0, topo, rank_device(args.device, 0),
                                                custom_all_reduce=not args.disable_custom_all_reduce)
            except BaseException as e:  # noqa: BLE001
                result["error"] = e

        joiner = threading.Thread(target=join, name="tp-init", daemon=True)
        joiner.start()
        while joiner.is_alive():  # NOTE: poll, so a rank that dies before joining is not waited for
            joiner.join(_STARTUP_POLL_S)
            if joiner.is_alive() and workers._gone():
                raise workers.failure(None)
        if "error" in result:
            raise workers.failure(result["error"])
        return workers, result["tp"]

    def _accept_all(self, server: Any, args: Any) -> None:
        """Every rank's hello within ``--dist-timeout``, its flags equal to ours; then the welcomes."""
        deadline = time.monotonic() + self.topo.join_timeout
        while len(self.conns) < self.topo.tp_size - 1:
            if self._dead():
                raise self.failure(None)
            if time.monotonic() > deadline:
                self._refuse(self._missing_message())
            hello = accept(server, self.topo.authkey)
            if hello is None:
                continue
            rank, their_args, conn = hello
            self.conns[rank] = conn
            if not 0 < rank < self.topo.tp_size:
                self._refuse(f"a rank {rank} joined a group of --tp-size {self.topo.tp_size}")
            if differing := differing_flags(args, their_args):
                self._refuse(f"node {self.topo.node_of(rank)}'s flags differ from node 0's: " + "; ".join(differing))
        for conn in self.conns.values():
            conn.send(("welcome", None))

    def _missing_message(self) -> str:
        missing = sorted({self.topo.node_of(r) for r in range(1, self.topo.tp_size) if r not in self.conns})
        return (f"--nnodes {self.topo.nnodes}: node(s) {', '.join(map(str, missing))} did not join within "
                f"{self.topo.join_timeout:g} s (--dist-timeout); start `specdec serve` there with the same flags, "
                f"--node-rank and --dist-init-addr {self.topo.host}:{self.topo.store_port}")

    def _refuse(self, message: str) -> None:
        for conn in self.conns.values():
            try:
                conn.send(("reject", message))
            except OSError:
                pass
        self.shutdown()
        raise TPWorkerError(message)

    # ------------------------------------------------------------ failures
    def _dead(self) -> list[int]:
        first = self.topo.node_ranks(0)[1:]
        return [rank for rank, p in zip(first, self.procs) if p.exitcode is not None]

    def _gone(self) -> bool:
        """A local rank ended or a rank's connection has something (after ready: an error or EOF)."""
        return bool(self._dead()) or any(conn.poll() for conn in self.conns.values())

    def _watch(self) -> None:
        handles = [*self.conns.values(), *(p.sentinel for p in self.procs)]
        try:
            multiprocessing.connection.wait(handles)
        except (OSError, ValueError):  # closed under us: shutting down
            return
        if self.closing:
            return
        if self.nccl:  # NOTE: gloo's blocked collective already fails when the peer's connection drops
            import torch.distributed as dist

            if dist.is_initialized():
                dist.distributed_c10d._abort_process_group()
        error = self.failure(None)
        for listener in self._listeners:
            listener(error)

    def add_failure_listener(self, listener: Callable[[TPWorkerError], None]) -> None:
        """``listener(error)`` from the monitor thread once a rank fails or goes away."""
        self._listeners.append(listener)

    def failure(self, error: BaseException | None) -> TPWorkerError:
        """A ``TPWorkerError`` naming the failed rank(s) and what they reported; stops the rest.
        The first call decides it; later ones (another thread's) return the same error."""
        with self._lock:
            if self._error is None:
                self._error = TPWorkerError("\n".join(self._causes(error)))
                self.shutdown()
            return self._error

    def _causes(self, error: BaseException | None) -> list[str]:
        deadline = time.monotonic() + (_CAUSE_WAIT_S if error is not None else 0.5)
        local = dict(zip(self.topo.node_ranks(0)[1:], self.procs))
        causes = []
        for rank, conn in sorted(self.conns.items()):
            proc = local.get(rank)
            if proc is not None:
                proc.join(max(deadline - time.monotonic(), 0.0))
            message, closed = _drain(conn, max(deadline - time.monotonic(), 0.0) if proc is None else 0.0)
            self._lost |= closed
            if proc is not None and (message is not None or proc.exitcode not in (None, 0)):
                causes.append(f"tensor-parallel worker {rank} died (exit code {proc.exitcode})"
                              + (f":\n{message.strip()}" if message else ""))
            elif proc is None and (message is not None or closed):
                causes.append(f"tensor-parallel rank {rank} (node {self.topo.node_of(rank)}) "
                              + (f"failed:\n{message.strip()}" if message else "is gone: its connection closed"))
        for rank, proc in local.items():
            if rank not in self.conns and proc.exitcode not in (None, 0):
                causes.append(f"tensor-parallel worker {rank} died (exit code {proc.exitcode}) before it joined")
        return causes or [f"tensor-parallel rank 0 failed: {error!r}"]

    def failed(self) -> bool:
        """A rank has failed or gone: the monitor's verdict, else a poll of every rank."""
        return self._error is not None or self._gone()

    def check(self) -> None:
        """Raise ``TPWorkerError`` if a rank has reported an error or ended. Once the monitor thread
        watches the ranks (``wait_ready``), its verdict is read; before, every rank is polled."""
        if self._error is not None or (not self._watching and self._gone()):
            raise self.failure(None)

    # ------------------------------------------------------------ calls
    def wait_ready(self) -> None:
        for rank, conn in sorted(self.conns.items()):
            while not conn.poll(_STARTUP_POLL_S):
                if self._dead():
                    raise self.failure(None)
            try:
                kind, _ = conn.recv()
            except EOFError:
                raise self.failure(None) from None
            if kind != "ready":
                raise self.failure(None) if kind == "error" else TPWorkerError(f"unexpected message {kind!r}")
        threading.Thread(target=self._watch, name="tp-monitor", daemon=True).start()
        self._watching = True

    def send(self, name: str, *args: Any) -> None:
        """Run ``name(*args)`` on every worker's scheduler. NOTE: this is on every decode step's
        path: the call is pickled once (an argument-less one, such as ``step``, once per engine)
        and the same bytes go to each rank, as ``Connection.send`` would pickle them."""
        self.check()
        payload = self._encoded.get(name) if not args else None
        if payload is None:
            payload = bytes(ForkingPickler.dumps((name, args)))
            if not args:
                self._encoded[name] = payload
        self._send_bytes(payload)

    def relay_choice(self, choice: str) -> None:
        """Hand every worker this step's speculation choice (a shape's name, or "plain"), which its
        step waits for (``AdaptiveEAGLEWorker.relay_choices``)."""
        self.check()
        self._send_bytes(_CHOICE + choice.encode())

    def _send_bytes(self, payload: bytes) -> None:
        try:
            for conn in self.conns.values():
                conn.send_bytes(payload)
        except (BrokenPipeError, OSError) as e:
            raise self.failure(e) from e

    def shutdown(self) -> None:
        if self.closing:
            return
        self.closing = True
        for conn in self.conns.values():
            try:
                conn.send(("shutdown", ()))
            except (BrokenPipeError, OSError):
                pass
        # NOTE: NCCL tears a communicator down collectively: rank 0 destroys its process group while
        # the workers destroy theirs. Joining them first deadlocks (each worker waits for rank 0 in
        # its teardown, is terminated, and rank 0's teardown then waits for a dead peer). With a
        # rank already dead, NCCL's teardown could wait for it forever: leave the group to exit.
        if not (self.nccl and (self._dead() or self._lost)):
            _destroy_process_group()
        for proc in self.procs:
            proc.join(_JOIN_S)
            if proc.exitcode is None:
                proc.terminate()
                proc.join(_JOIN_S)
        for conn in self.conns.values():
            conn.close()


def _drain(conn: Any, wait_s: float) -> tuple[str | None, bool]:
    """What a rank's connection holds: its error message (or None), and whether it closed."""
    message = None
    try:
        while conn.poll(wait_s):
            kind, payload = conn.recv()
            message = payload if kind == "error" else message
            wait_s = 0.0
    except (EOFError, OSError):
        return message, True
    return message, False


class MirroredScheduler:
    """The rank-0 scheduler under tensor parallelism: every state-changing call runs on the
    workers' schedulers too (sent first, so they start their collectives together); reads go to
    the local scheduler."""

    _MIRRORED = ("add", "step", "abort", "drain", "flush_cache")

    def __init__(self, scheduler: Any, workers: TPWorkers) -> None:
        self._scheduler = scheduler
        self._workers = workers

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._scheduler, name)
        if name not in self._MIRRORED:
            return attr

        def mirrored(*args: Any) -> Any:
            self._workers.send(name, *args)
            try:
                return attr(*args)
            except Exception as e:
                # a collective failed, or the monitor thread tore the group down under this call
                # (torch then raises ValueError): a worker is the likelier culprit
                if isinstance(e, RuntimeError) or self._workers.failed():
                    raise self._workers.failure(e) from e
                raise

        return mirrored
