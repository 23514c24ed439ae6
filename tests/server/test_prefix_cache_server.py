"""The prefix cache over HTTP: a second chat turn reports its cached prompt tokens in OpenAI's
``usage.prompt_tokens_details.cached_tokens`` and SGLang's ``meta_info.cached_tokens`` (also when
the turn ended at a stop string), and ``/metrics`` reports the hit rate."""

from __future__ import annotations

import httpx
import pytest
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


def _stop_in(text: str) -> str:
    """A two-character string that first occurs at index 3 or later of ``text``."""
    return next(text[j:j + 2] for j in range(3, len(text) - 1) if text.index(text[j:j + 2]) == j)


def _expected_cached(ids: list[int], history: list[int], *, page: int) -> int:
    """Prompt tokens ``ids`` takes from a request whose KV covers ``history`` (its last token
    aside): the positions where they agree, one less (every engine keys by token pairs: an EAGLE
    head's KV there saw the next token), at least the last one computed, in whole pages."""
    agree = next((i for i, (a, b) in enumerate(zip(ids, history)) if a != b), min(len(ids), len(history)))
    return min(agree - 1, len(ids) - 1) // page * page


@pytest.mark.parametrize("algorithm, shape", [(None, None), ("EAGLE", (5, 4, 8)), ("EAGLE3", (4, 8, 32))],
                         ids=["plain", "eagle-5x4x8", "eagle3-4x8x32"])
@pytest.mark.parametrize("disable", [False, True], ids=["cache", "no-cache"])
def test_turns_cut_at_stop_strings_report_their_cached_prefix(algorithm, shape, disable):
    """Three turns, each ending at a two-character stop string (the engine drops the tokens a
    speculative step committed after it, and the server cuts the string from the text). Turn k's
    prompt is turn k - 1's, its kept text, and new text; it reports the prefix it shares with turn
    k - 1's KV (its prompt and output) in ``meta_info`` (/generate) and ``usage``
    (/v1/completions), and its text is the greedy reference's, cache on or off. Nothing holds KV
    afterwards."""
    tok = CharTokenizer()
    target, draft = make_pair(algorithm or "EAGLE", "mixed", seed=4)  # seed 2: EAGLE-3's text repeats "V4"
    reference = engine(target, disable_radix_cache=True)
    served = engine(target, draft if algorithm else None, algorithm=algorithm, shape=shape, tokenizer=tok,
                    page_size=4, disable_radix_cache=disable)
    ids, previous, history = tok.encode("Tell me a story about a cat."), [], None
    with LiveServer(served) as live:
        for turn, user in enumerate(["", " And a dog?", " And a fish!"]):
            ids = ids + tok.encode(user, add_bos=False)
            free = reference.generate(input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": 30})
            text = tok.decode(free["output_ids"])
            stop = _stop_in(text)
            kept = text[: text.index(stop)]
            if turn % 2 == 0:
                got = httpx.post(f"{live.url}/generate", json={"input_ids": ids, "sampling_params": {
                    **GREEDY, "max_new_tokens": 30, "stop": stop}}, timeout=60).json()
                got_text, meta, out_ids = got["text"], got["meta_info"], got["output_ids"]
            else:
                got = httpx.post(f"{live.url}/v1/completions", json={
                    "prompt": ids, "max_tokens": 30, "temperature": 0, "ignore_eos": True, "stop": [stop]},
                    timeout=60).json()
                meta = got["choices"][0]
                got_text, out_ids = meta["text"], meta["token_ids"]
                meta["cached_tokens"] = got["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert got_text == kept and meta["finish_reason"] == "stop"
            assert out_ids == free["output_ids"][: len(kept) + 2]  # the output ends with the stop string
            want = 0 if disable or history is None else _expected_cached(ids, history, page=4)
            assert meta["cached_tokens"] == want
            assert disable or history is None or want >= len(previous) // 4 * 4  # the history's prompt at least
            previous, history = ids, ids + out_ids
            ids = ids + tok.encode(kept, add_bos=False)
        live.wait_idle()
        assert live.engine_state(kv_is_free)


def test_flush_cache_frees_the_cached_pages_and_the_next_request_recomputes():
    """SGLang's /flush_cache (GET or POST): the cached pages go back to the pool, the next turn
    finds nothing cached, and its output is the same."""
    target, draft = make_pair("EAGLE", "mixed", seed=2)
    with LiveServer(engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), page_size=4)) as live:
        body = {"input_ids": [1] + [7] * 21, "sampling_params": {**GREEDY, "max_new_tokens": 3}}
        first = httpx.post(f"{live.url}/generate", json=body, timeout=60).json()
        live.wait_idle()
        cached = live.engine_state(lambda e: e.cache_stats()["cached_pages"])
        assert cached > 0
        for method in ("POST", "GET"):
            r = httpx.request(method, f"{live.url}/flush_cache", timeout=60)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            assert r.text == f"Cache flushed: {cached if method == 'POST' else 0} page(s) freed.\n"
        assert live.engine_state(lambda e: e.cache_stats()["cached_pages"]) == 0
        again = httpx.post(f"{live.url}/generate", json=body, timeout=60).json()
        assert again["meta_info"]["cached_tokens"] == 0 and again["output_ids"] == first["output_ids"]
        live.wait_idle()
        assert live.engine_state(kv_is_free)
