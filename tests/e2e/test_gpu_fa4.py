"""On the GPU with flash-attn-4: greedy speculative output equals plain greedy output with
``--attention-backend fa4``, under CUDA graphs (the default on CUDA) and eagerly, and graph replay
equals eager execution.

FA4 takes fp16/bf16 only, so the check is test_gpu_backends': outputs are equal, or at their first
difference both tokens are within bf16 noise of the best logit of an fp32 copy of the target
(decode, verify and extend run different kernel configurations, and the graphs plan split-KV from
a static bound). TARGET_VERIFY runs in tree mode "merge" (the default), and in "mask_mod" for a few
shapes.
"""

import pytest
import torch

from specdec.attention import available_backends
from specdec.attention import fa4_backend as fa4

from .helpers import assert_equal_or_near_tie, assert_no_leak, engine, make_pair, prompts_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (torch.cuda.is_available() and "fa4" in available_backends()), reason="needs CUDA and flash-attn-4")]

SHAPES = [(1, 1, 2), (3, 1, 4), (5, 4, 8), (6, 8, 32)]  # chains and trees
CASE_IDS = ["x".join(map(str, s)) for s in SHAPES]


@pytest.fixture
def tree_mode(request, monkeypatch):
    """The tree mode the registry's fa4 backend uses (parametrized indirectly; default "merge")."""
    mode = getattr(request, "param", "merge")
    monkeypatch.setattr(fa4.FA4Backend, "default_tree", mode)
    return mode


def _check(target, draft, algorithm, shape, prompts, params, **kw):
    plain = engine(target, **kw)
    expected = [e["output_ids"] for e in plain.generate(input_ids=prompts, sampling_params=params)]
    spec = engine(target, draft, algorithm=algorithm, shape=shape, **kw)
    got = [g["output_ids"] for g in spec.generate(input_ids=prompts, sampling_params=params)]
    assert_equal_or_near_tie(target, prompts, got, expected)
    assert_no_leak(spec)
    return plain, spec


TREE_RUNS = [(a, s, p, "merge") for a in ("EAGLE", "EAGLE3") for s in SHAPES for p in (1, 16)]
TREE_RUNS += [("EAGLE", (5, 4, 8), 16, "mask_mod"), ("EAGLE3", (6, 8, 32), 1, "mask_mod")]


@pytest.mark.parametrize("algorithm, shape, page_size, tree_mode", TREE_RUNS, indirect=["tree_mode"],
                         ids=[f"{a}-{'x'.join(map(str, s))}-p{p}-{t}" for a, s, p, t in TREE_RUNS])
def test_gpu_fa4_lossless_with_graphs(algorithm, shape, page_size, tree_mode):
    target, draft = make_pair(algorithm, "mixed", dtype=torch.bfloat16, head_dim=128)
    target, draft = target.cuda(), draft.cuda()
    prompts = prompts_of([1, 9, 4, 23, 2, 15, 6], target.config.vocab_size)
    params = [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in [17, 5, 30, 12, 1, 24, 9]]
    plain, spec = _check(target, draft, algorithm, shape, prompts, params, page_size=page_size, device="cuda",
                         attention_backend="fa4")
    # the four graphs ran: plain decode, draft loop, verify, draft extend
    assert plain.runner.graphs and all(g.num_calls > 0 for g in plain.runner.graphs.values())
    assert spec.worker.draft_graph.runner.num_calls > 0 and spec.worker.draft_extend_graph.runner.num_calls > 0
    assert any(g.num_calls > 0 for g in spec.runner.graphs.values() if g.name == "target target_verify")


@pytest.mark.parametrize("shape", [(5, 4, 8)], ids=["5x4x8"])
def test_gpu_fa4_lossless_eager_bs64(shape, tree_mode):
    """64 requests of varied prompt and output lengths, eagerly (graphs cover batch sizes 1-4 here)."""
    target, draft = make_pair("EAGLE3", "mixed", dtype=torch.bfloat16, head_dim=128)
    target, draft = target.cuda(), draft.cuda()
    prompts = prompts_of([1 + (7 * i) % 97 for i in range(64)], target.config.vocab_size, seed=5)
    params = [{"temperature": 0, "max_new_tokens": 1 + (5 * i) % 23, "ignore_eos": True} for i in range(64)]
    for page_size in (1, 16):
        _check(target, draft, "EAGLE3", shape, prompts, params, page_size=page_size, device="cuda",
               attention_backend="fa4", disable_cuda_graph=True, max_running_requests=64)


PADDED_RUNS = [(None, "merge"), ((3, 1, 4), "merge"), ((5, 4, 8), "merge"), ((5, 4, 8), "mask_mod")]


@pytest.mark.parametrize("shape, tree_mode", PADDED_RUNS, indirect=["tree_mode"],
                         ids=[f"{'plain' if s is None else 'x'.join(map(str, s))}-{t}" for s, t in PADDED_RUNS])
def test_gpu_fa4_graph_replay_matches_eager_at_padded_sizes(shape, tree_mode):
    """Captured sizes 1, 2, 4, 8, 16, 32, 64; batches of 3, 5, 40 and 64 replay (padded) graphs."""
    target, draft = make_pair("EAGLE3", "mixed", dtype=torch.bfloat16, head_dim=128)
    target, draft = target.cuda(), draft.cuda()
    kw = dict(device="cuda", attention_backend="fa4", disable_cuda_graph=True, max_running_requests=64, page_size=16)
    if shape is not None:
        kw.update(draft=draft, algorithm="EAGLE3", shape=shape)
    eager, graphs = engine(target, **kw), engine(target, **kw)
    graphs.capture_cuda_graphs([1, 2, 4, 8, 16, 32, 64])
    vocab = target.config.vocab_size
    for bs in (3, 5, 40, 64):
        prompts = prompts_of([3 + (5 * i) % 61 for i in range(bs)], vocab, seed=bs)
        params = [{"temperature": 0, "max_new_tokens": 4 + (3 * i) % 20, "ignore_eos": True} for i in range(bs)]
        got, expected = (e.generate(input_ids=prompts, sampling_params=params) for e in (graphs, eager))
        assert_equal_or_near_tie(target, prompts, [g["output_ids"] for g in got], [e["output_ids"] for e in expected])
    replayed = graphs.worker.draft_graph.runner if shape is not None else next(iter(graphs.runner.graphs.values()))
    assert replayed.num_calls > 0
    assert_no_leak(graphs)


@pytest.mark.parametrize("shape", [(3, 1, 4), (5, 4, 8)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_fa4_prefill_triton_decode_lossless_with_graphs(shape):
    """The hybrid pair the H100 measurements recommend: fa4 prefills, triton decodes and verifies."""
    target, draft = make_pair("EAGLE3", "mixed", dtype=torch.bfloat16, head_dim=128)
    target, draft = target.cuda(), draft.cuda()
    prompts = prompts_of([1, 9, 4, 23, 2, 15, 6], target.config.vocab_size)
    params = [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in [17, 5, 30, 12, 1, 24, 9]]
    plain, spec = _check(target, draft, "EAGLE3", shape, prompts, params, page_size=16, device="cuda",
                         attention_backend="triton", prefill_attention_backend="fa4")
    assert spec.runner.attn_backend.name == "fa4:triton"
    assert plain.runner.graphs and all(g.num_calls > 0 for g in plain.runner.graphs.values())
