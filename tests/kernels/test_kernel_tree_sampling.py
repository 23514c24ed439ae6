"""tree_speculative_sampling_target_only: exact tables with chosen coins, invariants over random
trees, and chi-square convergence of the emitted tokens to the target distribution."""

from __future__ import annotations

import random

import numpy as np
import pytest
import scipy.stats
import torch

from specdec.kernels import tree_speculative_sampling_target_only

POISON = -7


def links_from_parents(parents: list[int], bs: int = 1):
    """retrive_index / next_token / next_sibling ([bs, N]) for bs copies of one parent list."""
    n = len(parents)
    next_token, next_sibling, last_child = [-1] * n, [-1] * n, {}
    for c in range(1, n):
        if parents[c] in last_child:
            next_sibling[last_child[parents[c]]] = c
        else:
            next_token[parents[c]] = c
        last_child[parents[c]] = c
    return (torch.arange(bs * n).view(bs, n), torch.tensor([next_token] * bs), torch.tensor([next_sibling] * bs))


def run_sampling(parents, tokens, probs, coins, final_coins, num_spec, **thresholds):
    """Per-request parent lists; returns (predicts, accept_index, accept_token_num, draft_probs)."""
    bs, n = coins.shape
    links = [links_from_parents(p) for p in parents]
    index = torch.arange(bs * n).view(bs, n)
    next_token = torch.cat([lk[1] for lk in links])
    next_sibling = torch.cat([lk[2] for lk in links])
    predicts = torch.full((bs * n,), POISON, dtype=torch.int32)
    accept_index = torch.full((bs, num_spec), -1, dtype=torch.int32)
    accept_num = torch.full((bs,), POISON, dtype=torch.int32)
    draft_probs = torch.zeros_like(probs)
    tree_speculative_sampling_target_only(
        predicts, accept_index, accept_num, torch.as_tensor(tokens), index, next_token, next_sibling,
        coins, final_coins, probs, draft_probs, **thresholds,
    )
    return predicts, accept_index, accept_num, draft_probs


# Tables: vocab 4, one request, tree root -> {1 (token 1), 2 (token 2)} unless said otherwise.
#        0
#       / \
#      1   2
Q0 = [0.1, 0.5, 0.3, 0.1]
FLAT = [0.25, 0.25, 0.25, 0.25]
P = POISON


@pytest.mark.parametrize(
    "parents, probs, coins, final, num_spec, thresholds, predicts, accept_index, draft_writes",
    [
        # coin .7: node 1 acc .5 < .7 rejected (draft_probs[0, 1] = .5); node 2 acc .8 >= .7 accepted;
        # node 2 is a leaf: bonus from q(2) (its draft_probs row is zero): u = .6 -> token 2.
        ([-1, 0, 0], [Q0, FLAT, FLAT], [0.7, 0.0, 0.0], 0.6, 3, {}, [2, P, 2], [0, 2, -1], {(0, 1): 0.5}),
        # coin .9 rejects both; residual q(0) - p = [.1, 0, 0, .1], u = .75 * .2 = .15 -> token 3.
        ([-1, 0, 0], [Q0, FLAT, FLAT], [0.9, 0.0, 0.0], 0.75, 3, {}, [3, P, P], [0, -1, -1],
         {(0, 1): 0.5, (0, 2): 0.3}),
        # same coin, threshold_single .45: q(0)[1] = .5 >= .45 accepts node 1 outright.
        ([-1, 0, 0], [Q0, FLAT, FLAT], [0.9, 0.0, 0.0], 0.1, 3, dict(threshold_single=0.45), [1, 0, P],
         [0, 1, -1], {}),
        # same coin, threshold_acc .5: acc / .5 = 1.0 >= .9 accepts node 1.
        ([-1, 0, 0], [Q0, FLAT, FLAT], [0.9, 0.0, 0.0], 0.1, 3, dict(threshold_acc=0.5), [1, 0, P],
         [0, 1, -1], {}),
        # chain 0 -> 1 -> 2 (tokens 1, 2), full acceptance; bonus from q(2) with p = 0, u = .95 -> 3.
        ([-1, 0, 1], [[0, 1, 0, 0], [0.2, 0.2, 0.5, 0.1], [0.4, 0.3, 0.2, 0.1]], [0.99, 0.3, 0.0], 0.95, 3, {},
         [1, 2, 3], [0, 1, 2], {}),
        # chain, node 2 rejected at node 1 (coin .6 > .5): residual [.2, .2, 0, .1], u = .25 -> token 1.
        ([-1, 0, 1], [[0, 1, 0, 0], [0.2, 0.2, 0.5, 0.1], [0.4, 0.3, 0.2, 0.1]], [0.99, 0.6, 0.0], 0.5, 3, {},
         [1, 1, P], [0, 1, -1], {(1, 2): 0.5}),
        # coin .9 rejects both children and q(0) has no other mass, so the residual is all zero: the
        # bonus falls back to q(0) itself: prefix [0 .3 .6 .6], u = .75 * .6 = .45 -> token 2.
        ([-1, 0, 0], [[0.0, 0.3, 0.3, 0.0], FLAT, FLAT], [0.9, 0.0, 0.0], 0.75, 3, {}, [2, P, P], [0, -1, -1],
         {(0, 1): 0.3, (0, 2): 0.3}),
    ],
    ids=["sibling-accept", "reject-all", "threshold-single", "threshold-acc", "full-chain", "chain-reject",
         "zero-residual"],
)
def test_sampling_tables(parents, probs, coins, final, num_spec, thresholds, predicts, accept_index, draft_writes):
    tokens = [[0, 1, 2]]
    target = torch.tensor([probs], dtype=torch.float32)
    out = run_sampling([parents], tokens, target, torch.tensor([coins]), torch.tensor([final]), num_spec,
                       **thresholds)
    assert out[0].tolist() == predicts
    assert out[1].tolist() == [accept_index]
    assert out[2].tolist() == [sum(i >= 0 for i in accept_index) - 1]
    expected_draft = torch.zeros_like(target)
    for (node, tok), value in draft_writes.items():
        expected_draft[0, node, tok] = value
    assert torch.equal(out[3], expected_draft)


