"""Tensor parallelism for the reference engine (``--tp-size N``): process management.

Rank 0 is the ``Engine`` the user holds. It starts ranks 1..N-1 as worker processes (``spawn``),
each of which builds the same Engine over its own shard of the target
(``specdec.models.parallel``): torch.distributed with NCCL on CUDA (rank r on ``cuda:r``) and gloo
on CPU. Every rank runs the same scheduler over the same requests, as SGLang's TP schedulers do:
rank 0 forwards each scheduler call (add, step, abort, drain) to the workers over a pipe before
running it itself, so all ranks launch the same forwards in the same order and meet in the same
collectives. Logits are all-gathered, so every rank samples the same tokens from the same seeded
generator; only rank 0's results are read.

Failure, never a hang:
* a worker that raises sends its traceback and exits; rank 0 raises ``TPWorkerError`` with it at its
  next call, or as soon as the collective it waits in fails;
* a worker that dies: gloo collectives fail at once when a peer's connection drops; for NCCL a
  monitor thread aborts the process group when a worker process ends, so a blocked collective
  returns (and the process-group timeout is the last resort);
* rank 0 gone: a worker's pipe read ends with EOF and the worker exits (workers are daemons too).
"""

from __future__ import annotations

import dataclasses
import datetime
import multiprocessing.connection
import os
import socket
import threading
import traceback
from typing import Any

import torch

from specdec.models.parallel import TPGroup

__all__ = ["TPWorkerError", "TPWorkers", "MirroredScheduler", "rank_device", "worker_main"]

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=600)
_STARTUP_POLL_S, _CAUSE_WAIT_S, _JOIN_S = 0.2, 10.0, 10.0


class TPWorkerError(RuntimeError):
    """A tensor-parallel worker failed; the message names the rank and the cause."""


def rank_device(device: str, rank: int) -> str:
    """Rank r's device: ``cuda:{base + r}`` on CUDA, the same CPU otherwise."""
    if not str(device).startswith("cuda"):
        return device
    base = int(str(device).partition(":")[2] or 0)
    return f"cuda:{base + rank}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_distributed(rank: int, size: int, port: int, device: str) -> TPGroup:
    import torch.distributed as dist

    nccl = str(device).startswith("cuda")
    if nccl:
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group("nccl" if nccl else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=COLLECTIVE_TIMEOUT)
    tp = TPGroup(rank=rank, size=size)
    if nccl:  # NOTE: create the communicator now, eagerly: CUDA-graph capture cannot
        tp.all_reduce(torch.zeros(1, device=device))
    return tp


def worker_main(rank: int, size: int, port: int, args: Any, engine_cls: type, threads: int, conn: Any) -> None:
    """A worker process: build rank ``rank``'s engine, then run rank 0's scheduler calls until told to stop."""
    torch.set_num_threads(threads)
    try:
        device = rank_device(args.device, rank)
        tp = init_distributed(rank, size, port, device)
        engine = engine_cls(args=dataclasses.replace(args, device=device), tp_group=tp)
        conn.send(("ready", None))
        while True:
            try:
                name, call_args = conn.recv()
            except EOFError:  # rank 0 is gone
                break
            if name == "shutdown":
                engine.release_cuda_graphs()  # NOTE: before the process group's teardown (Engine.shutdown)
                break
            getattr(engine.scheduler, name)(*call_args)
    except BaseException:  # noqa: BLE001 - every failure goes to rank 0, then the process ends
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)
    _destroy_process_group()


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


