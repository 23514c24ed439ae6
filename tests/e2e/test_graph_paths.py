"""The CUDA-graph code path on CPU: static buffers, padding to captured batch sizes, fixed-shape
draft extend, run eagerly (``use_graphs=False``) so CI proves it lossless without a GPU.

Captured sizes [2, 8] make every batch but bs 2 and 8 run padded (7 -> 8, 5 -> 8, 1 -> 2, ...).
The GPU tests replay the same path as real graphs (tests/e2e/test_gpu_cuda_graphs.py).
"""

import pytest
import torch

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
        calls["plain draft extend"] = eng.worker.plain_extend_graph.runner.num_calls
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
    runners = [*spec.runner.graphs.values(), *(g.runner for g in spec.worker.draft_graphs())]
    assert len(runners) == len(spec.runner.graphs) + 3  # the draft loop, the verified and the plain draft extends
    spec.shutdown()
    assert not spec.runner.graphs and spec.worker.draft_graphs() == []
    assert spec.cuda_graph_bytes == 0 and all(not r.use_graphs and not r._graphs for r in runners)
    got = spec.generate(input_ids=prompts, sampling_params=_params())
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert sum(r.num_calls for r in runners) == 0
    assert_no_leak(spec)


def _wide_plain_extend(worker, rows, seq_lens, seq_lens_cpu, next_ids, features, root_slots) -> None:
    """A plain step's draft extend as it ran before it had a graph of its own (issue #40), eagerly:
    the verified steps' S + 1 tokens a request, the committed one first, then padding that writes
    the draft's padding slot; the root expansion read at each request's first row and stored."""
    bs, width = len(rows), worker.config.num_steps + 1
    prefix, prefix_cpu = worker.inputs.draft_lens(seq_lens, seq_lens_cpu)
    tokens = torch.zeros(bs, width, dtype=torch.int64)
    tokens[:, 0] = next_ids
    slots = torch.full((bs, width), worker.pad_slot, dtype=torch.int64)
    # the committed token's slot: position seq_len's (a head), or the row's parking slot (standalone)
    slots[:, 0] = root_slots if worker.inputs.park_base < 0 else worker.inputs.park_base + rows
    root = worker.draft.extend(
        input_ids=tokens.flatten(),
        features=features.repeat_interleave(width, 0) if worker.inputs.needs_features else None,
        positions=(prefix[:, None] + torch.arange(width)).flatten(), out_cache_loc=slots.flatten(),
        req_pool_indices=rows, prefix_lens=prefix, extend_lens_cpu=[width] * bs, prefix_lens_cpu=prefix_cpu,
        output_rows=torch.arange(bs) * width)
    worker.state.store(rows, *root)


def _draft_memory(worker) -> list[torch.Tensor]:
    """The draft's state rows and KV slots, but the pad row and slot (padding requests write there)."""
    state, kv = worker.state, worker.draft_kv
    live_rows = torch.arange(state.pad_row)
    live_slots = torch.arange(kv.num_slots) != worker.pad_slot
    return [state.topk_p[live_rows].clone(), state.topk_index[live_rows].clone(), state.hidden[live_rows].clone(),
            kv.k[:, live_slots].clone(), kv.v[:, live_slots].clone()]


