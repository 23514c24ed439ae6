"""On the GPU: greedy speculative output equals plain greedy output with the flashinfer and fa3
backends (test_gpu_lossless's check, for the backends that run only in fp16/bf16).

FlashInfer and FlashAttention take fp16/bf16 and head_dim 64/128/256, so the tiny models here have
head_dim 128 (4 query heads, 2 KV heads: GQA), not test_gpu_lossless's fp32 and head_dim 16. As for
Triton in bf16 there, decode and verify run different kernels (decode kernel vs prefill kernel with
a tree mask, or one causal call vs two prefix/tree calls merged by log-sum-exp), so a near-tie may
round either way: outputs are equal, or at their first difference both tokens are within bf16
noise of the best logit of an fp32 copy of the target. (Not "the fp32 top 2": these tiny models'
logits are flat, and three-way near-ties were seen with the modelled FA3 kernel on CPU.)
"""

import pytest
import torch

from specdec.attention import available_backends

from .helpers import assert_equal_or_near_tie, assert_no_leak, engine, make_pair, prompts_of

pytestmark = pytest.mark.gpu

BACKENDS = [b for b in ("flashinfer", "fa3") if b in available_backends()]
# (backend, CUDA graphs): FlashInfer also runs captured (planned on the host before each replay)
RUNS = [(b, False) for b in BACKENDS] + [(b, True) for b in BACKENDS if b == "flashinfer"]
NO_GRAPHS = {"disable_cuda_graph": True}
CASES = [  # (algorithm, kind, (num_steps, topk, num_draft_tokens), dtype)
    ("EAGLE", "mixed", (1, 1, 2), torch.bfloat16),
    ("EAGLE", "mixed", (5, 4, 8), torch.bfloat16),
    ("EAGLE", "mixed", (6, 10, 60), torch.bfloat16),
    ("EAGLE3", "mixed", (3, 1, 4), torch.bfloat16),
    ("EAGLE3", "mixed", (4, 8, 32), torch.bfloat16),
    ("EAGLE", "mixed", (5, 4, 8), torch.float16),
    ("EAGLE3", "mixed", (6, 10, 60), torch.float16),
    ("EAGLE", "perfect", (5, 4, 8), torch.bfloat16),  # every draft token accepted
]


@pytest.mark.parametrize("backend, graphs", RUNS, ids=[f"{b}{'-graphs' if g else ''}" for b, g in RUNS])
@pytest.mark.parametrize("algorithm, kind, shape, dtype", CASES,
                         ids=[f"{a}-{k}-{'x'.join(map(str, s))}-{str(d)[6:]}" for a, k, s, d in CASES])
def test_gpu_lossless(backend, graphs, algorithm, kind, shape, dtype):
    target, draft = make_pair(algorithm, kind, dtype=dtype, head_dim=128)
    target, draft = target.to("cuda"), draft.to("cuda")
    prompts = prompts_of([1, 9, 4, 23, 2, 15, 6], target.config.vocab_size)
    params = [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in [17, 5, 30, 12, 1, 24, 9]]
    for page_size in (1, 16):
        kw = dict(page_size=page_size, device="cuda", attention_backend=backend, **({} if graphs else NO_GRAPHS))
        plain = engine(target, **kw)
        expected = plain.generate(input_ids=prompts, sampling_params=params)
        spec = engine(target, draft, algorithm=algorithm, shape=shape, **kw)
        got = spec.generate(input_ids=prompts, sampling_params=params)
        got_ids, expected_ids = [g["output_ids"] for g in got], [e["output_ids"] for e in expected]
        assert_equal_or_near_tie(target, prompts, got_ids, expected_ids)
        if graphs:  # the graphs ran, and plain decoding through them matches eager FlashInfer
            assert all(g.num_calls > 0 for g in plain.runner.graphs.values())
            assert spec.worker.draft_graph.runner.num_calls > 0 and spec.worker.draft_extend_graph.runner.num_calls > 0
            assert spec.runner.graphs and all(g.num_calls > 0 for g in spec.runner.graphs.values()
                                              if g.name == "target target_verify")
            eager = engine(target, **{**kw, **NO_GRAPHS}).generate(input_ids=prompts, sampling_params=params)
            assert_equal_or_near_tie(target, prompts, expected_ids, [e["output_ids"] for e in eager])
        if kind == "perfect":  # full depth, up to a near-tie rounded the other way
            accepted = [k for g in got for k in g["meta_info"]["spec_accept_lengths"]]
            assert max(accepted) == shape[0] and sum(accepted) >= 0.9 * shape[0] * len(accepted)
        assert_no_leak(spec)


@pytest.mark.skipif("flashinfer" not in BACKENDS, reason="flashinfer not installed")
@pytest.mark.parametrize("shape", [None, (3, 1, 4), (5, 4, 8)], ids=lambda s: "plain" if s is None else "x".join(map(str, s)))
def test_flashinfer_graph_replay_matches_eager_at_padded_sizes(shape):
    """Captured sizes 1, 2, 4, 8; batches of 3 and 5 replay padded graphs, whose padding sequences
    FlashInfer plans with an empty prefix. bf16, so: equal, or a near-tie rounded the other way."""
    target, draft = make_pair("EAGLE3", "mixed", dtype=torch.bfloat16, head_dim=128)
    target, draft = target.cuda(), draft.cuda()
    kw = dict(device="cuda", attention_backend="flashinfer", disable_cuda_graph=True)
    if shape is not None:
        kw.update(draft=draft, algorithm="EAGLE3", shape=shape)
    eager, graphs = engine(target, **kw), engine(target, **kw)
    graphs.capture_cuda_graphs([1, 2, 4, 8])
    vocab = target.config.vocab_size
    for bs in (3, 5, 8):
        prompts = prompts_of([3 + 5 * i for i in range(bs)], vocab, seed=bs)
        params = [{"temperature": 0, "max_new_tokens": 12 + 3 * i, "ignore_eos": True} for i in range(bs)]
        got, expected = (e.generate(input_ids=prompts, sampling_params=params) for e in (graphs, eager))
        assert_equal_or_near_tie(target, prompts, [g["output_ids"] for g in got], [e["output_ids"] for e in expected])
    replayed = graphs.worker.draft_graph.runner if shape is not None else graphs.runner.graphs[next(iter(graphs.runner.graphs))]
    assert replayed.num_calls > 0
    assert_no_leak(graphs)
