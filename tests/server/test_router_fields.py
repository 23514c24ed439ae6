"""The fields sglang-router 0.3.2 adds to every request it forwards (``--dp-size``), captured from
the router: accepted at their no-op values, a 400 naming the field at any other."""

import httpx
import pytest

from ..e2e.helpers import engine, make_pair
from .live import LiveServer

GENERATE = {"model": None, "input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 4, "temperature": 0.0},
            "return_text_in_logprobs": False, "stream": False, "log_metrics": True, "return_hidden_states": False,
            "background": False, "no_logs": False, "return_bytes": False, "return_entropy": False}
COMPLETIONS = {"model": "x", "prompt": [3, 4, 5], "max_tokens": 4, "stream": False, "echo": False,
               "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True, "return_hidden_states": False}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "model": "x", "logprobs": False, "max_completion_tokens": 4,
        "stream": False, "no_stop_trim": False, "ignore_eos": False, "continue_final_message": False,
        "skip_special_tokens": True, "separate_reasoning": True, "stream_reasoning": True,
        "return_hidden_states": False}


@pytest.fixture(scope="module")
def live():
    target, _ = make_pair("EAGLE", "random")
    server = LiveServer(engine(target))  # no tokenizer
    yield server
    server.close()


def test_router_bodies_are_served(live):
    assert httpx.post(f"{live.url}/generate", json=GENERATE, timeout=30).status_code == 200
    assert httpx.post(f"{live.url}/v1/completions", json=COMPLETIONS, timeout=30).status_code == 200
    chat = httpx.post(f"{live.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert chat.status_code == 400 and "no tokenizer" in chat.json()["error"]["message"]  # not an unknown field


@pytest.mark.parametrize("path, body, field", [
    ("/generate", {**GENERATE, "return_hidden_states": True}, "return_hidden_states"),
    ("/generate", {**GENERATE, "model": "m"}, "model"),
    ("/v1/completions", {**COMPLETIONS, "no_stop_trim": True}, "no_stop_trim"),
    ("/v1/completions", {**COMPLETIONS, "skip_special_tokens": 0}, "skip_special_tokens"),
    ("/v1/chat/completions", {**CHAT, "continue_final_message": True}, "continue_final_message"),
])
def test_other_values_are_refused_by_name(live, path, body, field):
    r = httpx.post(f"{live.url}{path}", json=body, timeout=30)
    assert r.status_code == 400 and field in r.json()["error"]["message"]
