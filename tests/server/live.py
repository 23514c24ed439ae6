"""A live server for tests: uvicorn in a background thread on 127.0.0.1:<ephemeral port>.

The test process talks to it over real HTTP (httpx); the engine's own loop thread runs the model.
"""

from __future__ import annotations

import asyncio
import json
import socket
import string
import threading
import time

import httpx
import uvicorn

from specdec.server.app import GracefulServer, create_app
from specdec.server.async_engine import AsyncEngine

from ..kv_leaks import kv_idle_problems

GREEDY = {"temperature": 0, "ignore_eos": True}


class CharTokenizer:
    """One character per token: ids 3.. are printable characters; 1 = BOS, 2 = EOS (vocab 97)."""

    alphabet = (" \n" + string.ascii_letters + string.digits + string.punctuation)[:94]  # ids 3..96
    bos_token_id, eos_token_id, vocab_size = 1, 2, 97

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        unknown = sorted(set(text) - set(self.alphabet))
        if unknown:
            raise ValueError(f"text: characters outside the test alphabet: {unknown!r}")
        return ([self.bos_token_id] if add_bos else []) + [3 + self.alphabet.index(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.alphabet[i - 3] for i in ids if 3 <= i < 97)


class LiveServer:
    def __init__(self, engine, *, drain_timeout: float = 10.0, model_name: str = "tiny",
                 stream_interval: int = 1) -> None:
        self.async_engine = AsyncEngine(engine, stream_interval=stream_interval)
        app = create_app(self.async_engine, model_name=model_name)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10)
        self.server = GracefulServer(config, self.async_engine, drain_timeout=drain_timeout)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)

    def engine_state(self, fn, timeout: float = 60.0):
        """Run ``fn(engine)`` on the engine's loop thread (or here, once it stopped)."""
        return self.async_engine.on_engine(fn).result(timeout)

    def with_client(self, fn):
        """``await fn(client)`` with an ``httpx.AsyncClient`` on this server, from synchronous code."""
        async def go():
            async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
                return await fn(client)

        return asyncio.run(go())

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Wait until no request runs or waits (aborts of closed streams arrive asynchronously)."""
        deadline = time.monotonic() + timeout
        while self.engine_state(lambda e: e.scheduler.has_work):
            assert time.monotonic() < deadline, "the engine did not go idle"
            time.sleep(0.02)

    def close(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.async_engine.stop()
        assert not self.thread.is_alive() and not self.async_engine.alive

    def __enter__(self) -> "LiveServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def kv_is_free(engine) -> bool:
    return not kv_idle_problems(engine)


async def read_sse(response: httpx.Response) -> list:
    """The ``data:`` payloads of a Server-Sent Events response (JSON, or the string "[DONE]")."""
    events = []
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def post_stream(client: httpx.AsyncClient, path: str, body: dict) -> list:
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        return await read_sse(response)
