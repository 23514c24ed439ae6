"""Graceful shutdown: new requests get 503, in-flight ones finish, or get an error event at the timeout."""

import asyncio
import json
import signal
import time

import httpx

from ..e2e.helpers import engine, make_pair, prompts_of
from .live import GREEDY, LiveServer, kv_is_free


async def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def _stream_until_first_chunk(client, body, first: asyncio.Event) -> list:
    events = []
    async with client.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                first.set()
    return events


def _spec_engine(seed: int):
    target, draft = make_pair("EAGLE", "mixed", seed=seed, max_position_embeddings=4096)
    return target, engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4))


def test_drain_finishes_in_flight_and_rejects_new():
    target, eng = _spec_engine(6)
    prompts = prompts_of([3, 8, 20], target.config.vocab_size, seed=2)
    params = {**GREEDY, "max_new_tokens": 40}
    expected = engine(target).generate(input_ids=prompts, sampling_params=params)
    live = LiveServer(eng, drain_timeout=60)

    async def go():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            firsts = [asyncio.Event() for _ in prompts]
            streams = [asyncio.ensure_future(_stream_until_first_chunk(
                client, {"input_ids": p, "sampling_params": params}, f)) for p, f in zip(prompts[:2], firsts)]
            plain = asyncio.ensure_future(client.post("/generate", json={"input_ids": prompts[2],
                                                                         "sampling_params": params}))
            await asyncio.gather(*(f.wait() for f in firsts[:2]))
            live.server.handle_exit(signal.SIGTERM, None)  # what a signal does
            await _wait_for(lambda: _status(client, "/health", 503))
            late = await client.post("/generate", json={"input_ids": [3], "sampling_params": params})
            deep = await client.get("/health_generate")
            return await asyncio.gather(*streams), await plain, late, deep

    (s1, s2), plain, late, deep = asyncio.run(go())
    assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
    assert deep.status_code == 503 and deep.json() == {"status": "unavailable"}
    for events, want in zip([s1, s2], expected):
        assert events[-1] == "[DONE]"
        assert '"finish_reason": "length"' in events[-2] and str(want["output_ids"])[1:-1] in events[-2]
    assert plain.status_code == 200 and plain.json()["output_ids"] == expected[2]["output_ids"]
    live.thread.join(30)  # the server exits by itself once drained
    assert not live.thread.is_alive() and not live.async_engine.alive
    assert kv_is_free(eng)


def test_drain_timeout_aborts_with_error_event():
    target, eng = _spec_engine(7)
    prompts = prompts_of([4, 9], target.config.vocab_size, seed=3)
    params = {**GREEDY, "max_new_tokens": 4000}  # far more than the drain timeout allows
    live = LiveServer(eng, drain_timeout=0.2)

    async def go():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            first = asyncio.Event()
            stream = asyncio.ensure_future(_stream_until_first_chunk(
                client, {"input_ids": prompts[0], "sampling_params": params}, first))
            plain = asyncio.ensure_future(client.post("/generate", json={"input_ids": prompts[1],
                                                                         "sampling_params": params}))
            await first.wait()
            live.server.handle_exit(signal.SIGINT, None)
            return await stream, await plain

    events, plain = asyncio.run(go())
    assert events[-1] == "[DONE]" and '"error"' in events[-2] and "shut down" in events[-2]
    assert plain.status_code == 503 and "shut down" in plain.json()["error"]["message"]
    live.thread.join(30)
    assert not live.thread.is_alive() and not live.async_engine.alive
    assert kv_is_free(eng)


async def _status(client, path: str, code: int) -> bool:
    return (await client.get(path)).status_code == code


def test_stop_without_drain_aborts_and_frees():
    """Stopping the engine thread directly (lifespan shutdown) ends streams with an error event."""
    target, eng = _spec_engine(8)
    live = LiveServer(eng)

    async def go():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            body = {"input_ids": [5, 6, 7], "sampling_params": {**GREEDY, "max_new_tokens": 4000}, "stream": True}
            events = []
            async with client.stream("POST", "/generate", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                        if len(events) == 1:
                            await asyncio.to_thread(live.async_engine.stop)
        return events

    events = asyncio.run(go())
    assert events[-1] == "[DONE]" and "error" in events[-2] and "stopped" in events[-2]["error"]["message"]
    live.close()
    assert kv_is_free(eng)
