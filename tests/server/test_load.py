"""64 concurrent clients: valid requests of mixed sizes, streams closed mid-way, malformed requests.

Every valid request must equal offline plain greedy, the server must stay up, the aborted streams
must free their KV, and /metrics must report the speculative acceptance.
"""

import asyncio
import random

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..e2e.helpers import engine, make_pair, prompts_of
from .live import LiveServer, kv_is_free, read_sse

NUM_VALID, NUM_ABORTED, NUM_BAD = 40, 12, 12
SHAPE = (4, 2, 6)


def _metrics(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def _valid(client, kind: str, ids: list[int], params: dict) -> list[int]:
    if kind == "generate":
        r = await client.post("/generate", json={"input_ids": ids, "sampling_params": params})
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]
    if kind == "completions":
        r = await client.post("/v1/completions", json={"prompt": ids, "max_tokens": params["max_new_tokens"],
                                                        "temperature": 0, "ignore_eos": params["ignore_eos"]})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]
    body = {"input_ids": ids, "sampling_params": params, "stream": True}
    async with client.stream("POST", "/generate", json=body) as r:
        events = await read_sse(r)
    assert events[-1] == "[DONE]"
    return events[-2]["output_ids"]


async def _abort_mid_stream(client, ids: list[int]) -> int:
    body = {"input_ids": ids, "sampling_params": {"temperature": 0, "ignore_eos": True, "max_new_tokens": 300},
            "stream": True}
    async with client.stream("POST", "/generate", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                return r.status_code  # leaving the block closes the connection mid-stream
    raise AssertionError("no chunk before the end")


async def _bad(client, i: int) -> httpx.Response:
    if i % 3 == 0:
        return await client.post("/generate", content=b'{"input_ids": [3, 4', headers={"content-type": "application/json"})
    if i % 3 == 1:
        return await client.post("/v1/completions", json={"prompt": [3, 4], "temperature": -1.0})
    return await client.post("/generate", json={"input_ids": [7] * 700})


def test_64_concurrent_clients_with_aborts_and_bad_requests():
    target, draft = make_pair("EAGLE", "mixed", seed=4)
    vocab = target.config.vocab_size
    rng = random.Random(0)
    lengths = [rng.choice([1, 2, 5, 13, 31, 60]) for _ in range(NUM_VALID)]
    prompts = prompts_of(lengths, vocab, seed=9)
    params = [{"temperature": 0, "max_new_tokens": rng.randint(1, 24), "ignore_eos": i % 2 == 0}
              for i in range(NUM_VALID)]
    kinds = [("generate", "stream", "completions")[i % 3] for i in range(NUM_VALID)]
    expected = engine(target).generate(input_ids=prompts, sampling_params=params)
    abort_prompts = prompts_of([rng.randint(2, 40) for _ in range(NUM_ABORTED)], vocab, seed=10)

    with LiveServer(engine(target, draft, algorithm="EAGLE", shape=SHAPE)) as live:
        async def go():
            limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
            async with httpx.AsyncClient(base_url=live.url, timeout=120, limits=limits) as client:
                jobs = [_valid(client, k, p, sp) for k, p, sp in zip(kinds, prompts, params)]
                jobs += [_abort_mid_stream(client, p) for p in abort_prompts]
                jobs += [_bad(client, i) for i in range(NUM_BAD)]
                order = list(range(len(jobs)))
                rng.shuffle(order)
                results = await asyncio.gather(*[jobs[i] for i in order])
                results = [r for _, r in sorted(zip(order, results))]
                health = await client.get("/health")
                return results, health

        results, health = asyncio.run(go())
        assert health.status_code == 200
        for got, want in zip(results[:NUM_VALID], expected):
            assert got == want["output_ids"]
        assert results[NUM_VALID:NUM_VALID + NUM_ABORTED] == [200] * NUM_ABORTED
        for i, r in enumerate(results[NUM_VALID + NUM_ABORTED:]):
            assert 400 <= r.status_code < 500 and r.json()["error"]["message"], (i, r.text)

        live.wait_idle()
        assert live.engine_state(kv_is_free)
        m = _metrics(httpx.get(f"{live.url}/metrics").text)
        assert m[("specdec:requests_total", (("finish_reason", "abort"),))] == NUM_ABORTED
        finished = sum(v for (name, labels), v in m.items() if name == "specdec:requests_total")
        assert finished == NUM_VALID + NUM_ABORTED
        steps = m[("specdec:spec_verify_steps_total", ())]
        assert steps > 0 and 1.0 < m[("specdec:spec_accept_length", ())] <= SHAPE[0] + 1
        rates = [m[("specdec:spec_accept_rate", (("position", str(i)),))] for i in range(1, SHAPE[0] + 1)]
        assert 0 < rates[0] <= 1 and rates == sorted(rates, reverse=True)
        assert m[("specdec:spec_accept_length", ())] == pytest.approx(1 + sum(rates))
        # decode steps by shape: a fixed shape speculates in every decode step
        shape_steps = {dict(labels)["shape"]: v for (name, labels), v in m.items()
                       if name == "specdec:spec_shape_steps_total"}
        assert shape_steps.keys() == {"x".join(map(str, SHAPE))} and shape_steps["4x2x6"] > 0
        assert m[("specdec:num_running_reqs", ())] == 0 and m[("specdec:num_queue_reqs", ())] == 0
        assert m[("specdec:prompt_tokens_total", ())] >= sum(lengths)
        assert m[("specdec:step_time_seconds_count", ())] > 0


def test_non_streaming_client_that_leaves_is_aborted():
    target, draft = make_pair("EAGLE", "mixed", seed=5, max_position_embeddings=4096)
    with LiveServer(engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4))) as live:
        async def go():
            async with httpx.AsyncClient(base_url=live.url, timeout=0.3) as client:
                body = {"input_ids": [5, 6], "sampling_params": {"temperature": 0, "ignore_eos": True,
                                                                 "max_new_tokens": 4000}}
                with pytest.raises(httpx.ReadTimeout):
                    await client.post("/generate", json=body)

        asyncio.run(go())
        live.wait_idle()
        assert live.engine_state(kv_is_free)
        m = _metrics(httpx.get(f"{live.url}/metrics").text)
        assert m[("specdec:requests_total", (("finish_reason", "abort"),))] == 1
        assert m[("specdec:generation_tokens_total", ())] < 4000
