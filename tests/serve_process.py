"""``specdec serve`` in a subprocess for end-to-end tests: on a free port, waited for until /health
answers, stopped when the block ends (terminated if still running)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_process(*flags: str, timeout: float = 60.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """(base URL, process) of ``specdec serve --port <free> --log-level warning *flags`` once healthy."""
    url = f"http://127.0.0.1:{(port := free_port())}"
    proc = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--port", str(port), "--log-level",
                             "warning", *flags], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_healthy(proc, url, timeout=timeout)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(proc: subprocess.Popen, url: str, *, timeout: float = 60.0) -> None:
    """Until ``url``/health answers 200; fails with the server's output if it exits first."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            out = proc.stdout.read()
            raise AssertionError(out.decode() if isinstance(out, bytes) else out)
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"specdec serve at {url} did not come up in {timeout:.0f} s"
        time.sleep(0.2)


def stream_chunks(url: str, body: dict, *, after_first=None, timeout: float = 60.0) -> list[str]:
    """The ``data:`` payloads of a streamed ``/generate`` (``"[DONE]"`` included); ``after_first()`` runs once
    the first arrives (a signal sent mid-request)."""
    chunks = []
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=timeout) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
                if len(chunks) == 1 and after_first is not None:
                    after_first()
    return chunks
