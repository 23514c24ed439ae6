"""Greedy speculative output equals plain greedy output, token for token."""

import pytest
import torch

from ..builders import greedy_generate_reference

from .helpers import TREE_SHAPES, assert_no_leak, engine, make_pair, prompts_of

LENGTHS_7 = [1, 9, 4, 23, 2, 15, 6]
MAX_NEW_7 = [17, 5, 30, 12, 1, 24, 9]


def _params(max_new):
    return [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in max_new]


def _check(algorithm, kind, shape, bs, page_size, dtype=torch.float32):
    target, draft = make_pair(algorithm, kind, dtype=dtype)
    lengths, max_new = (LENGTHS_7, MAX_NEW_7) if bs == 7 else ([11], [28])
    prompts = prompts_of(lengths, target.config.vocab_size)
    plain = engine(target, page_size=page_size)
    expected = [r["output_ids"] for r in plain.generate(input_ids=prompts, sampling_params=_params(max_new))]
    spec = engine(target, draft, algorithm=algorithm, shape=shape, page_size=page_size)
    results = spec.generate(input_ids=prompts, sampling_params=_params(max_new))
    assert [r["output_ids"] for r in results] == expected
    assert all(len(r["output_ids"]) == m for r, m in zip(results, max_new))
    assert_no_leak(spec)
    assert_no_leak(plain)
    return results


@pytest.mark.parametrize("shape", TREE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
@pytest.mark.parametrize("bs, page_size", [(1, 1), (7, 16)])
def test_lossless_mixed_acceptance(shape, algorithm, bs, page_size):
    results = _check(algorithm, "mixed", shape, bs, page_size)
    steps = shape[0]
    accepted = [k for r in results for k in r["meta_info"]["spec_accept_lengths"]]
    assert all(0 <= k <= steps for k in accepted)
    if bs == 7:  # the fixture really mixes outcomes: rejections, partial and longer accepts
        assert len(set(accepted)) >= min(3, steps + 1), sorted(set(accepted))


@pytest.mark.parametrize("shape", [(3, 1, 4), (5, 4, 8)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
@pytest.mark.parametrize("bs, page_size", [(7, 1), (1, 16)])
def test_lossless_random_draft(shape, algorithm, bs, page_size):
    _check(algorithm, "random", shape, bs, page_size)


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_lossless_bf16(algorithm):
    _check(algorithm, "mixed", (5, 4, 8), 7, 1, dtype=torch.bfloat16)


def test_plain_engine_matches_unbatched_reference():
    target, _ = make_pair("EAGLE", "random")
    prompts = prompts_of(LENGTHS_7, target.config.vocab_size)
    results = engine(target, page_size=16).generate(input_ids=prompts, sampling_params=_params(MAX_NEW_7))
    for prompt, m, r in zip(prompts, MAX_NEW_7, results):
        assert r["output_ids"] == greedy_generate_reference(target, prompt, m)


@pytest.mark.parametrize("shape", TREE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_perfect_draft_accepts_full_depth(shape, algorithm):
    target, draft = make_pair(algorithm, "perfect")
    prompts = prompts_of([5, 12, 3], target.config.vocab_size)
    spec = engine(target, draft, algorithm=algorithm, shape=shape, page_size=1)
    results = spec.generate(input_ids=prompts, sampling_params=_params([40, 40, 40]))
    steps = shape[0]
    for prompt, r in zip(prompts, results):
        assert r["meta_info"]["spec_accept_lengths"], "no verify step ran"
        assert all(k == steps for k in r["meta_info"]["spec_accept_lengths"])
        assert r["output_ids"] == greedy_generate_reference(target, prompt, 40)
    assert_no_leak(spec)


def test_requests_arriving_and_finishing_at_different_times():
    target, draft = make_pair("EAGLE", "mixed")
    vocab = target.config.vocab_size
    prompts = prompts_of([3, 17, 8, 1, 30, 5], vocab, seed=4)
    max_new = [25, 6, 19, 33, 11, 2]
    plain = engine(target, page_size=16)
    expected = [r["output_ids"] for r in plain.generate(input_ids=prompts, sampling_params=_params(max_new))]
    spec = engine(target, draft, algorithm="EAGLE", shape=(4, 3, 9), page_size=16, max_running_requests=4)
    reqs = [spec.make_request(input_ids=p, sampling_params=s) for p, s in zip(prompts, _params(max_new))]
    for req in reqs[:2]:
        spec.add_request(req)
    spec.step()
    spec.step()
    for req in reqs[2:]:
        spec.add_request(req)
        spec.step()
    while spec.scheduler.has_work:
        spec.step()
    assert [r.output_ids for r in reqs] == expected
    assert_no_leak(spec)