def _restore(worker, memory: list[torch.Tensor]) -> None:
    state, kv = worker.state, worker.draft_kv
    live_slots = torch.arange(kv.num_slots) != worker.pad_slot
    state.topk_p[: state.pad_row], state.topk_index[: state.pad_row], state.hidden[: state.pad_row] = memory[:3]
    kv.k[:, live_slots], kv.v[:, live_slots] = memory[3:]


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3", "STANDALONE"])
def test_plain_steps_extend_the_draft_one_row_a_request(algorithm, graphs):
    """Above the batch-size threshold steps decode plainly; each one's draft extend (its graph,
    padded to the captured sizes [2, 8] and run eagerly, or no graph at all) runs one row a request
    through the draft, and leaves the draft's state and KV cache as the S + 1-token extend plain
    steps ran before did (``_wide_plain_extend``, from the same memory); greedy output stays plain
    decoding's."""
    from .test_standalone import mixed_pair

    target, draft = mixed_pair() if algorithm == "STANDALONE" else make_pair(algorithm, "mixed")  # drafts right often
    prompts = prompts_of(LENGTHS, target.config.vocab_size, seed=7)
    expected = engine(target).generate(input_ids=prompts, sampling_params=_params())
    spec = engine(target, draft, algorithm=algorithm, shape=(3, 1, 4), speculative_batch_size_threshold=3)
    worker = spec.worker
    if graphs:
        spec.capture_cuda_graphs(SIZES, use_graphs=False)
        assert worker.plain_extend_graph.num_tokens_per_req == 1
        assert "num_committed" not in worker.plain_extend_graph.runner.inputs
    graph = worker.plain_extend_graph  # None: every plain step runs eagerly
    forwards = []  # (mode, rows, requests) of each draft forward
    model_forward = worker.draft.model.forward
    worker.draft.model.forward = lambda batch: forwards.append(
        (batch.forward_mode, batch.num_tokens, batch.batch_size)) or model_forward(batch)
    extend, checked = worker._draft_extend_plain, []

    def checked_extend(rows, seq_lens, seq_lens_cpu, next_ids, features, root_slots):
        before = _draft_memory(worker)
        _wide_plain_extend(worker, rows, seq_lens, seq_lens_cpu, next_ids, features, root_slots)
        wide = _draft_memory(worker)
        _restore(worker, before)
        forwards.clear()
        calls = graph.runner.num_calls if graph else 0
        extend(rows, seq_lens, seq_lens_cpu, next_ids, features, root_slots)
        bs = graph.runner.padded_size(len(rows)) if graph else len(rows)
        assert graph is None or graph.runner.num_calls == calls + 1
        assert forwards == [(ForwardMode.DRAFT_EXTEND, bs, bs)]  # one row a request (padding requests included)
        got = _draft_memory(worker)
        assert torch.equal(got[1], wide[1])  # the root children's ids
        for ours, theirs in zip(got, wide):
            torch.testing.assert_close(ours, theirs)
        checked.append(len(rows))

    worker._draft_extend_plain = checked_extend
    got = spec.generate(input_ids=prompts, sampling_params=_params())
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert checked and max(checked) > 3 and set(checked) - set(SIZES)  # padded plain steps too
    assert sum(sum(g["meta_info"]["spec_accept_lengths"]) for g in got) > 0  # speculative steps between them
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


@pytest.mark.parametrize("algorithm", [None, "EAGLE3"])
def test_one_token_prefills_replay_the_decode_graph(algorithm):
    """Prompts cached but for their last token prefill one token a request: the decode graph's forward,
    with the same outputs as eager decoding (and a speculative engine's as plain decoding)."""
    target, draft = make_pair("EAGLE3", "mixed")
    prompts = prompts_of(LENGTHS, target.config.vocab_size, seed=5)
    expected = engine(target).generate(input_ids=prompts, sampling_params=_params())
    eng = engine(target, draft, algorithm=algorithm, shape=(3, 1, 4)) if algorithm else engine(target)
    eng.capture_cuda_graphs(SIZES, use_graphs=False)
    replays = []
    replay = eng.runner._replay
    eng.runner._replay = lambda graph, batch: replays.append((batch.forward_mode, batch.num_tokens)) or replay(graph, batch)
    for _ in range(2):  # the second pass finds every prompt cached but for its last token
        replays.clear()
        got = eng.generate(input_ids=prompts, sampling_params=_params())
        assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    prefills = [tokens for mode, tokens in replays if mode == ForwardMode.EXTEND]
    assert sum(prefills) == len(prompts)  # each prompt's last token, through the decode graph
    if algorithm:  # the draft's prefill: the plain step's one-token draft extend (no plain step runs here)
        assert eng.worker.plain_extend_graph.runner.num_calls == len(prefills)
    assert [g["meta_info"]["cached_tokens"] for g in got] == [n - 1 for n in LENGTHS]
    assert_no_leak(eng)
