"""Stop strings over HTTP, plain and speculative (EAGLE chain and tree, EAGLE-3 tree), greedy.

The engine ends a request with the token that completes a stop string. Each stop string here is
chosen so that, when speculating, the step that completes it commits tokens after it: those are
dropped from ``output_ids``, the logprobs and ``completion_tokens``, and the text is cut before the
stop string. Streaming sends nothing past the stop and ends where the non-streamed answer does;
``meta_info`` carries the accept statistics of a normal finish; nothing holds KV afterwards.
"""

from __future__ import annotations

import httpx
import pytest

from ..e2e.helpers import engine, make_pair
from .live import GREEDY, CharTokenizer, LiveServer, kv_is_free, post_stream

TOK = CharTokenizer()
MAX_NEW = 40
NEVER = "#never#"  # a second stop string, which the outputs here do not contain


@pytest.fixture(scope="module", params=[(None, None), ("EAGLE", (3, 1, 4)), ("EAGLE", (5, 4, 8)),
                                        ("EAGLE3", (4, 8, 32))],
                ids=["plain", "eagle-3x1x4", "eagle-5x4x8", "eagle3-4x8x32"])
def live(request):
    algorithm, shape = request.param
    target, draft = make_pair(algorithm or "EAGLE", "mixed", seed=4)
    with LiveServer(engine(target, draft if algorithm else None, algorithm=algorithm, shape=shape,
                           tokenizer=TOK)) as server:
        yield server



def _free_run(live: LiveServer, text: str) -> dict:
    body = {"text": text, "sampling_params": {**GREEDY, "max_new_tokens": MAX_NEW}, "return_logprob": True}
    free = httpx.post(f"{live.url}/generate", json=body, timeout=60).json()
    assert NEVER not in free["text"]
    return free


def _cut(free: dict) -> tuple[str, int, str]:
    """(stop, end, kept): a two-character stop string, first found in the free run's text at the
    end of token ``end``'s text, and the text before it. Token ``end`` is one that a speculative
    step committed with more tokens after it: token 0 comes from the prefill and verify step i
    commits k_i + 1 tokens, so its last one is token sum_{j <= i} (k_j + 1). The stop string's two
    characters are the texts of tokens end - 1 and end (ids 0-2 decode to nothing)."""
    ids, ks = free["output_ids"], free["meta_info"]["spec_accept_lengths"]
    text = TOK.decode(ids)
    step_ends = {sum(k + 1 for k in ks[:i + 1]) for i in range(len(ks))}
    for end in range(4, len(ids) - 1):
        stop_end = len(TOK.decode(ids[: end + 1]))
        stop = text[stop_end - 2: stop_end]
        if min(ids[end - 1: end + 1]) >= 3 and text.find(stop) == stop_end - 2 and end not in step_ends:
            return stop, end, text[: stop_end - 2]
    raise AssertionError(f"no stop string is completed inside a step: accept lengths {ks}")


def _check_native(out: dict, free: dict, stop: str, end: int, kept: str) -> None:
    """A /generate answer cut at ``stop``, completed by token ``end`` of the free run."""
    ids, meta, free_meta = out["output_ids"], out["meta_info"], free["meta_info"]
    assert ids == free["output_ids"][: end + 1]  # it ends with the token that completes the stop string
    assert out["text"] == kept and TOK.decode(ids) == kept + stop
    assert meta["finish_reason"] == "stop" and meta["completion_tokens"] == len(ids)
    assert [t for _, t, _ in meta["output_token_logprobs"]] == ids
    assert [lp for lp, _, _ in meta["output_token_logprobs"]] == pytest.approx(
        [lp for lp, _, _ in free_meta["output_token_logprobs"][: end + 1]], abs=1e-5)
    assert len(meta["output_top_logprobs"]) == len(ids)
    ks = meta["spec_accept_lengths"]
    assert meta["spec_verify_ct"] == len(ks)
    if not free_meta["spec_accept_lengths"]:
        assert ks == [] and "spec_accept_length" not in meta
        return
    # the verifier's decisions up to the step that completed the stop string, that step included
    assert 0 < len(ks) and ks == free_meta["spec_accept_lengths"][: len(ks)]
    assert sum(k + 1 for k in ks[:-1]) < end < sum(k + 1 for k in ks)  # its later tokens were dropped
    assert meta["spec_accept_length"] == len(ids) / len(ks)