def random_probs(rng: np.random.Generator, shape) -> torch.Tensor:
    """Fresh random distributions with every token at least 1/(2*vocab) likely."""
    vocab = shape[-1]
    p = 0.5 * rng.dirichlet(np.ones(vocab), size=shape[:-1]) + 0.5 / vocab
    return torch.from_numpy(p.astype(np.float32))


@pytest.mark.parametrize("seed", range(30))
def test_sampling_invariants_random_trees(seed):
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    bs, n, vocab = rng.randint(1, 4), rng.randint(1, 9), 11
    num_spec = rng.randint(1, n)
    parents = [[-1] + [rng.randrange(t) for t in range(1, n)] for _ in range(bs)]
    tokens = torch.tensor([[rng.randrange(vocab) for _ in range(n)] for _ in range(bs)])
    probs = random_probs(nrng, (bs, n, vocab))
    coins = torch.from_numpy(nrng.random((bs, n)).astype(np.float32))
    final = torch.from_numpy(nrng.random(bs).astype(np.float32))
    predicts, accept_index, accept_num, draft_probs = run_sampling(parents, tokens, probs, coins, final, num_spec)
    for b in range(bs):
        k = int(accept_num[b])
        path = [int(g) - b * n for g in accept_index[b, : k + 1]]
        assert path[0] == 0 and accept_index[b, k + 1 :].eq(-1).all()  # nothing past the rejection
        for prev, node in zip(path, path[1:]):
            assert parents[b][node] == prev
            assert predicts[b * n + prev] == tokens[b, node]  # accepted draft token
        assert 0 <= predicts[b * n + path[-1]] < vocab  # bonus
        off_path = [t for t in range(n) if t not in path]
        assert predicts[b * n : (b + 1) * n][off_path].eq(POISON).all()
        # draft_probs: only rejected children's tokens in rows of path nodes, copied from the target
        changed = draft_probs[b].nonzero().tolist()
        for node, tok in changed:
            assert node in path and tok in [int(tokens[b, c]) for c in range(n) if parents[b][c] == node]
            assert draft_probs[b, node, tok] == probs[b, node, tok]
        if k < num_spec - 1:  # the bonus is never a token the target already rejected at that node
            assert [path[-1], int(predicts[b * n + path[-1]])] not in changed


