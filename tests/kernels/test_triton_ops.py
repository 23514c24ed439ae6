"""The Triton ops equal their torch references exactly (``torch.equal`` on every output) over random
valid trees, and fail like them on malformed ones.

CPU: Triton's interpreter (see tests/triton_env.py); each test here sets TRITON_INTERPRET again so
the public ops pick Triton.
With a GPU the module leaves the variable alone: CPU cases skip and the ``gpu`` cases run the
compiled kernels.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specdec.kernels import residual as residual_draw

from ..triton_env import import_kernels, kernel_devices

triton_verify = import_kernels("specdec.kernels.triton.verify")
triton_tree_build = import_kernels("specdec.kernels.triton.tree_build")
import_kernels("specdec.kernels.triton.simulate")
import_kernels("specdec.kernels.triton.frontier")
import_kernels("specdec.kernels.triton.replay")

from specdec import kernels as K  # noqa: E402
from specdec.kernels.dispatch import TRITON_IMPLS, select_impl  # noqa: E402

DEVICES = kernel_devices(triton_tree_build._build_tree_kernel)
POISON = -7


pytestmark = pytest.mark.usefixtures("triton_interpreter")


def cases(device: str, cpu: int, gpu: int) -> range:
    return range(cpu if device == "cpu" else gpu)


def test_dispatch(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert select_impl("verify_tree_greedy", K.verify_tree_greedy_ref, cpu) is triton_verify.verify_tree_greedy
    assert set(TRITON_IMPLS) >= {"build_tree_kernel_efficient", "reconstruct_indices_from_tree_mask",
                                 "verify_tree_greedy", "tree_speculative_sampling_target_only", "segment_packbits",
                                 "assign_req_to_token", "compact_accepted_kv_locs", "draft_scratch_slots",
                                 "create_kv_indices", "create_kv_page_indices", "create_kv_layout", "move_kv_slots",
                                 "simulate_target_predict", "select_frontier", "replay_rows", "replay_root",
                                 "replay_advance", "replay_accept_cdf"}
    monkeypatch.delenv("TRITON_INTERPRET")
    assert select_impl("verify_tree_greedy", K.verify_tree_greedy_ref, cpu) is K.verify_tree_greedy_ref


def run_both(op, ref, args: list, device: str, **kwargs) -> None:
    """Run the public op on ``device`` and its reference on CPU copies; every tensor must agree."""
    ours = [a.clone().to(device) if isinstance(a, torch.Tensor) else a for a in args]
    theirs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    op(*ours, **kwargs)
    ref(*theirs, **kwargs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a.cpu(), b), f"argument {i} differs"


# --------------------------------------------------------------------------- random draft trees
def random_draft(rng: random.Random, bs: int, topk: int, depth: int, n: int, *, shuffle: bool = False):
    """parent_list [bs, topk*(depth-1)+1] and selected_index [bs, N-1] as the draft emits them:
    step 0's candidates are children of the root; step i's frontier is topk of step i-1's candidates
    and each branch gets topk children. Selected nodes are closed under parents (ascending, or
    shuffled to exercise non-topological orders)."""
    parent_lists, selected = [], []
    for _ in range(bs):
        parent_of = {s: -1 for s in range(topk)}
        prev, parents = list(range(topk)), [-1]
        for i in range(1, depth):
            frontier = rng.sample(prev, topk)
            prev = []
            for r, f in enumerate(frontier):
                parents.append(f)
                for c in range(topk):
                    s = topk + (i - 1) * topk * topk + r * topk + c
                    parent_of[s] = f
                    prev.append(s)
        chosen, avail = [], {s for s, p in parent_of.items() if p == -1}
        while len(chosen) < n - 1:
            s = rng.choice(sorted(avail))
            chosen.append(s)
            avail.remove(s)
            avail |= {c for c, p in parent_of.items() if p == s}
        parent_lists.append(parents if depth > 1 or rng.random() < 0.5 else [-1])
        selected.append(chosen if shuffle else sorted(chosen))
    width = max(len(p) for p in parent_lists)
    parent_lists = [p + [-1] * (width - len(p)) for p in parent_lists]
    return torch.tensor(parent_lists, dtype=torch.int64), torch.tensor(selected, dtype=torch.int64).view(bs, n - 1)


def tree_shape(rng: random.Random):
    topk, depth = rng.choice([1, 2, 3, 4]), rng.randint(1, 5)
    max_n = 1 + topk + (depth - 1) * topk * topk
    return topk, depth, rng.randint(1, min(max_n, 32))


def build_args(parent_list, selected, seq_lens, topk, depth, n, mode):
    bs = seq_lens.shape[0]
    if mode == K.TreeMaskMode.FULL_MASK:
        mask = torch.rand(int(seq_lens.sum()) * n + bs * n * n) < 0.5
    elif mode == K.TreeMaskMode.QLEN_ONLY:
        mask = torch.rand(bs * n * n) < 0.5
    else:
        dtype = random.choice({1: [torch.uint8], 2: [torch.uint8, torch.uint16], 4: [torch.uint8, torch.uint32]}[
            1 if n <= 8 else 2 if n <= 16 else 4])
        nbytes = 1 if n <= 8 else 2 if n <= 16 else 4
        mask = torch.randint(0, 256, (bs * n * nbytes,), dtype=torch.uint8).view(dtype)
    out = torch.full((bs * n,), POISON, dtype=torch.int64)
    links = [torch.full((bs, n), POISON, dtype=torch.int64) for _ in range(3)]
    return [parent_list, selected, seq_lens, mask, out, *links, topk, depth, n, int(mode)]


@pytest.mark.parametrize("mode", list(K.TreeMaskMode))
@pytest.mark.parametrize("device", DEVICES)
def test_build_tree_random(device, mode):
    rng = random.Random(int(mode))
    for case in cases(device, 6, 60):
        topk, depth, n = tree_shape(rng)
        bs = rng.choice([1, 2, 3, 7, 13])
        parent_list, selected = random_draft(rng, bs, topk, depth, n, shuffle=case % 3 == 2)
        seq_lens = torch.tensor([rng.randint(0, 40) for _ in range(bs)])
        args = build_args(parent_list, selected, seq_lens, topk, depth, n, mode)
        run_both(K.build_tree_kernel_efficient, K.build_tree_kernel_efficient_ref, args, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "parent_list, selected, n, message",
    [
        ([[-1, 0, 1, 8, 6]], [6, 8], 3, "cycle"),
        ([[-1, 0, 1, 6, 4]], [6], 2, "cycle"),
        ([[-1, 0, 1, 2, 4]], [6], 2, "not among the selected"),
        ([[-1, 0, 1, 2, 4]], [40], 2, "past parent_list"),
        ([[-1, 0, 1, 2, 4]], [-3], 2, "negative"),
    ],
)
def test_build_tree_malformed(device, parent_list, selected, n, message):
    """CPU: raises like the ref. CUDA: no sync and no raise; the flag names the problem, bounded."""
    args = build_args(torch.tensor(parent_list), torch.tensor([selected]), torch.tensor([4]), 2, 3, n,
                      K.TreeMaskMode.QLEN_ONLY)
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    if device == "cpu":
        with pytest.raises(ValueError, match=f"invalid draft tree: .*{message}"):
            K.build_tree_kernel_efficient(*args)
    else:
        flag = torch.zeros(1, dtype=torch.int32, device=device)
        triton_tree_build.build_tree_kernel_efficient(*args, error_flag=flag)
        assert int(flag) != 0 and message in f"{triton_tree_build._BUILD_ERRORS[int(flag) & 15]} among the selected"


@pytest.mark.parametrize("device", DEVICES)
def test_reconstruct_random(device):
    rng = random.Random(1)
    for case in cases(device, 6, 60):
        topk, depth, n = tree_shape(rng)
        bs = rng.choice([1, 2, 5, 11])
        if case % 2:  # any mask, tree or not: reconstruct never walks
            mask = torch.rand(bs * n * n) < 0.4
        else:
            parent_list, selected = random_draft(rng, bs, topk, depth, n)
            args = build_args(parent_list, selected, torch.zeros(bs, dtype=torch.int64), topk, depth, n,
                              K.TreeMaskMode.QLEN_ONLY)
            K.build_tree_kernel_efficient_ref(*args)
            mask = args[3]
        seq_lens = torch.randint(0, 50, (bs,))
        outs = [torch.full((bs * n,), POISON, dtype=torch.int64)] + [torch.full((bs, n), POISON) for _ in range(3)]
        run_both(K.reconstruct_indices_from_tree_mask, K.reconstruct_indices_from_tree_mask_ref,
                 [mask, seq_lens, *outs, bs, n], device)


# --------------------------------------------------------------------------- verification
def random_links(rng: random.Random, bs: int, n: int):
    """Random trees in topological order: retrive_index / next_token / next_sibling [bs, N]."""
    parents = [[-1] + [rng.randrange(t) for t in range(1, n)] for _ in range(bs)]
    next_token, next_sibling = torch.full((2, bs, n), -1, dtype=torch.int64)
    for b, par in enumerate(parents):
        last = {}
        for c in range(1, n):
            if par[c] in last:
                next_sibling[b, last[par[c]]] = c
            else:
                next_token[b, par[c]] = c
            last[par[c]] = c
    return parents, torch.arange(bs * n).view(bs, n), next_token, next_sibling


def verify_outputs(bs: int, n: int, num_spec: int):
    return [torch.full((bs * n,), POISON, dtype=torch.int32), torch.full((bs, num_spec), -1, dtype=torch.int32),
            torch.full((bs,), POISON, dtype=torch.int32)]


@pytest.mark.parametrize("device", DEVICES)
def test_verify_greedy_random(device):
    rng = random.Random(2)
    for _ in cases(device, 8, 80):
        bs = rng.choice([1, 2, 3, 7] if device == "cpu" else [1, 2, 7, 31, 64])
        n, vocab = rng.randint(1, 10 if device == "cpu" else 24), rng.choice([3, 5, 11])
        parents, index, next_token, next_sibling = random_links(rng, bs, n)
        candidates = torch.randint(0, vocab, (bs, n))
        target = torch.randint(0, vocab, (bs, n))
        num_spec = rng.randint(1, n + 1)
        args = [*verify_outputs(bs, n, num_spec), candidates, index, next_token, next_sibling, target]
        run_both(K.verify_tree_greedy, K.verify_tree_greedy_ref, args, device)


def sampling_case(rng: random.Random, nrng: np.random.Generator, bs: int, n: int, vocab: int):
    parents, index, next_token, next_sibling = random_links(rng, bs, n)
    # few distinct tokens among siblings so both accept and reject paths run
    candidates = torch.from_numpy(nrng.integers(0, min(vocab, 6), (bs, n)))
    probs = nrng.dirichlet(np.full(vocab, 0.3), size=(bs, n)).astype(np.float32)
    coins = 1.0 - nrng.random((bs, n), dtype=np.float32)
    final = 1.0 - nrng.random(bs, dtype=np.float32)
    num_spec = rng.randint(1, n + 1)
    return [*verify_outputs(bs, n, num_spec), candidates, index, next_token, next_sibling,
            torch.from_numpy(coins), torch.from_numpy(final), torch.from_numpy(probs),
            torch.zeros(bs, n, vocab, dtype=torch.float32)]


def check_sampling(args, device, **thresholds):
    """Every output, the bonus draw included, equals the public ref's bit for bit (the draw is
    integer arithmetic, so the ref gives the same tokens on every device)."""
    run_both(K.tree_speculative_sampling_target_only, K.tree_speculative_sampling_target_only_ref, args, device,
             **thresholds)


def frontier_case(rng: random.Random, bs: int, k: int, h: int, *, ties: bool, broadcast: bool,
                   dtype=torch.float32):
    """select_frontier's arguments: frontier scores and child probabilities (coarse values when
    ``ties``, so equal scores occur; a broadcast model row when ``broadcast``, as the synthetic
    benchmark passes), tokens, features, and poisoned outputs."""
    def probs(*shape):
        p = torch.rand(*shape)
        return (p * 4).round() / 4 if ties else p
    scores = probs(bs, k)
    topk_p = probs(k).expand(bs * k, k) if broadcast else probs(bs * k, k)
    outs = [torch.full((bs, k, k), float(POISON)), torch.full((bs, k), float(POISON)),
            torch.full((bs, k), POISON, dtype=torch.int64), torch.full((bs, k), POISON, dtype=torch.int64),
            torch.full((bs * k,), POISON, dtype=torch.int64), torch.full((bs * k, h), float(POISON), dtype=dtype)]
    return [scores, topk_p, torch.randint(0, 10**5, (bs * k, k)), torch.randn(bs * k, h).to(dtype), *outs]


@pytest.mark.parametrize("device", DEVICES)
def test_select_frontier_random(device):
    """Bit-exact against the reference (stable order on ties, strided inputs, features wider and
    narrower than a column block, several blocks, none: a standalone draft's); then the worked example of the
    ref's docstring."""
    rng = random.Random(12)
    for case in cases(device, 8, 60):
        bs, k = rng.choice([1, 3, 8] if device == "cpu" else [1, 8, 64]), rng.randint(1, 10)
        args = frontier_case(rng, bs, k, [3, 64, 1100, 300, 0][case % 5], ties=case % 2 == 0, broadcast=case % 3 == 0,
                             dtype=[torch.float32, torch.bfloat16][case % 2])
        run_both(K.select_frontier, K.select_frontier_ref, args, device, parent_offset=rng.randint(0, 100))
    args = [torch.tensor([[0.6, 0.3]]), torch.tensor([[0.5, 0.2], [0.9, 0.1]]), torch.tensor([[10, 11], [12, 13]]),
            torch.tensor([[1.0], [2.0]]), *frontier_case(rng, 1, 2, 1, ties=False, broadcast=False)[4:]]
    K.select_frontier(*[a.to(device) for a in args[:4]], *(outs := [a.to(device) for a in args[4:]]), parent_offset=2)
    expand, best, parents, branch, ids, hidden = (o.cpu() for o in outs)
    assert torch.allclose(best, torch.tensor([[0.30, 0.27]])) and parents.tolist() == [[2, 4]]
    assert branch.tolist() == [[0, 1]] and ids.tolist() == [10, 12] and hidden.flatten().tolist() == [1.0, 2.0]
    args[1] = torch.full((2, 2), float("nan"))  # a broken draft: every index stays within the request
    K.select_frontier(*[a.to(device) for a in args[:4]], *(outs := [a.to(device) for a in args[4:]]), parent_offset=2)
    assert all(0 <= b < 2 for b in outs[3].flatten().tolist()) and set(outs[4].tolist()) <= {10, 11, 12, 13}


@pytest.mark.parametrize("device", DEVICES)
def test_select_draft_nodes_random(device):
    """Bit-exact against the reference: heavy ties (scores from a few values, 0 and 1 among them,
    -0.0 against +0.0), NaN scores, every N from 1 to the proposals; then the ref's example."""
    rng = random.Random(13)
    for case in cases(device, 10, 80):
        bs = rng.choice([1, 3] if device == "cpu" else [1, 8, 64])
        k, steps = rng.randint(1, 4 if device == "cpu" else 8), rng.randint(1, 3 if device == "cpu" else 6)
        m = k + (steps - 1) * k * k
        if case % 3 == 0:
            scores = torch.tensor(rng.choices([0.0, -0.0, 0.25, 0.5, 1.0], k=bs * m)).view(bs, m)
        else:
            scores = torch.rand(bs, m)
        if case % 4 == 1:
            scores[torch.rand(bs, m) < 0.2] = float("nan")
        tokens = torch.randint(0, 50000, (bs, m))
        kept = rng.randint(0, m)
        ours, theirs = ([torch.full((bs, kept), POISON, dtype=torch.int64) for _ in range(2)] for _ in range(2))
        K.select_draft_nodes(scores.to(device), tokens.to(device), *(ours := [o.to(device) for o in ours]))
        K.select_draft_nodes_ref(scores, tokens, *theirs)  # NOTE: not run_both: NaN != NaN in the inputs
        assert all(torch.equal(a.cpu(), b) for a, b in zip(ours, theirs)), (scores, kept)
    scores, tokens = torch.tensor([[0.6, 0.35, 0.30, 0.12, 0.315, 0.035]]), torch.arange(10, 16)[None]
    outs = [torch.full((1, 3), POISON, dtype=torch.int64, device=device) for _ in range(2)]
    K.select_draft_nodes(scores.to(device), tokens.to(device), *outs)
    assert outs[0].tolist() == [[0, 1, 4]] and outs[1].tolist() == [[10, 11, 14]]


def simulate_case(rng: random.Random, bs: int, n: int, k: int, depths: int, position_scale: int,
                  per_request: bool = False):
    """Arguments of simulate_target_predict: random trees, positions seq_len + tree depth (some past
    the cdf's rows, some huge so the hash's products wrap int64), a random cdf per depth and parent
    rank (1 to K parent rows; nodes of more children than K or of a rank past the last row);
    ``per_request``: one per request, half of them 0/1 steps (a replayed trace's fixed ranks)."""
    parents, _, next_token, next_sibling = random_links(rng, bs, n)
    seq_lens = torch.tensor([rng.randrange(position_scale) for _ in range(bs)])
    depth = torch.zeros(bs, n, dtype=torch.int64)
    for b, par in enumerate(parents):
        for t in range(1, n):
            depth[b, t] = depth[b, par[t]] + 1
    cdf = torch.rand(depths, rng.randint(1, k), k).cumsum(-1) / (k + 1)  # increasing rows below 1
    if per_request:
        cdf = torch.rand(bs, *cdf.shape).cumsum(-1) / (k + 1)
        ranks = torch.randint(0, k + 1, (bs, depths, 1, 1))  # k: no child
        steps = (torch.arange(k) >= ranks).float().expand_as(cdf)
        cdf = torch.where(torch.rand(bs, 1, 1, 1) < 0.5, steps, cdf).contiguous()
    cdf[..., -1, :, :] = 0.0  # leaves draw no child
    return [torch.randint(0, 1000, (bs, n)), torch.randint(1000, 2000, (bs, n)), seq_lens[:, None] + depth, seq_lens,
            next_token, next_sibling, cdf, torch.full((bs, n), POISON, dtype=torch.int64)]


@pytest.mark.parametrize("device", DEVICES)
def test_simulate_target_predict_random(device):
    """Bit-exact against the reference: hash, drawn rank (from one cdf, or each request's own), sibling
    walk, argmax fallback; the cases reach both outcomes (a drawn child's token, below 1000, and the
    argmax, 1000 and up)."""
    rng, outcomes = random.Random(11), set()
    for case in cases(device, 6, 60):
        bs, n, k = rng.choice([1, 3, 8] if device == "cpu" else [1, 7, 64]), rng.randint(1, 24), rng.randint(1, 8)
        args = simulate_case(rng, bs, n, k, rng.randint(1, 7), [10**4, 2**40][case % 2], per_request=case % 3 == 2)
        seed = rng.choice([0, 7, 2**63 - 1])
        run_both(K.simulate_target_predict, K.simulate_target_predict_ref, args, device, seed=seed)
        K.simulate_target_predict_ref(*args, seed=seed)
        outcomes |= {"drawn" if token < 1000 else "argmax" for token in args[-1].flatten().tolist()}
    assert outcomes == {"drawn", "argmax"}


def replay_tables(rng: random.Random, t: int, s: int, big_k: int):
    """A random trace's tables (probs, next_slot [T, S, K + 1, K], path_ranks [T, S]): sentinel slot K
    all 0 and pointing to itself, other slots' children recorded or not at random."""
    probs = torch.rand(t, s, big_k + 1, big_k)
    probs[:, :, big_k] = 0.0
    next_slot = torch.randint(0, big_k + 1, (t, s, big_k + 1, big_k))
    next_slot[:, :, big_k] = big_k
    path_ranks = torch.randint(-1, big_k, (t, s))
    return probs, next_slot, path_ranks


@pytest.mark.parametrize("device", DEVICES)
def test_replay_ops_random(device):
    """The trace replay's four ops equal their references exactly: the row hash (positions up to 2**40,
    so products wrap int64), the root and depth-1 children, a later frontier followed into the trace
    (its parents named by score index from an offset), the per-request 0/1 accept cdf at every S' <= S."""
    rng = random.Random(17)
    for case in cases(device, 6, 40):
        t, s, big_k = rng.randint(1, 40), rng.randint(2, 7), rng.randint(1, 8)
        bs, k = rng.choice([1, 3, 9] if device == "cpu" else [1, 7, 64, 300]), rng.randint(1, big_k)
        probs, next_slot, path_ranks = replay_tables(rng, t, s, big_k)
        keys = torch.tensor([rng.randrange([10**4, 2**40][case % 2]) for _ in range(bs)])
        row_table = torch.randint(0, t, (1 << rng.randint(0, 10),))
        seed = rng.choice([0, 7, 2**63 - 1])
        rows = torch.full((bs,), POISON)
        run_both(K.replay_rows, K.replay_rows_ref, [keys, row_table, rows], device, seed=seed)
        K.replay_rows_ref(keys, row_table, rows, seed=seed)
        assert ((rows >= 0) & (rows < t)).all()
        outs = [torch.full((bs, k), -1.0), torch.full((bs, k), POISON), torch.full((bs * k, k), -1.0)]
        run_both(K.replay_root, K.replay_root_ref, [rows, probs, next_slot, *outs[:2], None], device)
        run_both(K.replay_root, K.replay_root_ref, [rows, probs, next_slot, *outs], device)
        K.replay_root_ref(rows, probs, next_slot, *outs)
        depth, offset = rng.randint(1, s - 2) if s > 2 else None, rng.randint(0, 99)
        if depth is not None:
            parents = torch.randint(0, k * k, (bs, k)) + offset  # branch * k + child rank, from the offset
            run_both(K.replay_advance, K.replay_advance_ref,
                     [rows, outs[1], parents, probs, next_slot, torch.full((bs, k), POISON),
                      torch.full((bs * k, k), -1.0)], device, depth=depth, parent_offset=offset)
        cdf = torch.full((bs, rng.randint(1, s + 1), 1, k), -1.0)
        run_both(K.replay_accept_cdf, K.replay_accept_cdf_ref, [rows, path_ranks, cdf], device)


def test_replay_ops_reject_bad_arguments():
    probs, next_slot, path_ranks = replay_tables(random.Random(1), 4, 3, 2)
    rows, slots = torch.zeros(2, dtype=torch.int64), torch.zeros(2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="row_table: expected a power-of-two length"):
        K.replay_rows(torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), rows, seed=0)
    with pytest.raises(ValueError, match="keys"):
        K.replay_rows([1, 2], torch.zeros(4, dtype=torch.int64), rows, seed=0)
    with pytest.raises(ValueError, match="k: expected 1 <= k <= the trace's top-2"):
        K.replay_root(rows, probs, next_slot, torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int64), None)
    with pytest.raises(ValueError, match="new_slots: must not alias slots"):
        K.replay_advance(rows, slots, slots, probs, next_slot, slots, torch.zeros(4, 2), depth=1, parent_offset=0)
    with pytest.raises(ValueError, match="depth: expected 1 <= depth < 2"):
        K.replay_advance(rows, slots, slots.clone(), probs, next_slot, slots.clone(), torch.zeros(4, 2), depth=2,
                         parent_offset=0)
    with pytest.raises(ValueError, match="cdf: expected"):
        K.replay_accept_cdf(rows, path_ranks, torch.zeros(2, 5, 1, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_random(device):
    rng, nrng = random.Random(3), np.random.default_rng(3)
    for case in cases(device, 6, 60):
        bs, n = rng.choice([1, 2, 5] if device == "cpu" else [1, 5, 17, 64]), rng.randint(1, 12)
        vocab = rng.choice([7, 13, 130, 1001] if device == "cpu" else [7, 130, 1001, 32000, 128256])
        thresholds = {} if case % 3 else dict(threshold_single=rng.choice([0.2, 1.0]),
                                              threshold_acc=rng.choice([0.3, 0.7]))
        check_sampling(sampling_case(rng, nrng, bs, n, vocab), device, **thresholds)


@pytest.mark.parametrize("device", DEVICES)
def test_residual_draw_edges(device):
    """Every path ends in the residual draw: full path (p ignored), all rejected, coins 1.0 and
    0.0, and an all-zero residual (q's mass only on rejected tokens: the draw falls back to q)."""
    nrng = np.random.default_rng(4)
    for vocab, coin in [(129, 1.0), (300, 0.5), (5, 0.999999), (2049, 0.0)]:
        args = sampling_case(random.Random(vocab), nrng, 3, 4, vocab)
        args[8] = torch.full((3,), coin)
        check_sampling(args, device)
    probs = torch.zeros(2, 3, 6)
    probs[:, 0, 1:3] = 0.3  # root -> {1, 2} (tokens 1, 2); coin .9 rejects both: residual 0
    links = [torch.arange(6).view(2, 3), torch.tensor([[1, -1, -1]] * 2), torch.tensor([[-1, 2, -1]] * 2)]
    args = [*verify_outputs(2, 3, 3), torch.tensor([[0, 1, 2]] * 2), *links, torch.full((2, 3), 0.9),
            torch.tensor([0.2, 0.75]), probs, torch.zeros(2, 3, 6)]
    check_sampling(args, device)
    K.tree_speculative_sampling_target_only_ref(*args)
    assert args[0][[0, 3]].tolist() == [1, 2]  # from q(root): coin .2 -> token 1, coin .75 -> token 2


# --------------------------------------------------------------------------- the bonus draw alone
def draw_rows(nrng: np.random.Generator, bs: int, vocab: int):
    """[bs, vocab] q, p and [bs] coins covering the draw's edge cases row by row: plain residuals,
    p = q (all-zero residual -> fallback to q), q = 0 (-> vocab - 1), tiny masses around the 2**-40
    resolution (and subnormals), masses above 1 (clamped), coins 1 and 0."""
    q = nrng.dirichlet(np.full(vocab, 0.3), size=bs).astype(np.float32)
    p = (q * nrng.random((bs, vocab)) * (nrng.random((bs, vocab)) < 0.5)).astype(np.float32)
    coins = nrng.random(bs, dtype=np.float32)
    tiny = np.array([0.0, 2.0**-41, 2.0**-40, 3 * 2.0**-41, 1e-45, 1e-30, 1e-9], dtype=np.float32)
    for b in range(bs):
        kind = b % 6
        if kind == 1:
            p[b] = q[b]
        elif kind == 2:
            q[b] = p[b] = 0.0
        elif kind == 3:  # 2**-41 and 1e-45 weigh 0, 2**-40 and 3 * 2**-41 weigh 1
            q[b], p[b] = nrng.choice(tiny, vocab), 0.0
        elif kind == 4:
            q[b, nrng.integers(0, vocab, 3)] = 3.0
            coins[b] = 1.0
        elif kind == 5:
            coins[b] = 0.0
    return torch.from_numpy(q), torch.from_numpy(p), torch.from_numpy(coins)


@pytest.mark.parametrize("device", DEVICES)
def test_residual_draw_equals_ref(device):
    """The Triton draw (block sums over a split vocab, then cumsums) equals ``residual_draw_ref``
    exactly, for vocab sizes around the block size and not powers of two."""
    nrng = np.random.default_rng(9)
    vocabs = [1, 5, 17, 130, 2047, 2049, 6001, 32003] if device == "cpu" else [
        1, 17, 2049, 32000, 128256, 151936, 256000]
    for vocab in vocabs:
        q, p, coins = draw_rows(nrng, 64 if device == "cuda" else 12 if vocab < 10000 else 6, vocab)
        theirs = residual_draw.residual_draw_ref(q, p, coins)
        for _ in range(1 if device == "cpu" else 5):  # repeats: the row's last program picks (a race if wrong)
            ours = triton_verify.residual_draw(q.to(device), p.to(device), coins.to(device)).cpu()
            assert torch.equal(ours, theirs), f"vocab {vocab}"


@pytest.mark.gpu
def test_sampling_replays_from_cuda_graph():
    """Captured once and replayed on fresh inputs (no host sync inside; the draw's tickets reset
    on every replay), the op still equals the ref."""
    rng, nrng = random.Random(12), np.random.default_rng(12)

    def fresh():
        args = sampling_case(rng, nrng, 17, 8, 32000)
        args[1] = torch.full((17, 4), -1, dtype=torch.int32)  # a fixed num_spec for the static buffers
        return args

    static = [a.cuda() for a in fresh()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        K.tree_speculative_sampling_target_only(*static)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        K.tree_speculative_sampling_target_only(*static)
    for _ in range(3):
        args = fresh()
        for buf, a in zip(static, args):
            buf.copy_(a)
        graph.replay()
        K.tree_speculative_sampling_target_only_ref(*args)
        for i, (buf, a) in enumerate(zip(static, args)):
            assert torch.equal(buf.cpu(), a), f"argument {i} differs"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("broken", ["sibling cycle", "next_token", "retrive_index", "token"])
def test_walk_malformed(device, broken):
    _, index, next_token, next_sibling = random_links(random.Random(5), 2, 4)
    next_token[1], next_sibling[1] = torch.tensor([1, -1, -1, -1]), torch.tensor([-1, 2, 3, -1])  # root -> 1, 2, 3
    candidates = torch.tensor([[0, 0, 0, 0], [0, 9, 8, 7]])
    if broken == "sibling cycle":
        next_sibling[1, 3] = 1
    elif broken == "next_token":
        next_token[1, 0] = 4
    elif broken == "retrive_index":
        index[1, 0] = 8
    else:
        candidates[1, 2] = 99
    args = [*verify_outputs(2, 4, 3), candidates, index, next_token, next_sibling,
            torch.ones(2, 4), torch.full((2,), 0.5), torch.full((2, 4, 10), 0.1), torch.zeros(2, 4, 10)]
    args = [a.to(device) for a in args]
    if device == "cpu":
        with pytest.raises(ValueError, match=broken):
            K.tree_speculative_sampling_target_only(*args)
        if broken != "token":  # greedy compares tokens, it never indexes by them
            with pytest.raises(ValueError, match=broken):
                K.verify_tree_greedy(*args[:7], torch.full((2, 4), 5))
    else:
        flag = torch.zeros(2, dtype=torch.int32, device=device)
        triton_verify.tree_speculative_sampling_target_only(*args, error_flag=flag)
        assert flag.tolist()[0] == 0 and flag.tolist()[1] != 0


# --------------------------------------------------------------------------- segment_packbits
@pytest.mark.parametrize("device", DEVICES)
def test_segment_packbits_random(device):
    rng = random.Random(6)
    for _ in cases(device, 4, 40):
        bs = rng.choice([1, 2, 7, 13])
        lengths = [rng.choice([0, 1, 7, 8, 9, 64, 1000, rng.randint(0, 3000)]) for _ in range(bs)]
        in_ptr = torch.tensor([0] + np.cumsum(lengths).tolist(), dtype=torch.int32)
        gaps = [rng.randint(0, 3) for _ in range(bs)]
        out_starts = np.cumsum([0] + [(length + 7) // 8 + g for length, g in zip(lengths, gaps)])
        out_ptr = torch.tensor(out_starts.tolist(), dtype=torch.int32)
        x = torch.rand(int(in_ptr[-1])) < 0.5
        y = torch.randint(0, 256, (int(out_ptr[-1]) + 3,), dtype=torch.uint8)
        run_both(K.segment_packbits, K.segment_packbits_ref, [x, in_ptr, out_ptr, y, bs], device)


# --------------------------------------------------------------------------- torch.library registration
@pytest.mark.parametrize("device", DEVICES)
def test_custom_ops_pass_opcheck(device):
    """Schemas declare every mutated argument and the fake impls trace (torch.compile / graphs)."""
    parent_list, selected = random_draft(random.Random(7), 2, 2, 3, 6)
    args = build_args(parent_list, selected, torch.tensor([3, 5]), 2, 3, 6, K.TreeMaskMode.QLEN_ONLY)
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    flag = torch.zeros(2, dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.specdec.build_tree_kernel_efficient.default, (*args[:8], flag, *args[8:]))
    _, index, next_token, next_sibling = random_links(random.Random(8), 2, 5)
    vargs = [*verify_outputs(2, 5, 3), torch.randint(0, 3, (2, 5)), index, next_token, next_sibling,
             torch.randint(0, 3, (2, 5)), flag.cpu()]
    torch.library.opcheck(torch.ops.specdec.verify_tree_greedy.default, [a.to(device) for a in vargs])
    sargs = [a.to(device) for a in sampling_case(random.Random(9), np.random.default_rng(9), 2, 5, 33)]
    torch.library.opcheck(torch.ops.specdec.tree_speculative_sampling_target_only.default, [*sargs, flag, 1.0, 1.0])
    fargs = [a.to(device) for a in frontier_case(random.Random(13), 2, 3, 8, ties=False, broadcast=False)]
    torch.library.opcheck(torch.ops.specdec.select_frontier.default, [*fargs, 3])
    margs = [a.to(device) for a in simulate_case(random.Random(10), 2, 5, 3, 4, 100)]
    torch.library.opcheck(torch.ops.specdec.simulate_target_predict.default, [*margs, 3])
    probs, next_slot, path_ranks = (a.to(device) for a in replay_tables(random.Random(12), 5, 4, 3))
    rows = torch.tensor([4, 0], device=device)
    slots, parents = (torch.randint(0, 3, (2, 3), device=device) for _ in range(2))
    torch.library.opcheck(torch.ops.specdec.replay_rows.default,
                          [torch.tensor([5, 2**40], device=device), torch.arange(8, device=device) % 5, rows.clone(), 3])
    torch.library.opcheck(torch.ops.specdec.replay_root.default,
                          [rows, probs, next_slot, torch.zeros(2, 3, device=device), slots.clone(),
                           torch.zeros(6, 3, device=device)])
    torch.library.opcheck(torch.ops.specdec.replay_advance.default,
                          [rows, slots, parents, probs, next_slot, slots.clone(), torch.zeros(6, 3, device=device), 1, 0])
    torch.library.opcheck(torch.ops.specdec.replay_accept_cdf.default,
                          [rows, path_ranks, torch.zeros(2, 5, 1, 3, device=device)])


@pytest.mark.parametrize("device", DEVICES)
def test_mask_custom_ops_pass_opcheck(device):
    """As above, for the ops that read a tree mask: reconstruct_indices_from_tree_mask, segment_packbits."""
    bs, n = 2, 5
    mask = (torch.rand(bs * n * n) < 0.5).to(device)
    outs = [torch.full(shape, POISON, device=device) for shape in [(bs * n,), (bs, n), (bs, n), (bs, n)]]
    torch.library.opcheck(torch.ops.specdec.reconstruct_indices_from_tree_mask.default,
                          (mask, torch.tensor([3, 5], device=device), *outs, bs, n))
    indptr = torch.tensor([0, n * n, 2 * n * n], dtype=torch.int32, device=device)
    out_indptr = torch.tensor([0, 4, 8], dtype=torch.int32, device=device)
    flag = torch.zeros(bs, dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.specdec.segment_packbits.default,
                          (mask, indptr, out_indptr, torch.zeros(8, dtype=torch.uint8, device=device), flag, bs))
