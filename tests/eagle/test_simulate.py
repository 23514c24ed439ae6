"""The benchmark's simulated acceptance (specdec.eagle.simulate): accepted lengths follow the
hazard model, and its draws are common random numbers: the same (seed, row, position) draws the
same, whatever the shape, so policies compared in one benchmark face the same text."""

import pytest
import torch

from specdec.eagle.simulate import child_cdf, simulate_tree_acceptance
from specdec.kernels.position_hash import position_uniforms

HAZARDS = ((0.8,), (0.6,), (0.5,), (0.7,), (0.4,))  # rank-0 acceptance per depth (topk 1: chains)


def _chain(depth: int, seq_lens: torch.Tensor, seed: int) -> torch.Tensor:  # [bs] accepted draft tokens
    """A chain of ``depth`` draft tokens after the root, e.g. depth 3:  root -> t1 -> t2 -> t3."""
    bs, n = seq_lens.shape[0], depth + 1
    gen = torch.Generator().manual_seed(1)
    candidates = torch.randint(0, 50, (bs, n), generator=gen)
    nxt = torch.arange(1, n + 1).repeat(bs, 1)
    nxt[:, -1] = -1
    positions = (seq_lens[:, None] + torch.arange(n)).reshape(-1)  # [bs * N]
    logits = torch.zeros(bs * n, 51)
    logits[:, 50] = 1.0  # NOTE: the argmax (the bonus where nothing is drawn) is never a draft token
    res = simulate_tree_acceptance(
        candidates, logits, positions, seq_lens,
        torch.arange(bs * n).view(bs, n), nxt, torch.full((bs, n), -1), child_cdf(HAZARDS[:depth], "cpu"),
        num_steps=depth, seed=seed)
    return res.accept_length


def test_accepted_lengths_follow_the_hazards():
    bs = 20000
    lengths = _chain(3, torch.randint(10, 5000, (bs,), generator=torch.Generator().manual_seed(0)), seed=7)
    survive = 1.0
    for depth in range(1, 4):
        survive *= HAZARDS[depth - 1][0]
        got = (lengths >= depth).float().mean().item()
        assert abs(got - survive) < 4 * (survive * (1 - survive) / bs) ** 0.5, (depth, got, survive)


def test_shapes_share_their_draws():
    """With the same seed, rows and positions, a chain of 2 accepts exactly what a chain of 4 accepts
    in its first two tokens: the draws are common. Fresh random numbers would couple nothing."""
    seq_lens = torch.randint(10, 5000, (4000,), generator=torch.Generator().manual_seed(3))
    short, long = _chain(2, seq_lens, seed=11), _chain(4, seq_lens, seed=11)
    assert torch.equal(short, long.clamp(max=2))
    assert (long > 2).any()  # the long chain does go further where the draws allow
    other = _chain(2, seq_lens, seed=12)
    assert not torch.equal(short, other)  # another seed, other draws


@pytest.mark.parametrize("seed", [0, 5, 2**40 + 3, 2**63 - 1])
def test_position_uniforms_are_uniform_and_fixed(seed):
    positions = torch.arange(200_000).view(100, 2000)
    u = position_uniforms(positions, seed)
    assert u.dtype == torch.float32 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.histc(u, bins=10, min=0.0, max=1.0)
    assert (counts - u.numel() / 10).abs().max() < 5 * (u.numel() / 10) ** 0.5
    assert torch.equal(u, position_uniforms(positions, seed))
    assert torch.equal(u[3:5, 7:9], position_uniforms(positions, seed)[3:5, 7:9])


@pytest.mark.parametrize("key, bad", [("cdf", torch.zeros(3, 2, dtype=torch.float64)),
                                      ("positions", torch.zeros(2, 4, dtype=torch.int64)),
                                      ("seq_lens", torch.zeros(2, dtype=torch.int32)),
                                      ("candidates", torch.zeros(6, dtype=torch.int64))])
def test_simulate_target_predict_names_the_bad_argument(key, bad):
    from specdec.kernels import simulate_target_predict

    node = torch.zeros(2, 3, dtype=torch.int64)
    args = dict(candidates=node, argmax=node, positions=node, seq_lens=torch.zeros(2, dtype=torch.int64),
                retrive_next_token=node - 1, retrive_next_sibling=node - 1, cdf=torch.zeros(3, 2),
                target_predict=node.clone())
    simulate_target_predict(**args, seed=0)
    with pytest.raises(ValueError, match=f"^{key}:"):
        simulate_target_predict(**{**args, key: bad}, seed=0)
