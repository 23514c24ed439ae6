"""The CUDA-graph code path on CPU: static buffers, padding to captured batch sizes, fixed-shape
draft extend, run eagerly (``use_graphs=False``) so CI proves it lossless without a GPU.

Captured sizes [2, 8] make every batch but bs 2 and 8 run padded (7 -> 8, 5 -> 8, 1 -> 2, ...).
The GPU tests replay the same path as real graphs (tests/e2e/test_gpu_cuda_graphs.py).
"""

import pytest

from specdec.forward import CaptureHiddenMode, ForwardMode

from ..builders import make_random_target, tiny_llama_config

from .helpers import assert_no_leak, engine, make_pair, prompts_of

SIZES = [2, 8]
LENGTHS, MAX_NEW = [1, 9, 4, 23, 2, 15, 6], [17, 5, 30, 12, 1, 24, 9]


def _params():
    return [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in MAX_NEW]


def _graph_calls(eng) -> dict[str, int]:
    calls = {f"target {mode.name.lower()}": g.num_calls for (mode, _, _), g in eng.runner.graphs.items()}
    if eng.worker is not None:
        calls["draft"] = eng.worker.draft_graph.runner.num_calls
        calls["draft extend"] = eng.worker.draft_extend_graph.runner.num_calls
    return calls


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("shape", [(3, 1, 4), (5, 4, 8)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_padded_static_path_is_lossless(algorithm, shape, page_size):
    target, draft = make_pair(algorithm, "mixed")
    prompts = prompts_of(LENGTHS, target.config.vocab_size)
    plain = engine(target, page_size=page_size)
    expected = plain.generate(input_ids=prompts, sampling_params=_params())
    spec = engine(target, draft, algorithm=algorithm, shape=shape, page_size=page_size)
    spec.capture_cuda_graphs(SIZES, use_graphs=False)
    got = spec.generate(input_ids=prompts, sampling_params=_params())
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    calls = _graph_calls(spec)
    assert calls["draft"] > 0 and calls["draft extend"] == calls["draft"] and calls["target target_verify"] == calls["draft"]
    assert_no_leak(spec)
    assert sum(sum(g["meta_info"]["spec_accept_lengths"]) for g in got) > 0


def test_plain_decode_graph_path_matches_eager():
    target, _ = make_pair("EAGLE", "random")
    prompts = prompts_of(LENGTHS, target.config.vocab_size, seed=1)
    expected = engine(target).generate(input_ids=prompts, sampling_params=_params())
    padded = engine(target)
    padded.capture_cuda_graphs(SIZES, use_graphs=False)
    got = padded.generate(input_ids=prompts, sampling_params=_params())
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert _graph_calls(padded)["target decode"] > 0
    assert_no_leak(padded)


def test_batches_past_the_largest_size_run_eagerly():
    target, draft = make_pair("EAGLE", "mixed")
    prompts = prompts_of(LENGTHS, target.config.vocab_size, seed=2)
    expected = engine(target).generate(input_ids=prompts, sampling_params=_params())
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4))
    spec.capture_cuda_graphs([1, 2], use_graphs=False)
    steps = []
    launch = spec.worker.launch_decode
    spec.worker.launch_decode = lambda *a, **kw: steps.append(len(a[0])) or launch(*a, **kw)
    got = spec.generate(input_ids=prompts, sampling_params=_params())
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert max(steps) > 2 and min(steps) <= 2
    assert _graph_calls(spec)["draft"] == sum(1 for bs in steps if bs <= 2)


def test_shutdown_releases_the_graphs_and_the_engine_runs_eagerly():
    """Engine.shutdown destroys every graph (target and draft) before a tensor-parallel teardown
    (NCCL waits on live graphs that captured its collectives); what runs afterwards is eager."""
    target, draft = make_pair("EAGLE", "mixed")
    prompts = prompts_of(LENGTHS, target.config.vocab_size, seed=4)
    expected = engine(target).generate(input_ids=prompts, sampling_params=_params())
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4))
    spec.capture_cuda_graphs(SIZES, use_graphs=False)
    runners = [*spec.runner.graphs.values(), spec.worker.draft_graph.runner, spec.worker.draft_extend_graph.runner]
    spec.shutdown()
    assert not spec.runner.graphs and spec.worker.draft_graph is None and spec.worker.draft_extend_graph is None
    assert spec.cuda_graph_bytes == 0 and all(not r.use_graphs and not r._graphs for r in runners)
    got = spec.generate(input_ids=prompts, sampling_params=_params())
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert sum(r.num_calls for r in runners) == 0
    assert_no_leak(spec)


