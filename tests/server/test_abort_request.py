"""SGLang's /abort_request and the client's ``rid``: an aborted request's stream ends at once with
the tokens it has and finish_reason "abort" (plain and speculative), abort_all ends every one,
and a rid names one request in flight at a time."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from ..e2e.helpers import engine, make_pair
from .live import GREEDY, LiveServer, kv_is_free

LONG = 6000  # output tokens: seconds of decoding, far more than the test waits for


@pytest.fixture(scope="module", params=[None, "EAGLE"], ids=["plain", "eagle-3x1x4"])
def live(request):
    target, draft = make_pair("EAGLE", "mixed", seed=5, max_position_embeddings=LONG + 16)
    spec = request.param is not None
    with LiveServer(engine(target, draft if spec else None, algorithm=request.param,
                           shape=(3, 1, 4) if spec else None, max_total_tokens=3 * (LONG + 16))) as server:
        yield server


async def _stream_until_aborted(client: httpx.AsyncClient, body: dict, abort: dict) -> list[dict]:
    """Stream ``body``; after its first chunk POST ``abort`` to /abort_request; return the chunks."""
    chunks = []
    async with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks.append(json.loads(line[len("data: "):]))
            if len(chunks) == 1:
                assert (await client.post("/abort_request", json=abort)).status_code == 200
    return chunks



def test_abort_by_rid_ends_the_stream_with_its_tokens(live):
    body = {"input_ids": [1, 5, 9, 13], "sampling_params": {**GREEDY, "max_new_tokens": LONG}, "rid": "req-a"}
    free = httpx.post(f"{live.url}/generate", json={**body, "sampling_params": {**GREEDY, "max_new_tokens": 40},
                                                   "rid": "req-free"}, timeout=60).json()
    assert free["meta_info"]["id"] == "req-free"
    chunks = live.with_client(lambda c: _stream_until_aborted(c, body, {"rid": "req-a"}))
    last = chunks[-1]
    assert last["meta_info"]["id"] == "req-a" and last["meta_info"]["finish_reason"] == "abort"
    ids = last["output_ids"]
    assert 0 < len(ids) < LONG and last["meta_info"]["completion_tokens"] == len(ids)
    n = min(len(ids), len(free["output_ids"]))
    assert ids[:n] == free["output_ids"][:n]  # what it produced is what it would have
    live.wait_idle()
    assert live.engine_state(kv_is_free)


def test_abort_all_ends_every_request_in_flight(live):
    body = {"input_ids": [[1, 5, 9], [1, 7, 2, 8]], "sampling_params": {**GREEDY, "max_new_tokens": LONG},
            "rid": "batch"}
    chunks = live.with_client(lambda c: _stream_until_aborted(c, body, {"abort_all": True}))
    last = {c["index"]: c for c in chunks}
    assert sorted(last) == [0, 1] and [last[i]["meta_info"]["id"] for i in (0, 1)] == ["batch_0", "batch_1"]
    assert all(c["meta_info"]["finish_reason"] == "abort" and len(c["output_ids"]) < LONG for c in last.values())
    live.wait_idle()
    assert live.engine_state(kv_is_free)


def test_rid_errors_name_the_field(live):
    async def go(client):
        params = {**GREEDY, "max_new_tokens": LONG}
        task = asyncio.create_task(client.post("/generate", json={"input_ids": [1, 4], "sampling_params": params,
                                                                  "rid": "taken"}))
        while not await asyncio.to_thread(live.engine_state, lambda e: e.scheduler.has_work):
            await asyncio.sleep(0.01)
        dup = await client.post("/generate", json={"input_ids": [1, 6], "rid": "taken"})
        shape = await client.post("/generate", json={"input_ids": [1, 6], "rid": ["a", "b"]})
        neither = await client.post("/abort_request", json={})
        unknown = await client.post("/abort_request", json={"rid": "nobody"})
        assert (await client.post("/abort_request", json={"rid": "taken"})).status_code == 200
        return dup, shape, neither, unknown, (await task).json()

    dup, shape, neither, unknown, first = live.with_client(go)
    assert dup.status_code == 400 and "rid 'taken' is already in use" in dup.json()["error"]["message"]
    assert shape.status_code == 400 and shape.json()["error"]["message"].startswith("rid:")  # a string only
    assert neither.status_code == 400 and "abort_all" in neither.json()["error"]["message"]
    assert unknown.status_code == 200
    assert first["meta_info"]["finish_reason"] == "abort"
    live.wait_idle()
    assert live.engine_state(kv_is_free)


def test_openai_requests_take_a_rid_too(live):
    """SGLang's rid on /v1/completions: the response id carries it, /abort_request ends it (choice
    i of n > 1 is "{rid}_{i}")."""
    async def go(client):
        body = {"prompt": [1, 5, 9], "max_tokens": LONG - 8, "temperature": 0, "ignore_eos": True}
        one = asyncio.create_task(client.post("/v1/completions", json={**body, "rid": "oa"}))
        two = asyncio.create_task(client.post("/v1/completions", json={**body, "rid": "ob", "n": 2}))
        while await asyncio.to_thread(live.engine_state, lambda e: len(e.scheduler.running)) < 3:
            await asyncio.sleep(0.01)
        for rid in ("oa", "ob_0", "ob_1"):
            assert (await client.post("/abort_request", json={"rid": rid})).status_code == 200
        return (await one).json(), (await two).json()

    one, two = live.with_client(go)
    assert one["id"] == "cmpl-oa" and one["choices"][0]["finish_reason"] == "abort"
    assert two["id"] == "cmpl-ob_0" and [c["finish_reason"] for c in two["choices"]] == ["abort", "abort"]
    live.wait_idle()
    assert live.engine_state(kv_is_free)