def emitted_tokens(parents, tokens, probs, num_spec, trials, seed):
    """Run `trials` copies of one request in one batch; returns [trials, num_spec] emitted tokens
    (accepted drafts then the bonus; -1 past the end)."""
    n, vocab = len(parents), probs.shape[-1]
    gen = torch.Generator().manual_seed(seed)
    coins = torch.rand(trials, n, generator=gen)
    final = torch.rand(trials, generator=gen)
    predicts, accept_index, _, _ = run_sampling(
        [parents] * trials, [tokens] * trials, probs.expand(trials, n, vocab).contiguous(), coins, final, num_spec
    )
    emitted = torch.where(accept_index >= 0, predicts[accept_index.clamp_min(0).long()], -1)
    return emitted.numpy()


def assert_follows(samples: np.ndarray, q: torch.Tensor):
    counts = np.bincount(samples, minlength=q.numel())
    expected = q.double().numpy() / q.double().sum().item() * len(samples)
    assert scipy.stats.chisquare(counts, expected).pvalue > 1e-3


@pytest.mark.parametrize(
    "parents, tokens, num_spec",
    [
        # chain 0 -> 1 -> 2 -> 3 (tokens 2, 4, 1)
        ([-1, 0, 1, 2], [0, 2, 4, 1], 4),
        # tree: root -> {1, 2, 3} (tokens 0, 3, 5), 1 -> {4, 5} (tokens 1, 2), 2 -> {6} (token 3)
        ([-1, 0, 0, 0, 1, 1, 2], [0, 0, 3, 5, 1, 2, 3], 3),
    ],
    ids=["chain", "tree"],
)
def test_emitted_tokens_follow_target(parents, tokens, num_spec):
    """First token ~ target(root); second token, given the first is child c's token, ~ target(c)."""
    vocab, trials = 7, 20000
    probs = random_probs(np.random.default_rng(len(parents)), (1, len(parents), vocab))
    emitted = emitted_tokens(parents, tokens, probs, num_spec, trials, seed=1234)
    assert_follows(emitted[:, 0], probs[0, 0])
    for child in [c for c in range(len(parents)) if parents[c] == 0]:
        hit = emitted[:, 0] == tokens[child]
        assert hit.sum() > 500
        assert_follows(emitted[hit, 1], probs[0, child])
    if parents == [-1, 0, 1, 2]:  # third token given the first two match nodes 1, 2
        hit = (emitted[:, 0] == tokens[1]) & (emitted[:, 1] == tokens[2])
        assert_follows(emitted[hit, 2], probs[0, 2])


@pytest.mark.parametrize(
    "key, bad",
    [
        ("uniform_samples", torch.zeros(1, 3, dtype=torch.float64)),
        ("uniform_samples_for_final_sampling", torch.zeros(2)),
        ("target_probs", torch.zeros(1, 3, 4, dtype=torch.float16)),
        ("draft_probs", torch.zeros(1, 3, 5)),
        ("candidates", torch.zeros(1, 3, dtype=torch.int32)),
        ("threshold_acc", 1.5),
        ("threshold_single", -0.1),
    ],
)
def test_validation(key, bad):
    index, next_token, next_sibling = links_from_parents([-1, 0, 0])
    args = dict(predicts=torch.zeros(3, dtype=torch.int32), accept_index=torch.zeros(1, 3, dtype=torch.int32),
                accept_token_num=torch.zeros(1, dtype=torch.int32), candidates=torch.zeros(1, 3, dtype=torch.int64),
                retrive_index=index, retrive_next_token=next_token, retrive_next_sibling=next_sibling,
                uniform_samples=torch.zeros(1, 3), uniform_samples_for_final_sampling=torch.zeros(1),
                target_probs=torch.zeros(1, 3, 4), draft_probs=torch.zeros(1, 3, 4))
    with pytest.raises(ValueError, match=key):
        tree_speculative_sampling_target_only(**{**args, key: bad})


def test_sibling_cycle_raises():
    index, next_token, next_sibling = links_from_parents([-1, 0, 0])
    next_sibling[0, 2] = 1
    with pytest.raises(ValueError, match="invalid draft tree: .*sibling cycle"):
        tree_speculative_sampling_target_only(
            torch.zeros(3, dtype=torch.int32), torch.full((1, 3), -1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32), torch.tensor([[0, 1, 2]]), index, next_token, next_sibling,
            torch.ones(1, 3), torch.zeros(1), torch.zeros(1, 3, 4), torch.zeros(1, 3, 4),
        )
