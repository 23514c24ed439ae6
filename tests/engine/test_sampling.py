"""Sampling: parameter validation, exact filter tables, greedy rows, and convergence of sample()
to an independent float64 reference distribution."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import scipy.stats
import torch

from specdec.engine.sampling import (
    SamplingBatch,
    SamplingParams,
    probs_from_logits,
    restrict_probs,
    sample,
)


# --------------------------------------------------------------------------- params
@pytest.mark.parametrize(
    "d, message",
    [
        ({"temperature": -1}, "sampling_params.temperature must be >= 0, got -1"),
        ({"temperature": "hot"}, "sampling_params.temperature must be a finite number"),
        ({"temperature": float("nan")}, "sampling_params.temperature must be a finite number"),
        ({"top_p": 0.0}, "sampling_params.top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "sampling_params.top_p must be in (0, 1], got 1.5"),
        ({"top_k": 0}, "sampling_params.top_k must be -1 (all) or >= 1, got 0"),
        ({"top_k": -2}, "sampling_params.top_k must be -1 (all) or >= 1, got -2"),
        ({"top_k": 2.5}, "sampling_params.top_k must be an int, got 2.5"),
        ({"min_p": -0.1}, "sampling_params.min_p must be in [0, 1], got -0.1"),
        ({"min_p": 1.5}, "sampling_params.min_p must be in [0, 1], got 1.5"),
        ({"max_new_tokens": -1}, "sampling_params.max_new_tokens must be >= 0, got -1"),
        ({"max_new_tokens": 1.5}, "sampling_params.max_new_tokens must be an int, got 1.5"),
        ({"max_new_tokens": True}, "sampling_params.max_new_tokens must be an int, got True"),
        ({"stop_token_ids": "2"}, "sampling_params.stop_token_ids must be a list of ints"),
        ({"stop_token_ids": 2}, "sampling_params.stop_token_ids must be a list of ints"),
        ({"stop_token_ids": [1, "a"]}, "sampling_params.stop_token_ids must be a list of ints"),
        ({"stop_token_ids": [-1]}, "sampling_params.stop_token_ids must be a list of ints >= 0"),
        ({"stop": ""}, "sampling_params.stop must be a non-empty string or a list of them"),
        ({"stop": ["a", 3]}, "sampling_params.stop must be a non-empty string or a list of them"),
        ({"stop": {"a": 1}}, "sampling_params.stop must be a non-empty string or a list of them"),
        ({"ignore_eos": "yes"}, "sampling_params.ignore_eos must be a bool"),
        ({"temprature": 0.5}, "sampling_params: unknown key(s) 'temprature'"),
    ],
)
def test_from_dict_rejects(d, message):
    with pytest.raises(ValueError) as info:
        SamplingParams.from_dict(d)
    assert message in str(info.value)


def test_from_dict_accepts():
    assert SamplingParams.from_dict(None) == SamplingParams()
    assert SamplingParams.from_dict({}) == SamplingParams()
    p = SamplingParams.from_dict(
        {"temperature": 0, "top_k": 5, "stop_token_ids": [3, 4], "max_new_tokens": 0, "top_p": None}
    )
    assert p.stop_token_ids == (3, 4) and p.top_p == 1.0 and p.max_new_tokens == 0
    assert SamplingParams.from_dict({"stop": "ab"}).stop == ("ab",)
    assert SamplingParams.from_dict({"stop": ["ab", "\n"]}).stop == ("ab", "\n")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 1.0  # type: ignore[misc]


def test_a_top_k_past_any_vocabulary_keeps_every_token():
    """Schemathesis found it: top_k = 10**21 passed the checks, then overflowed the step's int64
    tensor and failed every request in the batch. Any k past 2**31 - 1 means all tokens."""
    assert SamplingParams.from_dict({"top_k": 10**21}).top_k == -1
    assert SamplingParams.from_dict({"top_k": 2**31 - 1}).top_k == 2**31 - 1
    batch = SamplingBatch.from_params([SamplingParams(temperature=1.0, top_k=10**21), SamplingParams(top_k=3)], "cpu")
    assert batch.top_ks.tolist() == [-1, 3]


@pytest.mark.parametrize(
    "kwargs, greedy",
    [
        (dict(), False),
        (dict(temperature=0.0), True),
        (dict(temperature=1e-6), True),
        (dict(temperature=1e-4), False),
        (dict(top_k=1), True),
        (dict(top_k=2, temperature=0.5), False),
    ],
)
def test_is_greedy(kwargs, greedy):
    assert SamplingParams(**kwargs).is_greedy is greedy


def test_sampling_batch_tensors():
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=3, top_p=0.9)]
    b = SamplingBatch.from_params(params, "cpu")
    assert b.temperatures.tolist() == [1.0, pytest.approx(0.7)]
    assert b.top_ks.tolist() == [-1, 3] and b.is_greedy.tolist() == [True, False]
    assert not b.all_greedy and b.need_top_k and b.need_top_p and not b.need_min_p
    assert SamplingBatch.from_params([SamplingParams(top_k=1)] * 2, "cpu").all_greedy


# --------------------------------------------------------------------------- filters
# p over a vocab of 5, not sorted by token id: token 3 is most likely.
P = [0.125, 0.0, 0.25, 0.5, 0.125]


@pytest.mark.parametrize(
    "top_k, top_p, min_p, kept",
    [
        (-1, 1.0, 0.0, [0, 2, 3, 4]),
        (1, 1.0, 0.0, [3]),
        (2, 1.0, 0.0, [2, 3]),
        (3, 1.0, 0.0, [0, 2, 3]),  # tie between tokens 0 and 4: stable sort keeps the lower id
        (-1, 0.5, 0.0, [3]),  # the mass before token 2 is 0.5: reached
        (-1, 0.7, 0.0, [2, 3]),
        (-1, 0.75, 0.0, [2, 3]),
        (-1, 0.76, 0.0, [0, 2, 3]),
        (-1, 0.01, 0.0, [3]),  # the top token is always kept
        (-1, 1.0, 0.25, [0, 2, 3, 4]),  # 0.125 >= 0.25 * 0.5
        (-1, 1.0, 0.3, [2, 3]),
        (-1, 1.0, 1.0, [3]),
        (3, 0.76, 0.3, [2, 3]),  # the filters intersect
    ],
)
def test_restrict_probs_table(top_k, top_p, min_p, kept):
    probs = torch.tensor([P])
    out = restrict_probs(
        probs,
        top_ks=torch.tensor([top_k]),
        top_ps=torch.tensor([top_p]),
        min_ps=torch.tensor([min_p]),
    )
    assert torch.nonzero(out[0]).flatten().tolist() == kept
    expect = torch.zeros(5)
    expect[kept] = probs[0, kept] / probs[0, kept].sum()
    assert torch.equal(out[0], expect)


def test_probs_from_logits_filters_and_greedy_rows():
    """Rows share requests via row_to_request: rows 0-1 -> request 1, rows 2-4 -> request 0,
    row 5 -> request 2 (greedy by temperature 0). Logits log(P) * T give p = P at temperature T."""
    params = [
        SamplingParams(temperature=0.5, top_p=0.7),
        SamplingParams(temperature=2.0, top_k=3, min_p=0.3),
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=1),
    ]
    batch = SamplingBatch.from_params(params, "cpu")
    log_p = torch.tensor(P).log()
    row_to_request = torch.tensor([1, 1, 0, 0, 0, 2, 3])
    temps = torch.tensor([0.5, 2.0, 1.0, 1.0])[row_to_request]
    logits = log_p[None, :] * temps[:, None]
    logits = torch.where(torch.isinf(logits), -1e4, logits)
    probs = probs_from_logits(logits, batch, row_to_request)
    assert probs.dtype == torch.float32 and probs.shape == (7, 5)
    kept = [torch.nonzero(r).flatten().tolist() for r in probs]
    assert kept == [[2, 3]] * 2 + [[2, 3]] * 3 + [[3]] * 2
    torch.testing.assert_close(probs[0], torch.tensor([0.0, 0.0, 1 / 3, 2 / 3, 0.0]))
    torch.testing.assert_close(probs.sum(dim=1), torch.ones(7))
    assert torch.equal(probs[5:], torch.eye(5)[[3, 3]])


def test_greedy_is_one_hot_at_argmax():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 37, generator=gen)
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=1, temperature=3.0)] * 3
    batch = SamplingBatch.from_params(params, "cpu")
    expect = torch.nn.functional.one_hot(logits.argmax(1), 37).float()
    assert torch.equal(probs_from_logits(logits, batch), expect)
    assert torch.equal(sample(logits, batch, gen), logits.argmax(1))
    # A mixed batch: greedy rows still take the argmax.
    mixed_params = [SamplingParams(temperature=0.0), SamplingParams()] * 3
    mixed = SamplingBatch.from_params(mixed_params, "cpu")
    out = sample(logits, mixed, gen)
    assert out.dtype == torch.int64 and out.shape == (6,)
    assert torch.equal(out[::2], logits.argmax(1)[::2])


def test_row_count_checked():
    batch = SamplingBatch.from_params([SamplingParams()] * 2, "cpu")
    with pytest.raises(ValueError, match="row_to_request"):
        probs_from_logits(torch.randn(3, 4), batch)


# --------------------------------------------------------------------------- distribution
def reference_probs(logits: np.ndarray, t: float, top_k: int, top_p: float, min_p: float):
    """float64, written independently of the module: softmax(logits / t), then the filters."""
    z = logits / t
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(len(p), dtype=bool)
    mass = 0.0
    for rank, tok in enumerate(order):
        ok = (top_k == -1 or rank < top_k) and (mass < top_p or top_p >= 1.0)
        ok = ok and p[tok] >= min_p * p[order[0]]
        keep[tok] = ok or rank == 0
        mass += p[tok]
    q = np.where(keep, p, 0.0)
    return q / q.sum()


@pytest.mark.parametrize(
    "t, top_k, top_p, min_p",
    [
        (1.0, -1, 1.0, 0.0),
        (0.7, 6, 1.0, 0.0),
        (1.3, -1, 0.8, 0.0),
        (0.8, 7, 0.9, 0.05),
    ],
)
def test_sample_follows_reference_distribution(t, top_k, top_p, min_p):
    vocab, n = 13, 40_000
    gen = torch.Generator().manual_seed(1234)
    logits = torch.randn(vocab, generator=gen) * 1.5
    expect = reference_probs(logits.double().numpy(), t, top_k, top_p, min_p)
    params = SamplingParams(temperature=t, top_k=top_k, top_p=top_p, min_p=min_p)
    batch = SamplingBatch.from_params([params] * n, "cpu")
    tokens = sample(logits.expand(n, vocab), batch, gen)
    counts = np.bincount(tokens.numpy(), minlength=vocab)
    support = expect > 0
    assert counts[~support].sum() == 0, "sampled a token the filters remove"
    if support.sum() > 1:
        result = scipy.stats.chisquare(counts[support], expect[support] * n)
        assert result.pvalue > 1e-3, (counts, expect * n)
    # Convergence: total variation shrinks roughly like 1/sqrt(samples).
    for m in (1_000, n):
        tv = 0.5 * np.abs(np.bincount(tokens[:m].numpy(), minlength=vocab) / m - expect).sum()
        assert tv < 3 * math.sqrt(vocab / m)
