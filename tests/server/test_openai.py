"""OpenAI-compatible endpoints: response shapes, streaming chunks, usage, chat template, stops."""

import itertools

import pytest

from ..e2e.helpers import engine, make_pair, prompts_of
from .live import GREEDY, CharTokenizer, LiveServer, post_stream


@pytest.fixture(scope="module")
def setup():
    target, draft = make_pair("EAGLE", "mixed", seed=2)
    plain = engine(target, tokenizer=CharTokenizer())
    server = LiveServer(engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), tokenizer=CharTokenizer()),
                        model_name="tiny-eagle")
    yield target, plain, server
    server.close()



def test_completions_shape_and_lossless(setup):
    target, plain, server = setup
    ids = prompts_of([7], target.config.vocab_size, seed=3)[0]
    expected = plain.generate(input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": 12})
    body = {"model": "tiny-eagle", "prompt": ids, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    out = server.with_client(lambda c: c.post("/v1/completions", json=body)).json()
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-") and out["model"] == "tiny-eagle"
    assert isinstance(out["created"], int)
    (choice,) = out["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None and choice["finish_reason"] == "length"
    assert choice["token_ids"] == expected["output_ids"] and choice["text"] == expected["text"]
    assert out["usage"] == {"prompt_tokens": 7, "completion_tokens": 12, "total_tokens": 19,
                            "prompt_tokens_details": {"cached_tokens": 0}}


def test_completions_batch_and_default_max_tokens(setup):
    _, plain, server = setup
    out = server.with_client(lambda c: c.post("/v1/completions", json={"prompt": ["One", "Two two"], "temperature": 0,
                                                                 "ignore_eos": True})).json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for c, p in zip(out["choices"], ["One", "Two two"]):
        assert c["text"] == plain.generate(p, {**GREEDY, "max_new_tokens": 16})["text"]  # OpenAI's default 16
    assert out["usage"]["completion_tokens"] == 32


def test_completions_stream_deltas_concatenate(setup):
    _, _, server = setup
    body = {"prompt": "Streaming", "max_tokens": 20, "temperature": 0, "ignore_eos": True}

    async def both(c):
        whole = (await c.post("/v1/completions", json=body)).json()
        events = await post_stream(c, "/v1/completions", {**body, "stream": True,
                                                          "stream_options": {"include_usage": True}})
        return whole, events

    whole, events = server.with_client(both)
    assert events[-1] == "[DONE]"
    usage, chunks = events[-2], events[:-2]
    # the same prompt again: the prefix cache supplies all of it but the last token
    cached = {"cached_tokens": whole["usage"]["prompt_tokens"] - 1}
    assert usage["choices"] == [] and usage["usage"] == {**whole["usage"], "prompt_tokens_details": cached}
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert sum((c["choices"][0]["token_ids"] for c in chunks), []) == whole["choices"][0]["token_ids"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_chat_fallback_template_shape_and_stream(setup):
    _, plain, server = setup
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text",
                                                                                           "text": "Hi!"}]}]
    rendered = "system: Be brief.\nuser: Hi!\nassistant:"  # the documented fallback template
    expected = plain.generate(rendered, {**GREEDY, "max_new_tokens": 10})
    body = {"model": "x", "messages": messages, "max_tokens": 10, "temperature": 0, "ignore_eos": True}

    async def both(c):
        return (await c.post("/v1/chat/completions", json=body)).json(), \
            await post_stream(c, "/v1/chat/completions", {**body, "stream": True})

    out, events = server.with_client(both)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    (choice,) = out["choices"]
    assert choice["message"] == {"role": "assistant", "content": expected["text"]}
    assert choice["finish_reason"] == "length"
    assert out["usage"]["prompt_tokens"] == len(CharTokenizer().encode(rendered))
    chunks = events[:-1]
    assert events[-1] == "[DONE]" and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == expected["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_stop_strings_and_ids(setup):
    _, plain, server = setup
    text = plain.generate("Stop", {**GREEDY, "max_new_tokens": 20})["text"]
    stop = text[5:8]
    body = {"prompt": "Stop", "max_tokens": 20, "temperature": 0, "ignore_eos": True, "stop": [stop]}

    async def both(c):
        return (await c.post("/v1/completions", json=body)).json(), \
            await post_stream(c, "/v1/completions", {**body, "stream": True})

    out, events = server.with_client(both)
    assert out["choices"][0]["text"] == text[: text.index(stop)]
    assert out["choices"][0]["finish_reason"] == "stop"
    streamed = "".join(c["choices"][0]["text"] for c in events[:-1])
    assert streamed == out["choices"][0]["text"]


def test_model_info_and_models(setup):
    _, _, server = setup

    async def both(c):
        return (await c.get("/get_model_info")).json(), (await c.get("/v1/models")).json()

    info, models = server.with_client(both)
    assert info["speculative_algorithm"] == "EAGLE" and info["is_generation"] is True
    assert info["context_length"] == 512 and info["vocab_size"] == 97
    assert models["data"][0]["id"] == "tiny-eagle"


def test_stream_interval_chunks_wait_for_that_many_tokens(setup):
    """--stream-interval 4 (plain decoding, a token a step): the first token goes at once, then chunks of 4,
    the end with what is left; the same ids and text as one whole answer."""
    target, _, _ = setup
    body = {"prompt": "Interval", "max_tokens": 14, "temperature": 0, "ignore_eos": True}
    with LiveServer(engine(target, tokenizer=CharTokenizer()), stream_interval=4) as server:
        async def both(c):
            return (await c.post("/v1/completions", json=body)).json(), \
                await post_stream(c, "/v1/completions", {**body, "stream": True})

        whole, events = server.with_client(both)
    chunks = [e["choices"][0] for e in events[:-1]]
    # the engine's Events carry 1, 4, 4, 4, 1 tokens; a reader that lags joins neighbours into one chunk
    ends = list(itertools.accumulate(len(c["token_ids"]) for c in chunks))
    assert set(ends) <= {1, 5, 9, 13, 14} and ends[-1] == 14 and len(chunks) >= 2
    assert sum((c["token_ids"] for c in chunks), []) == whole["choices"][0]["token_ids"]
    assert "".join(c["text"] for c in chunks) == whole["choices"][0]["text"]


def test_stream_interval_flag_is_checked():
    from specdec.server.settings import ServerSettings

    with pytest.raises(ValueError, match="--stream-interval=0"):
        ServerSettings(stream_interval=0)
