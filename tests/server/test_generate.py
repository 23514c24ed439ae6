"""Native /generate over real HTTP: lossless against offline plain greedy, streaming, text, stops."""

import asyncio
import threading
import time

import httpx
import pytest

from ..e2e.helpers import engine, make_pair, prompts_of
from .live import GREEDY, CharTokenizer, LiveServer, kv_is_free, post_stream

SHAPE = (5, 4, 8)  # the default EAGLE tree: (num_steps, topk, num_draft_tokens)


@pytest.fixture(scope="module")
def models():
    target, draft = make_pair("EAGLE", "mixed")
    plain = engine(target, tokenizer=CharTokenizer())
    return target, draft, plain


@pytest.fixture(scope="module")
def live(models):
    target, draft, _ = models
    server = LiveServer(engine(target, draft, algorithm="EAGLE", shape=SHAPE, tokenizer=CharTokenizer()))
    yield server
    server.close()


def test_served_greedy_equals_offline_plain_greedy(models, live):
    target, _, plain = models
    prompts = prompts_of([1, 5, 17, 40], target.config.vocab_size, seed=11)
    params = {**GREEDY, "max_new_tokens": 20}
    expected = plain.generate(input_ids=prompts, sampling_params=params)

    async def go():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            batch = client.post("/generate", json={"input_ids": prompts, "sampling_params": params})
            singles = [client.post("/generate", json={"input_ids": p, "sampling_params": params}) for p in prompts]
            return await asyncio.gather(batch, *singles)

    batch, *singles = asyncio.run(go())
    assert batch.status_code == 200
    for e, b, s in zip(expected, batch.json(), singles):
        assert b["output_ids"] == e["output_ids"] == s.json()["output_ids"]
        meta = b["meta_info"]
        assert meta["completion_tokens"] == 20 and meta["finish_reason"] == "length"
        assert meta["spec_verify_ct"] == len(meta["spec_accept_lengths"]) > 0
        assert meta["spec_accept_length"] == 20 / meta["spec_verify_ct"]
        assert b["text"] == CharTokenizer().decode(b["output_ids"])
    assert live.engine_state(kv_is_free)


def test_stream_equals_non_stream(models, live):
    target = models[0]
    prompt = prompts_of([9], target.config.vocab_size, seed=5)[0]
    body = {"input_ids": prompt, "sampling_params": {**GREEDY, "max_new_tokens": 30}}

    async def go():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            whole = (await client.post("/generate", json=body)).json()
            return whole, await post_stream(client, "/generate", {**body, "stream": True})

    whole, events = asyncio.run(go())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[-1]["output_ids"] == whole["output_ids"] and chunks[-1]["text"] == whole["text"]
    # the stream repeats the prompt: the prefix cache supplies all of it but the last token
    assert chunks[-1]["meta_info"] == whole["meta_info"] | {"id": chunks[-1]["meta_info"]["id"],
                                                            "cached_tokens": len(prompt) - 1}
    # cumulative, strictly growing; speculative steps commit several tokens in one chunk
    lens = [len(c["output_ids"]) for c in chunks]
    assert lens == sorted(set(lens)) and max(b - a for a, b in zip([0] + lens, lens)) > 1
    for c in chunks:
        assert whole["output_ids"][: len(c["output_ids"])] == c["output_ids"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    # one chunk per verify step (the first token comes from prefill)
    assert len(chunks) == whole["meta_info"]["spec_verify_ct"] + 1


def test_batch_stream_carries_index(models, live):
    target, _, plain = models
    prompts = prompts_of([4, 12], target.config.vocab_size, seed=8)
    params = [{**GREEDY, "max_new_tokens": 6}, {**GREEDY, "max_new_tokens": 11}]
    expected = plain.generate(input_ids=prompts, sampling_params=params)

    async def go():
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            return await post_stream(client, "/generate", {"input_ids": prompts, "sampling_params": params,
                                                           "stream": True})

    events = asyncio.run(go())
    assert events[-1] == "[DONE]"
    for i, e in enumerate(expected):
        mine = [c for c in events[:-1] if c["index"] == i]
        assert mine[-1]["output_ids"] == e["output_ids"]
        assert mine[-1]["meta_info"]["finish_reason"] == "length"


def test_text_prompt_and_stop_strings(models, live):
    _, _, plain = models
    tok = CharTokenizer()
    prompt = "Hello speculative world"
    free = plain.generate(prompt, {**GREEDY, "max_new_tokens": 24})
    text = free["text"]
    one, two = text[6], text[9:11]  # a one-token stop, and a two-token stop string

    async def go(stop):
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            body = {"text": prompt, "sampling_params": {**GREEDY, "max_new_tokens": 24, "stop": stop}}
            return (await client.post("/generate", json=body)).json(), \
                await post_stream(client, "/generate", {**body, "stream": True})

    same, _ = asyncio.run(go(None))
    assert same["output_ids"] == free["output_ids"] and same["text"] == text
    # one character: output_ids end with its token; the text leaves it out
    got, events = asyncio.run(go([one]))
    assert got["meta_info"]["finish_reason"] == "stop"
    assert got["text"] == text[: text.index(one)]
    assert got["output_ids"][-1] == tok.encode(one, add_bos=False)[0]
    assert events[-2]["text"] == got["text"]
    # several tokens: output_ids end with the token that completes it; the text is cut before it
    got, events = asyncio.run(go(two))
    cut = text[: text.index(two)]
    assert got["text"] == cut and got["meta_info"]["finish_reason"] == "stop"
    assert got["output_ids"] == free["output_ids"][: len(cut) + 2]
    assert all(two not in c["text"] for c in events[:-1]) and events[-2]["text"] == cut
    live.wait_idle()
    assert live.engine_state(kv_is_free)


def test_the_engine_loop_thread_binds_the_engines_device(models):
    """Triton launches on the thread's current CUDA device: the server's loop thread, not the one that
    built the engine, must take the engine's (a replica on cuda:1 failed every request otherwise)."""
    from specdec.server.async_engine import AsyncEngine

    _, _, plain = models
    bound = []
    plain.bind_thread = lambda: bound.append(threading.current_thread().name)
    try:
        loop = AsyncEngine(plain)
        loop.start()
        loop.stop()
    finally:
        del plain.bind_thread
    assert bound == ["specdec-engine"]


def test_a_stream_whose_event_loop_closed_is_aborted(models):
    """Nobody can read a stream whose event loop closed: its request is aborted (its KV freed), not run
    to its end."""
    from specdec.server.async_engine import AsyncEngine

    _, _, plain = models
    loop = AsyncEngine(plain)
    loop.start()
    try:
        async def submit():
            return await loop.submit(input_ids=[3, 4, 5], sampling_params={**GREEDY, "max_new_tokens": 400})

        asyncio.run(submit())  # that event loop closes with the request running
        deadline = time.monotonic() + 60
        while loop.on_engine(lambda e: e.scheduler.has_work).result(60):
            assert time.monotonic() < deadline, "the request was not aborted"
            time.sleep(0.01)
        assert kv_is_free(plain)
        tokens = next(float(line.split()[1]) for line in loop.metrics.render().decode().splitlines()
                      if line.startswith("specdec:generation_tokens_total "))
        assert tokens < 400, f"the request ran to its end ({tokens:.0f} tokens)"
    finally:
        loop.stop()
