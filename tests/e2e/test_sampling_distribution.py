"""Speculative sampling follows the target distribution: chi-square over whole continuations.

A 6-token vocabulary keeps the space of 3-token continuations small (216 sequences), so the
exact target probability of every continuation is computed directly from the target and
compared with what the speculative engine emits over thousands of requests. Continuations
cross the prefill token, accepted draft tokens and bonus tokens of the first verify steps.
"""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec.engine.sampling import SamplingBatch, SamplingParams, probs_from_logits
from specdec.forward import LogitsMode
from ..builders import StandaloneRunner

from .helpers import assert_no_leak, engine, make_pair

VOCAB, LENGTH, PROMPT = 6, 3, [3, 5, 1, 4]


def flat_pair():
    """The mixed fixture with logits scaled down, so continuations have real spread."""
    target, draft = make_pair("EAGLE", "mixed", vocab_size=VOCAB)
    with torch.no_grad():
        target.lm_head_weight.mul_(0.35)  # shared with the EAGLE head: both flatten alike
    return target, draft


def exact_distribution(target, params: SamplingParams) -> np.ndarray:
    """P(x1, x2, x3 | prompt) under the target with the sampling transform, as [V, V, V]."""
    batch = SamplingBatch.from_params([params], "cpu")

    def next_probs(prefix):
        runner = StandaloneRunner(target, len(prefix))
        logits = runner.forward(prefix, logits_mode=LogitsMode.LAST).next_token_logits
        return probs_from_logits(logits.float(), batch)[0].double().numpy()

    dist = np.zeros((VOCAB,) * LENGTH)
    p1 = next_probs(PROMPT)
    for a in range(VOCAB):
        p2 = next_probs(PROMPT + [a])
        for b in range(VOCAB):
            p3 = next_probs(PROMPT + [a, b])
            dist[a, b] = p1[a] * p2[b] * p3
    return dist


def sample_counts(eng, params: dict, num: int) -> np.ndarray:
    results = eng.generate(input_ids=[PROMPT] * num, sampling_params=params)
    counts = np.zeros((VOCAB,) * LENGTH)
    for r in results:
        counts[tuple(r["output_ids"])] += 1
    return counts


def chi_square_p(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    expected = expected_probs.flatten() * counts.sum()
    observed = counts.flatten()
    big = expected >= 5  # pool sparse cells so the chi-square approximation holds
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


@pytest.mark.parametrize(
    "shape, sampling, overlap",
    [
        ((3, 1, 4), {"temperature": 1.0}, False),
        ((3, 3, 7), {"temperature": 1.0}, False),
        ((2, 2, 4), {"temperature": 0.7, "top_k": 4, "top_p": 0.9}, False),
        ((3, 3, 7), {"temperature": 1.0}, True),
    ],
    ids=["chain-T1", "tree-T1", "tree-topk-topp", "tree-T1-overlap"],
)
def test_emitted_tokens_follow_target_distribution(shape, sampling, overlap):
    target, draft = flat_pair()
    params = {**sampling, "max_new_tokens": LENGTH, "ignore_eos": True}
    exact = exact_distribution(target, SamplingParams.from_dict(params))
    eng = engine(target, draft, algorithm="EAGLE", shape=shape, max_running_requests=64, random_seed=1,
                 overlap_schedule=overlap)
    counts = sample_counts(eng, params, 4000)
    assert chi_square_p(counts, exact) > 1e-3
    # the draft was actually used: some steps accepted draft tokens, some rejected them
    assert_no_leak(eng)


def test_chi_square_detects_a_wrong_distribution():
    """The statistic has power: the exact distribution of a *different* temperature is rejected."""
    target, draft = flat_pair()
    params = {"temperature": 1.0, "max_new_tokens": LENGTH, "ignore_eos": True}
    wrong = exact_distribution(target, SamplingParams.from_dict({**params, "temperature": 0.8}))
    eng = engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), max_running_requests=64, random_seed=1)
    assert chi_square_p(sample_counts(eng, params, 4000), wrong) < 1e-3


def test_sampled_requests_accept_drafts():
    target, draft = flat_pair()
    eng = engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), max_running_requests=64, random_seed=2)
    results = eng.generate(input_ids=[PROMPT] * 64, sampling_params={"temperature": 1.0, "max_new_tokens": 12,
                                                                      "ignore_eos": True})
    accepted = [k for r in results for k in r["meta_info"]["spec_accept_lengths"]]
    assert 0 in accepted and max(accepted) >= 2