def test_simulated_acceptance_commits_the_first_path():
    """--speculative-simulate-accept-length: accept lengths follow the drawn mean, KV stays sound."""
    target, draft = make_pair("EAGLE", "random")
    prompts = prompts_of([5] * 8, target.config.vocab_size, seed=3)
    params = {"temperature": 0, "max_new_tokens": 60, "ignore_eos": True}
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), speculative_simulate_accept_length=3.5)
    got = spec.generate(input_ids=prompts, sampling_params=[params] * 8)
    steps = sum(g["meta_info"]["spec_verify_ct"] for g in got)
    tokens = sum(len(g["output_ids"]) - 1 for g in got)  # the first token comes from prefill
    assert abs(tokens / steps - 3.5) < 0.35, tokens / steps  # 1 + Binomial(3, 5/6), ~110 steps
    assert_no_leak(spec)


def _piecewise_engine(algorithm, target, draft, **kw):
    if algorithm == "NGRAM":
        return engine(target, speculative_algorithm="NGRAM", speculative_num_draft_tokens=6, **kw)
    if algorithm == "STANDALONE":
        draft = make_random_target(tiny_llama_config(vocab_size=target.config.vocab_size, num_hidden_layers=1), 5)
    return engine(target, draft if algorithm else None, algorithm=algorithm, shape=(3, 1, 4), **kw)


@pytest.mark.parametrize("chunk", [None, 16], ids=["whole", "chunked16"])
@pytest.mark.parametrize("algorithm, hidden", [(None, "NULL"), ("EAGLE", "FULL"), ("EAGLE3", "FULL"),
                                               ("STANDALONE", "NULL"), ("NGRAM", "NULL")],
                         ids=["plain", "EAGLE", "EAGLE3", "STANDALONE", "NGRAM"])
def test_piecewise_prefill_path_is_lossless(algorithm, hidden, chunk):
    """Prefill forwards through the piecewise path (the body over padded static rows, attention
    between the pieces over the real rows) give the same tokens as eager prefills: whole prompts
    padded to 64 tokens, 16-token chunks (each after a cached prefix), a batch past 64 tokens eager.
    The pieces capture what the target's prefill captures for the worker (EAGLE: every hidden state)."""
    target, draft = make_pair("EAGLE3" if algorithm == "EAGLE3" else "EAGLE", "mixed")
    prompts = prompts_of(LENGTHS + [40, 31], target.config.vocab_size, seed=5)
    params = _params() + [{"temperature": 0, "max_new_tokens": 7, "ignore_eos": True}] * 2
    kw = dict(chunked_prefill_size=chunk) if chunk else {}
    expected = engine(target, **kw).generate(input_ids=prompts, sampling_params=params)
    spec = _piecewise_engine(algorithm, target, draft, **kw)
    spec.capture_prefill_graphs([8, 16, 24, 64], use_graphs=False)
    assert spec.runner.prefill_hidden == CaptureHiddenMode[hidden]
    forward, eager_tokens = spec.runner.model.forward, []
    spec.runner.model.forward = lambda batch: (batch.forward_mode == ForwardMode.EXTEND
                                               and eager_tokens.append(batch.num_tokens)) or forward(batch)
    got = spec.generate(input_ids=prompts[:7], sampling_params=params[:7])  # 60 prompt tokens: one padded prefill
    got += spec.generate(input_ids=prompts[7:], sampling_params=params[7:])  # 71 tokens whole, or chunks of 16
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert spec.runner.prefill_graphs.num_calls > 0
    assert eager_tokens == ([] if chunk else [71])
    assert_no_leak(spec)