def test_generate_ends_with_the_token_that_completes_the_stop_string(live):
    prompt = "Tell me a story about a cat."
    free = _free_run(live, prompt)
    stop, end, kept = _cut(free)
    body = {"text": prompt, "sampling_params": {**GREEDY, "max_new_tokens": MAX_NEW, "stop": [NEVER, stop]},
            "return_logprob": True, "top_logprobs_num": 2}

    async def both(c):
        whole = (await c.post("/generate", json=body)).json()
        return whole, await post_stream(c, "/generate", {**body, "stream": True})

    out, events = live.with_client(both)
    _check_native(out, free, stop, end, kept)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    last = chunks[-1]
    assert last["output_ids"] == out["output_ids"] and last["text"] == out["text"]
    assert last["meta_info"] == out["meta_info"] | {k: last["meta_info"][k] for k in ("id", "cached_tokens")}
    for c in chunks:  # nothing past the stop, and no stop string in the text, at any time
        assert out["output_ids"][: len(c["output_ids"])] == c["output_ids"]
        assert stop not in c["text"] and out["text"].startswith(c["text"])
        assert len(c["meta_info"]["output_token_logprobs"]) == len(c["output_ids"])
        assert c["meta_info"]["completion_tokens"] == len(c["output_ids"])
    live.wait_idle()
    assert live.engine_state(kv_is_free)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_openai_usage_and_logprobs_end_at_the_stop(live, chat):
    content = "Tell me a story about a dog."
    prompt = f"user: {content}\nassistant:" if chat else content  # the fallback chat template
    free = _free_run(live, prompt)
    stop, end, kept = _cut(free)
    ids = free["output_ids"][: end + 1]
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"max_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True, "stop": [stop, NEVER],
            **({"messages": [{"role": "user", "content": content}], "logprobs": True, "top_logprobs": 2}
               if chat else {"prompt": prompt, "logprobs": 2})}

    async def both(c):
        whole = (await c.post(path, json=body)).json()
        return whole, await post_stream(c, path, {**body, "stream": True, "stream_options": {"include_usage": True}})

    whole, events = live.with_client(both)
    (choice,) = whole["choices"]
    assert (choice["message"]["content"] if chat else choice["text"]) == kept
    assert choice["token_ids"] == ids and choice["finish_reason"] == "stop"
    assert whole["usage"]["completion_tokens"] == len(ids)
    n_logprobs = len(choice["logprobs"]["content"]) if chat else len(choice["logprobs"]["tokens"])
    assert n_logprobs == len(ids)

    assert events[-1] == "[DONE]"
    usage, chunks = events[-2], [c for c in events[:-2] if c["choices"]]
    deltas = [c["choices"][0] for c in chunks]
    texts = [d["delta"].get("content", "") if chat else d["text"] for d in deltas]
    assert "".join(texts) == kept  # no text past the stop, nor the stop string itself
    assert sum((d.get("token_ids", []) for d in deltas), []) == ids  # no token past the stop
    for d in deltas:
        if d.get("logprobs") is not None:
            lps = d["logprobs"]["content"] if chat else d["logprobs"]["tokens"]
            assert len(lps) == len(d["token_ids"])
    assert deltas[-1]["finish_reason"] == "stop"
    assert usage["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"] == len(ids)
    assert usage["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    live.wait_idle()
    assert live.engine_state(kv_is_free)


def test_min_tokens_holds_back_a_stop_string_completed_before_it(live):
    """OpenAI's min_tokens (SGLang's min_new_tokens): a stop string completed within the first
    min_tokens - 1 tokens neither ends the request nor cuts the text, streamed or not; the next one
    after it does."""
    prompt = "Tell me a story about a bird."
    free = _free_run(live, prompt)
    stop, end, _ = _cut(free)
    ids, text = free["output_ids"], TOK.decode(free["output_ids"])
    skipped_end = len(TOK.decode(ids[: end + 1]))  # the first occurrence ends here: min_tokens skips it
    nxt = text.find(stop, skipped_end - len(stop) + 1)
    if nxt < 0:  # runs to max_tokens
        expect_ids, expect_text = ids, text
    else:
        last = next(k for k in range(len(ids)) if len(TOK.decode(ids[: k + 1])) >= nxt + len(stop))
        expect_ids, expect_text = ids[: last + 1], text[:nxt]
    assert stop in expect_text  # the skipped occurrence stays in the text
    body = {"prompt": prompt, "max_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True,
            "stop": [stop], "min_tokens": end + 2}

    async def both(c):
        whole = (await c.post("/v1/completions", json=body)).json()
        return whole, await post_stream(c, "/v1/completions", {**body, "stream": True})

    whole, events = live.with_client(both)
    (choice,) = whole["choices"]
    assert choice["text"] == expect_text and choice["token_ids"] == expect_ids
    assert choice["finish_reason"] == ("length" if nxt < 0 else "stop")
    deltas = [c["choices"][0] for c in events[:-1] if c.get("choices")]
    assert "".join(d["text"] for d in deltas) == expect_text
    live.wait_idle()
    assert live.engine_state(kv_is_free)
