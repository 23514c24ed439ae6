"""Stop conditions inside accepted runs, aborts, KV leaks, and bad input."""

import pytest
import torch

from ..builders import make_random_eagle_head

from .helpers import assert_no_leak, engine, make_pair, prompts_of

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.mark.parametrize("shape", [(3, 1, 4), (5, 4, 8)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("page_size", [1, 16])
def test_stop_token_inside_accepted_run(shape, page_size):
    """With a perfect draft every step accepts S tokens, so stop tokens land mid-run."""
    target, draft = make_pair("EAGLE", "perfect")
    prompts = prompts_of([4, 9, 2], target.config.vocab_size, seed=3)
    plain = engine(target, page_size=page_size)
    free_run = plain.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 40})
    # stop at the 7th token of each request's free run (not a multiple of S + 1 = 4 or 6)
    stops = sorted({r["output_ids"][6] for r in free_run})
    params = {**GREEDY, "max_new_tokens": 40, "stop_token_ids": stops}
    expected = plain.generate(input_ids=prompts, sampling_params=params)
    spec = engine(target, draft, algorithm="EAGLE", shape=shape, page_size=page_size)
    got = spec.generate(input_ids=prompts, sampling_params=params)
    for e, g in zip(expected, got):
        assert g["output_ids"] == e["output_ids"]
        assert g["meta_info"]["finish_reason"] == "stop"
        assert g["output_ids"][-1] in stops
        assert not set(g["output_ids"][:-1]) & set(stops)
    assert_no_leak(spec)


def test_eos_from_config_stops_unless_ignored():
    target, draft = make_pair("EAGLE", "perfect")
    prompt = prompts_of([5], target.config.vocab_size, seed=1)[0]
    free = engine(target).generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 30})["output_ids"]
    eos = free[9]
    # the same seeded weights, now with that token as the model's EOS
    target, draft = make_pair("EAGLE", "perfect", eos_token_id=eos)
    spec = engine(target, draft, algorithm="EAGLE", shape=(5, 4, 8))
    stopped = spec.generate(input_ids=prompt, sampling_params={"temperature": 0, "max_new_tokens": 30})
    assert stopped["output_ids"] == free[: free.index(eos) + 1]
    assert stopped["meta_info"]["finish_reason"] == "stop"
    ignored = spec.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 30})
    assert ignored["output_ids"] == free
    assert_no_leak(spec)


@pytest.mark.parametrize("max_new", [0, 1, 2, 5])
def test_max_new_tokens_inside_accepted_run(max_new):
    target, draft = make_pair("EAGLE3", "perfect")
    prompts = prompts_of([6, 3], target.config.vocab_size)
    spec = engine(target, draft, algorithm="EAGLE3", shape=(6, 2, 9))
    out = spec.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": max_new})
    full = engine(target).generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 8})
    for o, f in zip(out, full):
        assert o["output_ids"] == f["output_ids"][:max_new]
        assert o["meta_info"]["finish_reason"] == "length"
    assert_no_leak(spec)


@pytest.mark.parametrize("page_size", [1, 16])
def test_abort_running_and_waiting_requests(page_size):
    target, draft = make_pair("EAGLE", "mixed")
    prompts = prompts_of([5, 11, 3, 8, 2], target.config.vocab_size, seed=9)
    params = {**GREEDY, "max_new_tokens": 30}
    expected = engine(target).generate(input_ids=prompts, sampling_params=params)
    spec = engine(target, draft, algorithm="EAGLE", shape=(4, 3, 8), page_size=page_size, max_running_requests=3)
    reqs = [spec.make_request(input_ids=p, sampling_params=params) for p in prompts]
    for r in reqs:
        spec.add_request(r)
    spec.step()  # prefill of the first three
    spec.step()  # one speculative step
    assert spec.abort(reqs[1].rid) is reqs[1]  # running
    assert spec.abort(reqs[4].rid) is reqs[4]  # still waiting
    assert spec.abort("no-such-request") is None
    while spec.scheduler.has_work:
        spec.step()
    for i in (0, 2, 3):
        assert reqs[i].output_ids == expected[i]["output_ids"]
    assert reqs[1].finish_reason.value == "abort" and reqs[4].finish_reason.value == "abort"
    assert_no_leak(spec)


def test_invalid_requests_are_rejected_and_engine_keeps_serving():
    target, draft = make_pair("EAGLE", "mixed")
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 2, 5), context_length=64)
    vocab = target.config.vocab_size
    good = prompts_of([6], vocab)[0]
    cases = [
        (dict(input_ids=list(range(3, 70))), "context length"),
        (dict(input_ids=good, sampling_params={"max_new_tokens": 60}), "context length"),
        (dict(input_ids=[vocab + 5]), "input_ids"),
        (dict(input_ids=[[]]), "input_ids"),
        (dict(input_ids=good, sampling_params={"temperature": -1}), "temperature"),
        (dict(input_ids=good, sampling_params={"top_p": 0}), "top_p"),
        (dict(input_ids=good, sampling_params={"bogus": 1}), "bogus"),
        (dict(prompt="text needs a tokenizer"), "tokenizer"),
    ]
    running = spec.make_request(input_ids=good, sampling_params={**GREEDY, "max_new_tokens": 12})
    spec.add_request(running)
    spec.step()
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            spec.generate(**kwargs)
    while spec.scheduler.has_work:
        spec.step()
    expected = engine(target).generate(input_ids=good, sampling_params={**GREEDY, "max_new_tokens": 12})
    assert running.output_ids == expected["output_ids"]
    assert_no_leak(spec)


def test_mismatched_draft_head_is_rejected():
    eagle_target, eagle_head = make_pair("EAGLE", "random")
    eagle3_target, eagle3_head = make_pair("EAGLE3", "random")
    with pytest.raises(ValueError, match="EAGLE3"):
        engine(eagle_target, eagle3_head, algorithm="EAGLE", shape=(3, 2, 5))
    with pytest.raises(ValueError, match="EAGLE-3"):
        engine(eagle_target, eagle_head, algorithm="EAGLE3", shape=(3, 2, 5))
    with pytest.raises(ValueError, match="draft-model-path"):
        from specdec.engine.engine import Engine

        Engine(target_model=eagle_target, speculative_algorithm="EAGLE")


def test_draft_head_of_another_target_is_rejected(tmp_path):
    from specdec.models.loaders import load_draft_head, save_draft_head
    from ..builders import make_random_target, tiny_llama_config

    other = make_random_target(tiny_llama_config(hidden_size=32, vocab_size=50), seed=5)
    save_draft_head(make_random_eagle_head(other, seed=6), tmp_path / "head")
    target, _ = make_pair("EAGLE", "random")
    with pytest.raises(ValueError, match="hidden_size|vocab_size"):
        load_draft_head(tmp_path / "head", target, dtype=torch.float32, device="cpu")
