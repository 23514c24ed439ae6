"""On the GPU: the prefix cache, chunked prefill and retraction under a full pool leave greedy output
unchanged, with CUDA graphs and overlap scheduling (the CUDA defaults), on the triton backend
(fp32: exact) and flashinfer (bf16, head_dim 128: equal up to a near-tie rounded the other way,
as in test_gpu_backends)."""

from __future__ import annotations

import pytest
import torch

from specdec.attention import available_backends

from .helpers import assert_equal_or_near_tie, assert_no_leak, engine, make_pair, prompts_of

pytestmark = pytest.mark.gpu

RUNS = [(b, d) for b, d in (("triton", torch.float32), ("flashinfer", torch.bfloat16)) if b in available_backends()]
RUN_IDS = [b for b, _ in RUNS]
SHAPES = [None, (3, 1, 4), (5, 4, 8), (4, 8, 32)]
SHAPE_IDS = ["plain" if s is None else "x".join(map(str, s)) for s in SHAPES]


def _greedy(max_new: list[int]) -> list[dict]:
    return [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in max_new]


def _build(backend, dtype, shape, **kw):
    head_dim = 128 if backend == "flashinfer" else 16
    target, draft = make_pair("EAGLE3", "mixed", dtype=dtype, head_dim=head_dim)
    target, draft = target.cuda(), draft.cuda()
    common = dict(device="cuda", attention_backend=backend, **kw)
    if shape is None:
        return target, engine(target, **common)
    return target, engine(target, draft, algorithm="EAGLE3", shape=shape, **common)


def _same(backend, target, prompts, got, want):
    got, want = [g["output_ids"] for g in got], [w["output_ids"] for w in want]
    if backend == "triton":
        assert got == want
    else:
        assert_equal_or_near_tie(target, prompts, got, want)


@pytest.mark.parametrize("backend, dtype", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_gpu_multi_turn_and_chunking_identical(backend, dtype, shape, page_size):
    vocab = 97
    firsts = prompts_of([5, 23, 40, 2, 61], vocab, seed=1)
    extra = prompts_of([3, 1, 17, 6, 9], vocab, seed=2)
    settings = [dict(disable_radix_cache=True, chunked_prefill_size=-1), dict(), dict(chunked_prefill_size=7)]
    target, reference = _build(backend, dtype, shape, page_size=page_size, **settings[0])
    turn1 = reference.generate(input_ids=firsts, sampling_params=_greedy([12] * 5))
    seconds = [p + r["output_ids"] + e for p, r, e in zip(firsts, turn1, extra)]
    turn2 = reference.generate(input_ids=seconds, sampling_params=_greedy([9] * 5))
    for kw in settings[1:]:
        _, eng = _build(backend, dtype, shape, page_size=page_size, **kw)
        _same(backend, target, firsts, eng.generate(input_ids=firsts, sampling_params=_greedy([12] * 5)), turn1)
        got = eng.generate(input_ids=seconds, sampling_params=_greedy([9] * 5))
        _same(backend, target, seconds, got, turn2)
        assert sum(r["meta_info"]["cached_tokens"] for r in got) > 0
        assert_no_leak(eng)


@pytest.mark.parametrize("backend, dtype", RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=SHAPE_IDS[:3])
def test_gpu_full_pool_retracts_losslessly(backend, dtype, shape):
    prompts = prompts_of([12, 20, 7, 16, 25, 9, 14, 18], 97, seed=15)
    params = _greedy([60, 45, 70, 50, 40, 66, 55, 48])
    target, big = _build(backend, dtype, shape, page_size=16, max_running_requests=8)
    want = big.generate(input_ids=prompts, sampling_params=params)
    _, small = _build(backend, dtype, shape, page_size=16, max_running_requests=8, max_total_tokens=160,
                      schedule_conservativeness=0.05)
    _same(backend, target, prompts, small.generate(input_ids=prompts, sampling_params=params), want)
    assert small.scheduler.num_retracted > 0
    assert_no_leak(small)
