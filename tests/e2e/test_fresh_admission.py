"""With ``--enable-decode-admission``, requests whose prompt the prefix cache holds but for its last
token join the running requests' decode step (``Request.fresh``: a plain step of their own part
computes that token, as its prefill would) instead of a prefill step that pauses them. Outputs equal
an uncached plain engine's, and the figures a request reports equal those of a request prefilled on
its own."""

from __future__ import annotations

import pytest
import torch

from specdec.cuda_graph.runner import CudaGraphRunner

from .helpers import assert_no_leak, engine, make_pair, prompts_of

GREEDY = {"temperature": 0, "ignore_eos": True}


def _admit_while_decoding(eng, running_prompts, prompts, params):
    """``running_prompts`` prefilled and decoding, then ``prompts`` added; run to the end. Returns the
    running requests, the added ones and how many prefill steps ran after the running ones'."""
    running = [eng.make_request(input_ids=p, sampling_params={**GREEDY, "max_new_tokens": 40})
               for p in running_prompts]
    for req in running:
        eng.add_request(req)
    eng.step()  # their prefill
    eng.step()  # a decode step
    prefill_steps = eng.scheduler.prefill_steps
    reqs = [eng.make_request(input_ids=p, sampling_params=params) for p in prompts]
    for req in reqs:
        eng.add_request(req)
    while eng.scheduler.has_work:
        eng.step()
    assert all(r.finished and len(r.output_ids) == 40 for r in running)
    return running, reqs, eng.scheduler.prefill_steps - prefill_steps


@pytest.fixture
def replay_memory(monkeypatch):
    """The padded static path of CUDA graphs run eagerly (``use_graphs=False``), its outputs handed back
    in memory the runner owns per padded size, overwritten by its next call of that size, as a graph's
    replay overwrites its outputs."""
    eager_call = CudaGraphRunner.__call__

    def call(self, bs, **kw):
        outputs = eager_call(self, bs, **kw)
        owned = self.__dict__.setdefault("_replay_memory", {})
        key = self.padded_size(bs)
        if key not in owned or any(o.shape != b.shape for o, b in zip(outputs, owned[key])):
            owned[key] = tuple(torch.empty_like(o) for o in outputs)
        for out, mem in zip(outputs, owned[key]):
            mem.copy_(out)
        return owned[key]

    monkeypatch.setattr(CudaGraphRunner, "__call__", call)


def _cached_prompts_join(algorithm, overlap, *, cuda=False, graph_sizes=None, threshold=None):
    target, draft = make_pair(algorithm or "EAGLE", "mixed", seed=6)
    vocab = target.config.vocab_size
    prompts = prompts_of([9, 14, 6], vocab, seed=3)
    # as many running requests as fresh ones: plain parts of one step replay the same graph size
    running_prompts = prompts_of([11, 8, 13], vocab, seed=4)
    params = {**GREEDY, "max_new_tokens": 12}
    running_params = {**GREEDY, "max_new_tokens": 40}
    device = {}
    if cuda:  # CUDA graphs: the fresh part replays the decode graph (and EAGLE's plain draft extend)
        target, draft = target.cuda(), draft.cuda()
        device = dict(device="cuda", attention_backend="triton", cuda_graph_max_bs=8)
    plain = engine(target, **device)  # nothing cached
    expected = plain.generate(input_ids=prompts, sampling_params=params)
    expected_running = plain.generate(input_ids=running_prompts, sampling_params=running_params)
    kw = dict(overlap_schedule=overlap, enable_decode_admission=True, **device)
    if threshold is not None:  # more requests than this decode plainly: every part replays the decode graph
        kw["speculative_batch_size_threshold"] = threshold
    eng = engine(target, draft, algorithm=algorithm, shape=(3, 1, 4), **kw) if algorithm else engine(target, **kw)
    if graph_sizes:
        eng.capture_cuda_graphs(graph_sizes, use_graphs=False)
    eng.generate(input_ids=prompts, sampling_params=params)  # the prompts go to the prefix cache
    running, reqs, prefills = _admit_while_decoding(eng, running_prompts, prompts, params)
    assert prefills == 0 and eng.scheduler.fresh_admissions == len(prompts)  # no step paused the running ones
    assert [r.output_ids for r in reqs] == [e["output_ids"] for e in expected]
    assert [r.output_ids for r in running] == [e["output_ids"] for e in expected_running]
    assert [r.cached_tokens for r in reqs] == [len(p) - 1 for p in prompts]
    if algorithm and threshold is None:  # the joined step is their prefill: later steps verified, as after one
        for req in reqs:
            meta = req.result()["meta_info"]
            assert "plain" not in meta["spec_shapes"] and meta["spec_verify_ct"] == sum(meta["spec_shapes"].values())
            assert meta["spec_accept_length"] == len(req.output_ids) / req.spec_verify_ct
    assert_no_leak(eng)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algorithm", [None, "EAGLE", "EAGLE3"])
def test_cached_prompts_join_the_decode_step(algorithm, overlap):
    _cached_prompts_join(algorithm, overlap)


@pytest.mark.parametrize("algorithm,threshold", [(None, None), ("EAGLE3", None), ("EAGLE3", 2)],
                         ids=["plain", "EAGLE3", "EAGLE3-above-threshold"])
def test_parts_of_one_step_replaying_one_graph(algorithm, threshold, replay_memory):
    """The running requests' part and the fresh part replay the same graph size in one step: each
    part's tokens outlive the next part's replay (the running ones' outputs equal plain decoding's)."""
    _cached_prompts_join(algorithm, True, graph_sizes=[1, 2, 3, 4], threshold=threshold)


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
    eng = engine(target, enable_decode_admission=True)
    eng.generate(input_ids=prompts, sampling_params=params)
    before = eng.scheduler.prefill_steps
    eng.generate(input_ids=prompts, sampling_params=params)  # idle engine: one prefill step
    assert eng.scheduler.prefill_steps == before + 1 and eng.scheduler.fresh_admissions == 0
    _, reqs, prefills = _admit_while_decoding(eng, prompts_of([5], 97, seed=9), prompts,
                                           {**params, "return_logprob": True, "logprob_start_len": 0})
    assert prefills == 1 and eng.scheduler.fresh_admissions == 0
    assert all(len(r.input_logprobs) == len(p) for r, p in zip(reqs, prompts))
    assert_no_leak(eng)


def test_off_by_default():
    """Without the flag such requests are prefilled, in a step of their own."""
    target, _ = make_pair("EAGLE", "mixed", seed=7)
    prompts = prompts_of([10, 7], target.config.vocab_size, seed=8)
    params = {**GREEDY, "max_new_tokens": 6}
    eng = engine(target)
    eng.generate(input_ids=prompts, sampling_params=params)
    _, reqs, prefills = _admit_while_decoding(eng, prompts_of([5], 97, seed=9), prompts, params)
    assert prefills == 1 and eng.scheduler.fresh_admissions == 0
    assert [r.cached_tokens for r in reqs] == [len(p) - 1 for p in prompts]
    assert_no_leak(eng)
