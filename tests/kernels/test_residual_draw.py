"""``residual_draw_ref``, the bonus draw's specification: worked examples, agreement with a plain
Python-integer transcription of its definition, and convergence to the normalized residual.
(The Triton draw is compared with it in test_triton_ops.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch

from specdec.kernels.residual import residual_draw_ref


def draw(q, p, coin) -> int:
    return int(residual_draw_ref(torch.tensor([q]), torch.tensor([p]), torch.tensor([coin]))[0])


@pytest.mark.parametrize(
    "q, p, coin, token",
    [
        # the docstring's example: residual [.1 0 0 .1], threshold .15 of the mass -> token 3
        ([0.1, 0.5, 0.3, 0.1], [0.0, 0.5, 0.3, 0.0], 0.75, 3),
        # p = q: nothing left, fall back to q: prefix [.1 .6 .9 1], threshold .75 -> token 2
        ([0.1, 0.5, 0.3, 0.1], [0.1, 0.5, 0.3, 0.1], 0.75, 2),
        # p > q everywhere is the same fallback; coin 0 -> the first token with mass
        ([0.0, 0.5, 0.5, 0.0], [0.0, 0.6, 0.6, 0.1], 0.0, 1),
        # q = 0: no mass anywhere -> vocab - 1
        ([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], 0.3, 3),
        # coin 1.0 counts as the largest coin below 1: the last token with mass, never one without
        ([0.2, 0.3, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], 1.0, 2),
        # a mass below 2**-40 weighs nothing: token 1 can't be drawn, even at coin 0
        ([0.0, 2.0**-41, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], 0.0, 2),
        # masses above 1 are clamped to 1: [1 1] -> coin .6 -> token 1
        ([5.0, 1.0], [0.0, 0.0], 0.6, 1),
    ],
    ids=["docstring", "fallback-p-equals-q", "fallback-p-above-q", "no-mass", "coin-1", "below-resolution", "clamp"],
)
def test_draw_tables(q, p, coin, token):
    assert draw(q, p, coin) == token


def draw_python(q: np.ndarray, p: np.ndarray, coin: np.float32) -> int:
    """The module docstring's definition, transcribed with Python integers (no overflow possible)."""
    d = (q - p).astype(np.float32)

    def weights(x):
        return [math.floor(min(float(v), 1.0) * 2**40) if v > 0 else 0 for v in x]

    w = weights(d)
    if sum(w) == 0:
        w = weights(q)
    total = sum(w)
    if total == 0:
        return len(q) - 1
    u24 = min(max(math.floor(float(coin) * 2**24), 0), 2**24 - 1)
    threshold = u24 * total // 2**24
    prefix = 0
    for j, wj in enumerate(w):
        prefix += wj
        if prefix > threshold:
            return j
    raise AssertionError("unreachable: threshold < total")


@pytest.mark.parametrize("seed", range(4))
def test_draw_equals_python_integers(seed):
    """Random rows, including masses up to 1 per token (totals far above 2**39, where u24 * total
    overflows int64 unless split) and exact-tie coins."""
    rng = np.random.default_rng(seed)
    bs, vocab = 64, int(rng.integers(1, 60))
    q = rng.dirichlet(np.full(vocab, 0.5), size=bs).astype(np.float32)
    q[::4] = rng.random((len(q[::4]), vocab), dtype=np.float32)  # unnormalized, up to ~vocab in total
    p = (q * rng.random((bs, vocab)) * (rng.random((bs, vocab)) < 0.5)).astype(np.float32)
    p[1::7] = q[1::7]
    coins = rng.random(bs, dtype=np.float32)
    coins[::5] = rng.integers(0, 5, len(coins[::5])) / np.float32(4)  # 0, .25, .5, .75, 1
    ours = residual_draw_ref(torch.from_numpy(q), torch.from_numpy(p), torch.from_numpy(coins)).tolist()
    assert ours == [draw_python(q[b], p[b], coins[b]) for b in range(bs)]


@pytest.mark.parametrize("fallback", [False, True], ids=["residual", "fallback"])
def test_draw_follows_normalized_residual(fallback):
    """With torch.rand coins, tokens follow relu(q - p) / sum (or q itself when p >= q)."""
    vocab, trials = 9, 40000
    rng = np.random.default_rng(11)
    q = torch.from_numpy(rng.dirichlet(np.ones(vocab)).astype(np.float32))
    p = q.clone() if fallback else torch.from_numpy((q.numpy() * rng.random(vocab) * 1.5).astype(np.float32))
    coins = torch.rand(trials, generator=torch.Generator().manual_seed(5))
    tokens = residual_draw_ref(q.expand(trials, vocab), p.expand(trials, vocab), coins)
    target = q if fallback else (q - p).clamp_min(0)
    support = target > 0
    counts = np.bincount(tokens.numpy(), minlength=vocab)
    assert counts[~support.numpy()].sum() == 0
    expected = (target[support].double() / target.double().sum()).numpy() * trials
    assert scipy.stats.chisquare(counts[support.numpy()], expected).pvalue > 1e-3
