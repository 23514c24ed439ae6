"""verify_tree_greedy: hand tables (accept none / full chain / via a sibling / stop at a leaf /
stop at num_spec), invariants over random trees, malformed links."""

from __future__ import annotations

import random

import pytest
import torch

from specdec.kernels import verify_tree_greedy

POISON = -7


def links_from_parents(parents: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """retrive_index / next_token / next_sibling from per-request parent lists (parents[b][0] = -1)."""
    bs, n = len(parents), len(parents[0])
    next_token = [[-1] * n for _ in range(bs)]
    next_sibling = [[-1] * n for _ in range(bs)]
    for b, par in enumerate(parents):
        last_child: dict[int, int] = {}
        for c in range(1, n):
            if par[c] in last_child:
                next_sibling[b][last_child[par[c]]] = c
            else:
                next_token[b][par[c]] = c
            last_child[par[c]] = c
    return torch.arange(bs * n).view(bs, n), torch.tensor(next_token), torch.tensor(next_sibling)


def run_greedy(parents, candidates, target_predict, num_spec):
    bs, n = len(parents), len(parents[0])
    index, next_token, next_sibling = links_from_parents(parents)
    predicts = torch.full((bs * n,), POISON, dtype=torch.int32)
    accept_index = torch.full((bs, num_spec), -1, dtype=torch.int32)
    accept_num = torch.full((bs,), POISON, dtype=torch.int32)
    verify_tree_greedy(predicts, accept_index, accept_num, torch.tensor(candidates), index, next_token,
                       next_sibling, torch.tensor(target_predict))
    return predicts.tolist(), accept_index.tolist(), accept_num.tolist()


# Tree used by the tables (N = 5), tokens r=100, a=1, b=2, c=3, d=4:
#          0 (r)
#         /     \
#      1 (a)   2 (b)
#        |       |
#      3 (c)   4 (d)
TREE = [[-1, 0, 0, 1, 2]]
TREE_TOKENS = [[100, 1, 2, 3, 4]]
P = POISON


@pytest.mark.parametrize(
    "parents, candidates, target, num_spec, predicts, accept_index, accept_num",
    [
        # accept none: the target wants 9 after the root, no child has it.
        (TREE, TREE_TOKENS, [[9, 8, 8, 8, 8]], 3, [9, P, P, P, P], [[0, -1, -1]], [0]),
        # accept via a sibling: child 1 (a) != b, sibling 2 (b) == b; then node 4 (d) == d; leaf.
        (TREE, TREE_TOKENS, [[2, 8, 4, 8, 5]], 3, [2, P, 4, P, 5], [[0, 2, 4]], [2]),
        # stop at a leaf before num_spec: root -> 1 -> 3, node 3 has no children.
        (TREE, TREE_TOKENS, [[1, 3, 8, 6, 8]], 5, [1, 3, P, 6, P], [[0, 1, 3, -1, -1]], [2]),
        # stop at num_spec: the root's match is taken, node 1's child would match but num_spec = 2.
        (TREE, TREE_TOKENS, [[1, 3, 8, 6, 8]], 2, [1, 3, P, P, P], [[0, 1]], [1]),
        # full chain (topk 1): 0 -> 1 -> 2 -> 3, every draft token matches.
        ([[-1, 0, 1, 2]], [[100, 5, 6, 7]], [[5, 6, 7, 8]], 4, [5, 6, 7, 8], [[0, 1, 2, 3]], [3]),
        # batch of 2: request 1's nodes are 4..7 globally; it accepts node 2 (global 6), a leaf.
        ([[-1, 0, 1, 2], [-1, 0, 0, 1]], [[100, 5, 6, 7], [100, 5, 6, 7]], [[5, 6, 0, 0], [6, 0, 9, 0]], 3,
         [5, 6, 0, P, 6, P, 9, P], [[0, 1, 2], [4, 6, -1]], [2, 1]),
    ],
    ids=["accept-none", "via-sibling", "leaf", "num-spec", "full-chain", "batch"],
)
def test_greedy_tables(parents, candidates, target, num_spec, predicts, accept_index, accept_num):
    assert run_greedy(parents, candidates, target, num_spec) == (predicts, accept_index, accept_num)


def random_tree(rng: random.Random, n: int) -> list[int]:
    """parent[t] < t, so nodes are in topological order like build_tree emits them."""
    return [-1] + [rng.randrange(t) for t in range(1, n)]


@pytest.mark.parametrize("seed", range(40))
def test_greedy_invariants_random_trees(seed):
    rng = random.Random(seed)
    bs, n, vocab = rng.randint(1, 5), rng.randint(1, 12), rng.randint(2, 4)
    num_spec = rng.randint(1, n)
    parents = [random_tree(rng, n) for _ in range(bs)]
    candidates = [[rng.randrange(vocab) for _ in range(n)] for _ in range(bs)]
    target = [[rng.randrange(vocab) for _ in range(n)] for _ in range(bs)]
    predicts, accept_index, accept_num = run_greedy(parents, candidates, target, num_spec)
    for b in range(bs):
        k = accept_num[b]
        path = [g - b * n for g in accept_index[b][: k + 1]]
        assert 0 <= k < num_spec and path[0] == 0
        assert accept_index[b][k + 1 :] == [-1] * (num_spec - k - 1)  # nothing past the rejection
        for prev, node in zip(path, path[1:]):
            assert parents[b][node] == prev  # a root-to-node chain
            assert candidates[b][node] == target[b][prev]
        for node in range(n):
            want = target[b][node] if node in path else POISON
            assert predicts[b * n + node] == want
        if k < num_spec - 1:  # maximal: no child of the last node matches
            last = path[-1]
            children = [c for c in range(n) if parents[b][c] == last]
            assert all(candidates[b][c] != target[b][last] for c in children)


def test_sibling_cycle_raises():
    index, next_token, next_sibling = links_from_parents([[-1, 0, 0]])
    next_sibling[0, 2] = 1  # 1 -> 2 -> 1 -> ...
    with pytest.raises(ValueError, match="invalid draft tree: .*sibling cycle"):
        verify_tree_greedy(torch.zeros(3, dtype=torch.int32), torch.full((1, 2), -1, dtype=torch.int32),
                           torch.zeros(1, dtype=torch.int32), torch.tensor([[0, 1, 2]]), index, next_token,
                           next_sibling, torch.tensor([[9, 9, 9]]))


@pytest.mark.parametrize(
    "field, value, root_target",
    [("next_token", 5, 1), ("next_sibling", -2, 2), ("index", 99, 1)],  # root_target 1 accepts node 1
)
def test_out_of_range_links_raise(field, value, root_target):
    index, next_token, next_sibling = links_from_parents([[-1, 0, 0]])
    {"next_token": next_token, "next_sibling": next_sibling, "index": index}[field][0, 1] = value
    with pytest.raises(ValueError, match="invalid draft tree"):
        verify_tree_greedy(torch.zeros(3, dtype=torch.int32), torch.full((1, 3), -1, dtype=torch.int32),
                           torch.zeros(1, dtype=torch.int32), torch.tensor([[0, 1, 2]]), index, next_token,
                           next_sibling, torch.tensor([[root_target, 0, 9]]))


@pytest.mark.parametrize(
    "key, bad",
    [
        ("predicts", torch.zeros(3, dtype=torch.int64)),
        ("accept_index", torch.zeros(1, 3, dtype=torch.int64)),
        ("accept_token_num", torch.zeros(2, dtype=torch.int32)),
        ("candidates", torch.zeros(1, 3, dtype=torch.int32)),
        ("retrive_next_token", torch.zeros(1, 4, dtype=torch.int64)),
        ("target_predict", torch.zeros(1, 6, dtype=torch.int64)[:, ::2]),
    ],
)
def test_validation(key, bad):
    index, next_token, next_sibling = links_from_parents([[-1, 0, 0]])
    args = dict(predicts=torch.zeros(3, dtype=torch.int32), accept_index=torch.zeros(1, 3, dtype=torch.int32),
                accept_token_num=torch.zeros(1, dtype=torch.int32), candidates=torch.zeros(1, 3, dtype=torch.int64),
                retrive_index=index, retrive_next_token=next_token, retrive_next_sibling=next_sibling,
                target_predict=torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=key):
        verify_tree_greedy(**{**args, key: bad})
