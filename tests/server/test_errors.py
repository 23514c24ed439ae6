"""Bad input becomes a 4xx with a JSON {"error": {"message"}} naming the problem; nothing is queued."""

import asyncio

import httpx
import pytest

from ..e2e.helpers import engine, make_pair
from .live import GREEDY, LiveServer, kv_is_free

TOO_LONG = [5] * 600  # the tiny model's context is 512

CASES = [
    ("/generate", b"{not json", 400, "malformed JSON"),
    ("/generate", b"[1, 2]", 400, "must be an object"),
    ("/generate", {"sampling_params": GREEDY}, 400, "exactly one of text or input_ids"),
    ("/generate", {"text": "a", "input_ids": [3]}, 400, "exactly one of text or input_ids"),
    ("/generate", {"input_ids": "abc"}, 400, "input_ids"),
    ("/generate", {"input_ids": []}, 400, "input_ids"),
    ("/generate", {"input_ids": [3, 500]}, 400, "input_ids must be"),
    ("/generate", {"input_ids": [3], "sampling_params": {"temperature": -0.5}}, 400, "temperature"),
    ("/generate", {"input_ids": [3], "sampling_params": {"top_p": 0}}, 400, "top_p"),
    ("/generate", {"input_ids": [3], "sampling_params": {"max_new_tokens": "many"}}, 400, "max_new_tokens"),
    ("/generate", {"input_ids": [3], "sampling_params": {"bogus": 1}}, 400, "bogus"),
    ("/generate", {"input_ids": [3], "sampling_params": []}, 400, "sampling_params"),
    ("/generate", {"input_ids": TOO_LONG}, 400, "exceeds the context length"),
    ("/generate", {"input_ids": [[3, 4], TOO_LONG]}, 400, "prompt 1"),
    ("/generate", {"input_ids": [3], "sampling_params": {"max_new_tokens": 10**6}}, 400, "context length"),
    ("/generate", {"text": "hello"}, 400, "no tokenizer"),
    ("/v1/completions", {"model": "m"}, 400, "prompt is required"),
    ("/v1/completions", {"prompt": [3, 4], "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": TOO_LONG}, 400, "context length"),
    ("/v1/completions", {"prompt": [3, 4], "n": 17}, 400, "n"),
    ("/v1/completions", {"prompt": [3, 4], "stop": "x"}, 400, "tokenizer"),
    ("/v1/completions", {"prompt": [3, 4], "stop": [{}]}, 400, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 400, "no tokenizer"),
    # an unknown parameter is named, never silently ignored (a misspelt max_tokens would give 16)
    ("/v1/completions", {"prompt": [3, 4], "max_token": 64}, 400, "max_token"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temprature": 0}, 400, "temprature"),
    ("/generate", {"input_ids": [3], "max_new_tokens": 8}, 400, "max_new_tokens"),
    ("/abort_request", {"rid": "x", "all": True}, 400, "all"),
]


@pytest.fixture(scope="module")
def live():
    target, _ = make_pair("EAGLE", "random")
    server = LiveServer(engine(target))  # no tokenizer, no speculation
    yield server
    server.close()


def test_bad_requests_get_4xx_with_message(live):
    async def go():
        async with httpx.AsyncClient(base_url=live.url, timeout=30) as client:
            sent = [client.post(path, content=body) if isinstance(body, bytes) else client.post(path, json=body)
                    for path, body, _, _ in CASES]
            return await asyncio.gather(*sent, client.get("/nope"), client.get("/generate"))

    *responses, missing, wrong_method = asyncio.run(go())
    for (path, body, status, words), r in zip(CASES, responses):
        assert r.status_code == status, (path, body, r.text)
        error = r.json()["error"]
        assert words in error["message"] and error["code"] == status, (path, body, error)
    assert missing.status_code == 404 and "message" in missing.json()["error"]
    assert wrong_method.status_code == 405 and "message" in wrong_method.json()["error"]
    # none of them reached the scheduler, and the server still serves
    assert live.engine_state(kv_is_free)
    ok = httpx.post(f"{live.url}/generate", json={"input_ids": [3, 4], "sampling_params": {**GREEDY,
                                                                                          "max_new_tokens": 3}})
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 3 and "text" not in ok.json()
    assert httpx.get(f"{live.url}/health").status_code == 200
    live.wait_idle()
    assert live.engine_state(kv_is_free)


def test_engine_failure_fails_only_the_running_requests():
    target, _ = make_pair("EAGLE", "random", seed=1)
    eng = engine(target)
    real_step = eng.scheduler.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected failure")
        return real_step()

    eng.scheduler.step = flaky_step
    with LiveServer(eng) as live:
        body = {"input_ids": [3, 4, 5], "sampling_params": {**GREEDY, "max_new_tokens": 8}}
        failed = httpx.post(f"{live.url}/generate", json=body, timeout=30)
        assert failed.status_code == 500 and "internal engine error" in failed.json()["error"]["message"]
        again = httpx.post(f"{live.url}/generate", json=body, timeout=30)
        assert again.status_code == 200 and len(again.json()["output_ids"]) == 8
        assert httpx.get(f"{live.url}/health").status_code == 200
