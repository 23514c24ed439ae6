"""``specdec serve`` runs its engine in a process of its own (``specdec.server.engine_process``): it answers
as the engine does offline, and neither process outlives the other or leaves a client waiting."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from specdec.engine.embedded import DEFAULT_MODEL
from specdec.engine.engine import Engine

from ..serve_process import REPO, serve_process, stream_chunks

PROMPT = "Once upon a time"
LONG = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}}


def engine_processes(pid: int) -> list[int]:
    """The processes ``pid`` spawned through multiprocessing (not its resource tracker)."""
    kids = [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    return [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


def gone(pid: int) -> bool:
    """Exited (a zombie whose parent is gone counts: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_engine_runs_in_its_own_process_and_answers_as_offline():
    params = {"temperature": 0, "max_new_tokens": 24}
    with Engine(DEFAULT_MODEL) as engine:
        expected = engine.generate(PROMPT, sampling_params=params)["output_ids"]
    with serve_process() as (url, proc):
        (engine_pid,) = engine_processes(proc.pid)
        out = httpx.post(f"{url}/generate", json={"text": PROMPT, "sampling_params": params}, timeout=60).json()
        assert out["output_ids"] == expected
        streamed = []
        body = {"text": PROMPT, "sampling_params": params, "stream": True}
        with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    streamed = json.loads(line[6:])["output_ids"]
        assert streamed == expected
        metrics = httpx.get(f"{url}/metrics", timeout=30).text  # the engine process renders them
        assert "specdec:generation_tokens_total 48.0" in metrics
        assert httpx.post(f"{url}/flush_cache", timeout=30).status_code == 200
    assert wait_gone(engine_pid)


def test_a_dead_engine_process_ends_the_streams_and_the_server():
    with serve_process() as (url, proc):
        (engine_pid,) = engine_processes(proc.pid)
        chunks = stream_chunks(url, LONG, after_first=lambda: os.kill(engine_pid, signal.SIGKILL))
        last = json.loads(next(c for c in reversed(chunks) if c != "[DONE]"))
        assert "the engine process exited" in last["error"]["message"], chunks[-3:]
        assert proc.wait(timeout=30) != 0
        assert "the engine process exited" in proc.stdout.read().decode()


def test_the_engine_process_ends_with_its_server():
    with serve_process() as (_, proc):
        (engine_pid,) = engine_processes(proc.pid)
        proc.kill()  # no drain, no Stop: the engine process sees its pipe close
        proc.wait()
        assert wait_gone(engine_pid)


def test_an_engine_that_cannot_start_ends_serve_with_its_error():
    out = subprocess.run([sys.executable, "-m", "specdec.cli", "serve", "--model-path", "/nonexistent/model"],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode != 0
    assert "specdec serve: the engine did not start:" in out.stderr and "/nonexistent/model" in out.stderr


def test_a_dead_tensor_parallel_rank_ends_the_streams_and_the_server():
    """A rank of the engine's process dies: its watcher fails the engine, the engine's process tells the server
    (each stream ends with the cause), and the server exits naming it."""
    with serve_process("--tp-size", "2") as (url, proc):
        (engine_pid,) = engine_processes(proc.pid)
        (rank1,) = engine_processes(engine_pid)
        chunks = stream_chunks(url, LONG, after_first=lambda: os.kill(rank1, signal.SIGKILL))
        last = json.loads(next(c for c in reversed(chunks) if c != "[DONE]"))
        assert "worker 1 died" in last["error"]["message"], chunks[-3:]
        assert proc.wait(timeout=60) != 0
        assert "worker 1 died" in proc.stdout.read().decode()
    assert wait_gone(engine_pid)


def test_a_call_error_that_does_not_pickle_reaches_the_server_by_name():
    from multiprocessing import Pipe

    from specdec.server import engine_loop as msg
    from specdec.server.engine_process import _emitter

    class Odd(Exception):  # a local class: pickle cannot name it
        pass

    here, there = Pipe()
    _emitter(there)(msg.Reply(7, error=Odd("no")))
    reply = here.recv()
    assert reply.call_id == 7 and isinstance(reply.error, RuntimeError) and str(reply.error) == "Odd: no"
