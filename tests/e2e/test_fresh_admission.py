"""Requests whose prompt the prefix cache holds but for its last token join the running requests'
decode step (``Request.fresh``: a plain step of their own part computes that token, as its prefill
would) instead of a prefill step that pauses them. Outputs equal an uncached plain engine's, and
the figures a request reports equal those of a request prefilled on its own."""

from __future__ import annotations

import pytest

from .helpers import assert_no_leak, engine, make_pair, prompts_of

GREEDY = {"temperature": 0, "ignore_eos": True}


def _admit_while_decoding(eng, running_prompt, prompts, params):
    """``running_prompt`` prefilled and decoding, then ``prompts`` added; run to the end. Returns the
    added requests and how many prefill steps ran after the first one's."""
    first = eng.make_request(input_ids=running_prompt, sampling_params={**GREEDY, "max_new_tokens": 40})
    eng.add_request(first)
    eng.step()  # its prefill
    eng.step()  # a decode step
    prefill_steps = eng.scheduler.prefill_steps
    reqs = [eng.make_request(input_ids=p, sampling_params=params) for p in prompts]
    for req in reqs:
        eng.add_request(req)
    while eng.scheduler.has_work:
        eng.step()
    assert first.finished and len(first.output_ids) == 40
    return reqs, eng.scheduler.prefill_steps - prefill_steps


def _cached_prompts_join(algorithm, overlap, *, cuda=False):
    target, draft = make_pair(algorithm or "EAGLE", "mixed", seed=6)
    vocab = target.config.vocab_size
    prompts = prompts_of([9, 14, 6], vocab, seed=3)
    running_prompt = prompts_of([11], vocab, seed=4)[0]
    params = {**GREEDY, "max_new_tokens": 12}
    device = {}
    if cuda:  # CUDA graphs: the fresh part replays the decode graph (and EAGLE's plain draft extend) at bs 3
        target, draft = target.cuda(), draft.cuda()
        device = dict(device="cuda", attention_backend="triton")
    expected = engine(target, **device).generate(input_ids=prompts, sampling_params=params)  # nothing cached
    kw = dict(overlap_schedule=overlap, **device)
    eng = engine(target, draft, algorithm=algorithm, shape=(3, 1, 4), **kw) if algorithm else engine(target, **kw)
    eng.generate(input_ids=prompts, sampling_params=params)  # the prompts go to the prefix cache
    reqs, prefills = _admit_while_decoding(eng, running_prompt, prompts, params)
    assert prefills == 0 and eng.scheduler.fresh_admissions == len(prompts)  # no step paused the first
    assert [r.output_ids for r in reqs] == [e["output_ids"] for e in expected]
    assert [r.cached_tokens for r in reqs] == [len(p) - 1 for p in prompts]
    if algorithm:  # the joined step is their prefill: every later step verified, as after a prefill
        for req in reqs:
            meta = req.result()["meta_info"]
            assert "plain" not in meta["spec_shapes"] and meta["spec_verify_ct"] == sum(meta["spec_shapes"].values())
            assert meta["spec_accept_length"] == len(req.output_ids) / req.spec_verify_ct
    assert_no_leak(eng)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algorithm", [None, "EAGLE", "EAGLE3"])
def test_cached_prompts_join_the_decode_step(algorithm, overlap):
    _cached_prompts_join(algorithm, overlap)


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", [None, "EAGLE3"])
def test_gpu_cached_prompts_join_the_decode_step(algorithm):
    """The same on the GPU, fp32, CUDA graphs and overlap on: equal to its plain decoding's."""
    _cached_prompts_join(algorithm, True, cuda=True)


def test_prompt_logprobs_and_an_idle_engine_still_prefill():
    """A request that wants prompt logprobs needs every prompt position's logits (a prefill step),
    and with nothing decoding there is no step to join."""
    target, _ = make_pair("EAGLE", "mixed", seed=7)
    prompts = prompts_of([10, 7], target.config.vocab_size, seed=8)
    params = {**GREEDY, "max_new_tokens": 6}
    eng = engine(target)
    eng.generate(input_ids=prompts, sampling_params=params)
    before = eng.scheduler.prefill_steps
    eng.generate(input_ids=prompts, sampling_params=params)  # idle engine: one prefill step
    assert eng.scheduler.prefill_steps == before + 1 and eng.scheduler.fresh_admissions == 0
    reqs, prefills = _admit_while_decoding(eng, prompts_of([5], 97, seed=9)[0], prompts,
                                           {**params, "return_logprob": True, "logprob_start_len": 0})
    assert prefills == 1 and eng.scheduler.fresh_admissions == 0
    assert all(len(r.input_logprobs) == len(p) for r, p in zip(reqs, prompts))
    assert_no_leak(eng)
