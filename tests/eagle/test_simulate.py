"""The benchmark's simulated acceptance (specdec.eagle.simulate): accepted lengths follow the
hazard model, and its draws are common random numbers: the same (seed, row, position) draws the
same, whatever the shape, so policies compared in one benchmark face the same text."""

import numpy as np
import pytest
import torch

from specdec.eagle.simulate import child_cdf, simulate_tree_acceptance
from specdec.kernels.position_hash import position_uniforms

HAZARDS = ((0.8,), (0.6,), (0.5,), (0.7,), (0.4,))  # rank-0 acceptance per depth (topk 1: chains; one parent row)


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


def test_a_rank_one_parent_draws_from_its_own_row():
    """Parent rows: root -> {a, b} (ranks 0, 1), a -> {c, d}, b -> {e, f}. Depth 1 draws from the
    root's row; depth 2 from a's row (rank 0) or b's (rank 1). The accepted paths' frequencies
    follow the products of q[d, p, r] (module doc), e.g. root, b, f: .5 * .6 * (.9 * .8)."""
    hazards = (((0.5, 0.6), (0.5, 0.6)), ((0.9, 0.0), (0.1, 0.8)))  # [depth, parent rank, rank]
    bs, n = 40000, 7
    candidates = torch.tensor([[90, 1, 2, 3, 4, 5, 6]]).repeat(bs, 1)  # root, a, b, c, d, e, f
    nxt = torch.tensor([[1, 3, 5, -1, -1, -1, -1]]).repeat(bs, 1)
    sib = torch.tensor([[-1, 2, -1, 4, -1, 6, -1]]).repeat(bs, 1)
    seq_lens = torch.randint(10, 10**6, (bs,), generator=torch.Generator().manual_seed(5))
    positions = (seq_lens[:, None] + torch.tensor([0, 1, 1, 2, 2, 2, 2])).reshape(-1)
    logits = torch.zeros(bs * n, 100)
    logits[:, 99] = 1.0
    res = simulate_tree_acceptance(candidates, logits, positions, seq_lens, torch.arange(bs * n).view(bs, n),
                                   nxt, sib, child_cdf(hazards, "cpu"), num_steps=2, seed=3)
    last = res.accept_index.gather(1, res.accept_length[:, None]).squeeze(1) % n  # [bs] last accepted node
    # q[0, 0] = [.5, .3]; q[1, 0] = [.9, 0] under a; q[1, 1] = [.1, .72] under b
    expected = {0: 0.2, 1: 0.5 * 0.1, 2: 0.3 * (1 - 0.1 - 0.72), 3: 0.5 * 0.9, 4: 0.0, 5: 0.3 * 0.1, 6: 0.3 * 0.72}
    for node, p in expected.items():
        got = (last == node).float().mean().item()
        assert abs(got - p) <= 4 * (p * (1 - p) / bs) ** 0.5 + 1e-9, (node, got, p)


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


@pytest.mark.parametrize("key, bad", [("cdf", torch.zeros(3, 1, 2, dtype=torch.float64)),
                                      ("positions", torch.zeros(2, 4, dtype=torch.int64)),
                                      ("seq_lens", torch.zeros(2, dtype=torch.int32)),
                                      ("candidates", torch.zeros(6, dtype=torch.int64))])
def test_simulate_target_predict_names_the_bad_argument(key, bad):
    from specdec.kernels import simulate_target_predict

    node = torch.zeros(2, 3, dtype=torch.int64)
    args = dict(candidates=node, argmax=node, positions=node, seq_lens=torch.zeros(2, dtype=torch.int64),
                retrive_next_token=node - 1, retrive_next_sibling=node - 1, cdf=torch.zeros(3, 1, 2),
                target_predict=node.clone())
    simulate_target_predict(**args, seed=0)
    with pytest.raises(ValueError, match=f"^{key}:"):
        simulate_target_predict(**{**args, key: bad}, seed=0)


@pytest.mark.parametrize("shape", [(3, 1, 4), (3, 2, 6), (4, 3, 10), (5, 4, 8), (6, 8, 32)])
@pytest.mark.parametrize("parent_ranks", [1, 3, 8])
def test_the_synthetic_draft_builds_the_models_static_tree(shape, parent_ranks):
    """The draft loop's frontier selection and node choice, fed the model's child probabilities by
    parent rank (``simulate.rank_probs``, ``draft.model_child_probs``), keeps nodes whose scores sum
    to the model's static estimate less the root: the tree the benchmark verifies is the one the
    policy's estimate counts."""
    from specdec.config import SpecAlgorithm, SpecConfig
    from specdec.eagle.acceptance import AcceptanceModel
    from specdec.eagle.draft import model_child_probs
    from specdec.eagle.tree import organize_draft_results, select_top_k_tokens
    from specdec.eagle.simulate import rank_probs

    steps, k, n = shape
    rng = np.random.default_rng(steps * 10 + k)
    hazards = rng.uniform(0.05, 0.9, (6, parent_ranks, 8))
    config = SpecConfig(SpecAlgorithm.parse("EAGLE3"), None, steps, k, n,
                        simulate_hazards=tuple(tuple(tuple(r) for r in d) for d in hazards.tolist()))
    probs = rank_probs(config, "cpu")  # [S, P, K]
    bs, hidden = 2, 4
    tokens = torch.arange(bs * k).view(bs, k)
    sel = select_top_k_tokens(0, probs[0, 0, :k].expand(bs, k), tokens, torch.zeros(bs, hidden), None, k)
    scores, token_list = [sel.tree_info[0]], [sel.tree_info[1]]
    parents = [sel.tree_info[2]]
    for step in range(1, steps):
        topk_p = model_child_probs(probs[step], sel.tree_info[2], k)  # [bs*K, K]
        sel = select_top_k_tokens(step, topk_p, torch.arange(bs * k * k).view(bs * k, k),
                                  torch.zeros(bs * k, hidden), sel.scores, k)
        scores.append(sel.tree_info[0])
        token_list.append(sel.tree_info[1])
        parents.append(sel.tree_info[2])
    _, kept, _ = organize_draft_results(scores, token_list, parents, n)
    kept_scores = torch.cat(scores, 1).flatten(1).double().gather(1, kept)  # [bs, N-1]
    expected = AcceptanceModel(hazards).expected_committed(steps, k, n)
    np.testing.assert_allclose(1 + kept_scores.sum(1).numpy(), expected, rtol=1e-5)
