"""The prefix cache over HTTP: a second chat turn reports its cached prompt tokens in OpenAI's
``usage.prompt_tokens_details.cached_tokens`` and SGLang's ``meta_info.cached_tokens``, and
``/metrics`` reports the hit rate."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..e2e.helpers import engine, make_pair
from .live import GREEDY, CharTokenizer, LiveServer, kv_is_free


def _metric(text: str, name: str) -> float:
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_second_turn_reports_cached_tokens_and_metrics_the_hit_rate():
    target, draft = make_pair("EAGLE", "mixed", seed=2)
    with LiveServer(engine(target, draft, algorithm="EAGLE", shape=(3, 2, 6), tokenizer=CharTokenizer(),
                           page_size=4)) as live:
        messages = [{"role": "user", "content": "Tell me a story about a cat."}]
        body = {"messages": messages, "max_tokens": 10, "temperature": 0, "ignore_eos": True}
        first = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=60).json()
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "And a dog?"}]
        second = httpx.post(f"{live.url}/v1/chat/completions", json={**body, "messages": messages},
                            timeout=60).json()
        usage = second["usage"]
        # the first turn's prompt at least, in whole pages of 4
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert first["usage"]["prompt_tokens"] - 4 <= cached < usage["prompt_tokens"] and cached % 4 == 0

        ids = [1] + [5] * 21
        native = [httpx.post(f"{live.url}/generate", json={"input_ids": ids, "sampling_params": {
            **GREEDY, "max_new_tokens": 3}}, timeout=60).json() for _ in range(2)]
        assert [r["meta_info"]["cached_tokens"] for r in native] == [0, 20]
        assert native[0]["output_ids"] == native[1]["output_ids"]

        metrics = httpx.get(f"{live.url}/metrics").text
        assert 0 < _metric(metrics, "specdec:cache_hit_rate") < 1
        assert _metric(metrics, "specdec:cached_tokens_total") == cached + 20
        live.wait_idle()
        assert live.engine_state(kv_is_free)