class TPWorkers:
    """Rank 0's handle on ranks 1..N-1: start, forward calls, notice failures, shut down."""

    def __init__(self, procs: list[Any], conns: list[Any], nccl: bool) -> None:
        self.procs, self.conns, self.nccl = procs, conns, nccl
        self.closing = False
        self._monitor = threading.Thread(target=self._watch, name="tp-monitor", daemon=True)
        self._monitor.start()

    @classmethod
    def start(cls, args: Any, engine_cls: type) -> tuple["TPWorkers", TPGroup]:
        """Spawn the workers and join their process group as rank 0."""
        ctx = torch.multiprocessing.get_context("spawn")
        size, port = int(args.tp_size), _free_port()
        procs, conns = [], []
        for rank in range(1, size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, name=f"specdec-tp{rank}", daemon=True,
                               args=(rank, size, port, args, engine_cls, torch.get_num_threads(), child))
            proc.start()
            child.close()
            procs.append(proc)
            conns.append(parent)
        workers = cls(procs, conns, nccl=str(args.device).startswith("cuda"))
        result: dict[str, Any] = {}

        def join() -> None:
            try:
                result["tp"] = init_distributed(0, size, port, rank_device(args.device, 0))
            except BaseException as e:  # noqa: BLE001
                result["error"] = e

        joiner = threading.Thread(target=join, name="tp-init", daemon=True)
        joiner.start()
        while joiner.is_alive():  # NOTE: poll, so a worker that dies before joining is not waited for
            joiner.join(_STARTUP_POLL_S)
            if joiner.is_alive() and workers._dead():
                raise workers.failure(None)
        if "error" in result:
            raise workers.failure(result["error"])
        return workers, result["tp"]

    # ------------------------------------------------------------ failures
    def _dead(self) -> list[int]:
        return [rank for rank, p in enumerate(self.procs, start=1) if p.exitcode is not None]

    def _watch(self) -> None:
        sentinels = [p.sentinel for p in self.procs]
        multiprocessing.connection.wait(sentinels)
        if self.closing or not self.nccl:
            return  # gloo: the peer's dropped connection already fails the blocked collective
        import torch.distributed as dist

        if dist.is_initialized():
            dist.distributed_c10d._abort_process_group()

    def failure(self, error: BaseException | None) -> TPWorkerError:
        """A ``TPWorkerError`` naming the failed worker(s) and what they reported; stops the rest."""
        causes = []
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
            proc.join(_CAUSE_WAIT_S if error is not None else 0.5)
            message = None
            try:
                while conn.poll():
                    kind, payload = conn.recv()
                    message = payload if kind == "error" else message
            except (EOFError, OSError):
                pass
            if message is not None or proc.exitcode not in (None, 0):
                causes.append(f"tensor-parallel worker {rank} died (exit code {proc.exitcode})"
                              + (f":\n{message.strip()}" if message else ""))
        self.shutdown()
        if not causes:
            causes.append(f"tensor-parallel rank 0 failed: {error!r}")
        return TPWorkerError("\n".join(causes))

    def check(self) -> None:
        """Raise ``TPWorkerError`` if a worker has reported an error or ended."""
        if self._dead() or any(conn.poll() for conn in self.conns):
            raise self.failure(None)

    # ------------------------------------------------------------ calls
    def wait_ready(self) -> None:
        for conn in self.conns:
            while not conn.poll(_STARTUP_POLL_S):
                if self._dead():
                    raise self.failure(None)
            kind, payload = conn.recv()
            if kind != "ready":
                raise self.failure(None) if kind == "error" else TPWorkerError(f"unexpected message {kind!r}")

    def send(self, name: str, *args: Any) -> None:
        self.check()
        try:
            for conn in self.conns:
                conn.send((name, args))
        except (BrokenPipeError, OSError) as e:
            raise self.failure(e) from e

    def shutdown(self) -> None:
        if self.closing:
            return
        self.closing = True
        for conn in self.conns:
            try:
                conn.send(("shutdown", ()))
            except (BrokenPipeError, OSError):
                pass
        # NOTE: NCCL tears a communicator down collectively: rank 0 destroys its process group while
        # the workers destroy theirs. Joining them first deadlocks (each worker waits for rank 0 in
        # its teardown, is terminated, and rank 0's teardown then waits for a dead peer). With a
        # worker already dead, NCCL's teardown could wait for it forever: leave the group to exit.
        if not (self.nccl and self._dead()):
            _destroy_process_group()
        for proc in self.procs:
            proc.join(_JOIN_S)
            if proc.exitcode is None:
                proc.terminate()
                proc.join(_JOIN_S)
        for conn in self.conns:
            conn.close()


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
            except RuntimeError as e:  # a collective failed: a worker is the likelier culprit
                raise self._workers.failure(e) from e

        return mirrored
