"""KV-slot bookkeeping ops: worked examples against the references, then Triton == reference exactly
on random inputs (CPU through Triton's interpreter, CUDA compiled), and input validation.

NOTE: as in test_triton_ops.py, TRITON_INTERPRET is set only while the kernels are imported and
inside these tests, so other modules keep their CPU reference dispatch.
"""

from __future__ import annotations

import random

import pytest
import torch

from ..triton_env import import_kernels, kernel_devices

triton_cache_ops = import_kernels("specdec.kernels.triton.cache_ops")

from specdec import kernels as K  # noqa: E402

DEVICES = kernel_devices(triton_cache_ops._assign_kernel)
POISON = -7


pytestmark = pytest.mark.usefixtures("triton_interpreter")


def run_both(op, ref, args: list, device: str, **kwargs) -> None:
    ours = [a.clone().to(device) if isinstance(a, torch.Tensor) else a for a in args]
    theirs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    op(*ours, **kwargs)
    ref(*theirs, **kwargs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a.cpu(), b), f"argument {i} differs"


def random_table(rng: random.Random, max_reqs: int, ctx: int) -> torch.Tensor:
    return torch.randperm(max_reqs * ctx * 2)[: max_reqs * ctx].view(max_reqs, ctx).to(torch.int32)


# --------------------------------------------------------------------------- worked examples (refs)
def test_assign_example():
    table = torch.full((3, 6), POISON, dtype=torch.int32)
    K.assign_req_to_token_ref(table, torch.tensor([2, 0]), torch.tensor([3, 0]), torch.tensor([5, 1]),
                              torch.tensor([40, 41, 7]))
    assert table[2, 3:5].tolist() == [40, 41] and table[0, 0] == 7
    assert (table == POISON).sum() == 18 - 3


def test_compact_example():
    """N = 4, seq_len 10, row[10:14] = [50, 51, 52, 53], accept_index [0, 2, -1] (k = 1)."""
    table = torch.zeros(1, 16, dtype=torch.int32)
    table[0, 10:14] = torch.tensor([50, 51, 52, 53])
    src, dst, pos = torch.full((3, 1, 3), POISON, dtype=torch.int64)
    K.compact_accepted_kv_locs_ref(table, torch.tensor([0]), torch.tensor([10]), torch.tensor([[0, 2, -1]], dtype=torch.int32),
                                   torch.tensor([1]), src, dst, pos, num_draft_tokens=4)
    assert src.tolist() == [[50, 52, 50]] and dst.tolist() == [[50, 51, 50]] and pos.tolist() == [[10, 11, -1]]


def test_a_chain_needs_no_compaction():
    """topk = 1: node t of the chain sits at position seq_len + t, so an accepted prefix of the chain
    is already where it belongs (the worker skips the K/V move)."""
    n, bs = 5, 3
    table = torch.arange(2 * 16, dtype=torch.int32).view(2, 16) + 100
    rows, seq_lens = torch.tensor([1, 0, 1]), torch.tensor([3, 7, 0])
    lengths = torch.tensor([0, 2, 4], dtype=torch.int32)
    accept = torch.full((bs, n), -1, dtype=torch.int32)
    for b, k in enumerate(lengths.tolist()):
        accept[b, : k + 1] = torch.arange(k + 1, dtype=torch.int32) + b * n
    src, dst, pos = torch.full((3, bs, n), POISON, dtype=torch.int64)
    K.compact_accepted_kv_locs_ref(table, rows, seq_lens, accept, lengths, src, dst, pos, num_draft_tokens=n)
    assert torch.equal(src, dst)


def test_move_kv_example():
    """One layer, slots holding [a, b, c, d], src [[0, 2, 3]], dst [[0, 1, 2]] -> [a, c, d, d]."""
    k = torch.arange(4.0).view(1, 4, 1, 1)
    v = -k
    K.move_kv_slots_ref(k, v, torch.tensor([[0, 2, 3]]), torch.tensor([[0, 1, 2]]))
    assert k.flatten().tolist() == [0, 2, 3, 3] and v.flatten().tolist() == [0, -2, -3, -3]


def test_scratch_example_matches_draft_runner():
    """K = 2, S = 3, step 1, scratch_base 100, ancestors_in [[100], [101]], parent_branch [[1, 1]]."""
    anc, slots = torch.full((2, 2), POISON), torch.full((2,), POISON)
    K.draft_scratch_slots_ref(torch.tensor([[1, 1]]), torch.tensor([[100], [101]]), anc, slots,
                              scratch_base=100, num_steps=3, step=1)
    assert slots.tolist() == [102, 103] and anc.tolist() == [[101, 102], [101, 103]]


def test_page_indices_example():
    table = torch.zeros(1, 12, dtype=torch.int32)
    table[0, :9] = torch.tensor([28, 29, 30, 31, 8, 9, 10, 11, 20])
    out = torch.full((3,), POISON, dtype=torch.int32)
    K.create_kv_page_indices_ref(table, torch.tensor([0]), torch.tensor([9]), torch.tensor([0, 3]), out, page_size=4)
    assert out.tolist() == [7, 2, 5]


# --------------------------------------------------------------------------- Triton == reference
@pytest.mark.parametrize("device", DEVICES)
def test_assign_random(device):
    rng = random.Random(0)
    for _ in range(4 if device == "cpu" else 40):
        bs, ctx = rng.choice([1, 2, 7, 13]), rng.choice([5, 64, 300])
        table = random_table(rng, bs + 2, ctx)
        rows = torch.tensor(rng.sample(range(bs + 2), bs))
        starts = [rng.randint(0, ctx) for _ in range(bs)]
        ends = [rng.randint(s, ctx) for s in starts]
        locs = torch.randint(0, 10**6, (sum(e - s for s, e in zip(starts, ends)),))
        run_both(K.assign_req_to_token, K.assign_req_to_token_ref,
                 [table, rows, torch.tensor(starts), torch.tensor(ends), locs], device)


@pytest.mark.parametrize("device", DEVICES)
def test_compact_random(device):
    rng = random.Random(1)
    for _ in range(4 if device == "cpu" else 40):
        bs, n, num_spec = rng.choice([1, 3, 7]), rng.randint(1, 16), rng.randint(1, 6)
        ctx = 40
        table = random_table(rng, bs + 1, ctx)
        rows = torch.tensor(rng.sample(range(bs + 1), bs))
        seq_lens = torch.tensor([rng.randint(0, ctx - n) for _ in range(bs)])
        accept = torch.full((bs, num_spec), -1, dtype=torch.int32)
        lengths = []
        for b in range(bs):
            k = rng.randint(0, min(num_spec - 1, n - 1))
            nodes = [0] + sorted(rng.sample(range(1, n), k))
            accept[b, : k + 1] = torch.tensor(nodes) + b * n
            lengths.append(k)
        outs = [torch.full((bs, num_spec), POISON) for _ in range(3)]
        run_both(K.compact_accepted_kv_locs, K.compact_accepted_kv_locs_ref,
                 [table, rows, seq_lens, accept, torch.tensor(lengths, dtype=torch.int32), *outs], device,
                 num_draft_tokens=n)


def random_compaction(rng: random.Random, bs: int, num_slots: int, n: int, num_spec: int):
    """A verify's commit moves: request b's tree at slots ``base_b .. base_b + n - 1`` (disjoint),
    its accepted nodes (root first, increasing) moved to the front; padding src = dst = base."""
    bases = rng.sample(range(0, num_slots - n + 1, n), bs)
    src, dst = torch.empty(bs, num_spec, dtype=torch.int64), torch.empty(bs, num_spec, dtype=torch.int64)
    for b, base in enumerate(bases):
        k = rng.randint(0, min(num_spec - 1, n - 1))
        nodes = [0] + sorted(rng.sample(range(1, n), k)) + [0] * (num_spec - 1 - k)
        src[b] = torch.tensor(nodes) + base
        dst[b] = torch.tensor(list(range(k + 1)) + [0] * (num_spec - 1 - k)) + base
    return src, dst


@pytest.mark.parametrize("device", DEVICES)
def test_move_kv_random(device):
    """Overlapping compaction inside each group (a node moves onto a slot another entry reads),
    fp32, bf16 and FP8 caches, head rows wider and narrower than one column tile."""
    rng = random.Random(5)
    for case in range(6 if device == "cpu" else 30):
        bs, n, num_spec = rng.choice([1, 3, 8]), rng.randint(1, 12), rng.randint(1, 7)
        layers, heads, dim = rng.choice([1, 3]), rng.choice([1, 2, 8]), rng.choice([16, 64, 128])
        dtype = [torch.float32, torch.bfloat16, torch.float8_e4m3fn][case % 3]
        num_slots = n * (bs + 2)
        k = torch.randn(layers, num_slots, heads, dim).to(dtype)
        v = torch.randn(layers, num_slots, heads, dim).to(dtype)
        src, dst = random_compaction(rng, bs, num_slots, n, num_spec)
        run_both(K.move_kv_slots, K.move_kv_slots_ref, [k, v, src, dst], device)


def test_kv_cache_move_compacts_a_tree():
    """KVCache.move, as the worker calls it: node 3's K/V lands on node 1's slot while node 1's
    own K/V moves nowhere (it was rejected); the root and padding stay."""
    from specdec.attention.kv_cache import KVCache

    cache = KVCache(num_layers=2, num_slots=8, num_kv_heads=1, head_dim=2, dtype=torch.float32, device="cpu")
    cache.k.copy_(torch.arange(32.0).view(2, 8, 1, 2))
    cache.v.copy_(-cache.k)
    before = cache.k.clone()
    cache.move(torch.tensor([[4, 7, 4]]), torch.tensor([[4, 5, 4]]))  # tree at slots 4..7, path 0 -> 3
    expect = before.clone()
    expect[:, 5] = before[:, 7]
    assert torch.equal(cache.k, expect) and torch.equal(cache.v, -expect)


@pytest.mark.parametrize("device", DEVICES)
def test_scratch_random(device):
    rng = random.Random(2)
    for _ in range(4 if device == "cpu" else 40):
        bs, k, num_steps = rng.choice([1, 2, 5]), rng.randint(1, 4), rng.randint(2, 6)
        step = rng.randrange(num_steps - 1)
        branch = torch.randint(0, k, (bs, k))
        anc_in = torch.randint(0, 10**5, (bs * k, step))
        outs = [torch.full((bs * k, step + 1 + rng.randint(0, 2)), POISON), torch.full((bs * k,), POISON)]
        run_both(K.draft_scratch_slots, K.draft_scratch_slots_ref, [branch, anc_in, *outs], device,
                 scratch_base=rng.randint(0, 1000), num_steps=num_steps, step=step)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("device", DEVICES)
def test_kv_indices_random(device, page_size):
    rng = random.Random(3)
    for case in range(4 if device == "cpu" else 40):
        bs, ctx = rng.choice([1, 2, 7, 13]), rng.choice([17, 200])
        table = random_table(rng, bs + 1, ctx)
        rows = torch.tensor(rng.sample(range(bs + 1), bs))
        starts = [rng.randint(0, ctx // 2) if case % 2 and page_size == 1 else 0 for _ in range(bs)]
        lens = [rng.randint(0, ctx - s) for s in starts]
        counts = [-(-length // page_size) for length in lens]
        indptr = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)
        out = torch.full((sum(counts) + 2,), POISON, dtype=torch.int32)
        if page_size == 1:
            start = torch.tensor(starts) if case % 2 else None
            run_both(K.create_kv_indices, K.create_kv_indices_ref,
                     [table, rows, torch.tensor(lens), indptr, start, out], device)
        else:
            run_both(K.create_kv_page_indices, K.create_kv_page_indices_ref,
                     [table, rows, torch.tensor(lens), indptr, out], device, page_size=page_size)


def test_kv_layout_example():
    """The ref's docstring: rows [1, 0], prefixes [2, 1], 2 branches of width 1."""
    table = torch.arange(20, dtype=torch.int32).view(2, 10) + 100  # r2t[r, i] = 100 + 10 r + i
    indptr, out = torch.full((5,), POISON, dtype=torch.int32), torch.full((12,), POISON, dtype=torch.int32)
    K.create_kv_layout_ref(table, torch.tensor([1, 0]), torch.tensor([2, 1]), torch.tensor([[7], [8], [9], [5]]),
                           indptr, out)
    assert indptr.tolist() == [0, 3, 6, 8, 10]
    assert out[:10].tolist() == [110, 111, 7, 110, 111, 8, 100, 9, 100, 5] and out[10:].eq(POISON).all()


@pytest.mark.parametrize("device", DEVICES)
def test_kv_layout_random(device):
    """Verify / draft-extend layouts (one sequence a request, width = new tokens) and draft decode
    layouts (K branches a request, width = ancestors), prefixes of every length including 0."""
    rng = random.Random(5)
    for case in range(6 if device == "cpu" else 40):
        bs, ctx = rng.choice([1, 2, 7, 13]), rng.choice([17, 300])
        branches, width = rng.choice([(1, 1), (1, 4), (1, 32), (4, 1), (8, 5)])
        table = random_table(rng, bs + 1, ctx)
        rows = torch.tensor(rng.sample(range(bs + 1), bs))
        prefix = torch.tensor([rng.randint(0, ctx) if case % 3 else 0 for _ in range(bs)])
        wide = torch.randint(0, 10**6, (bs * branches, width + 2), dtype=rng.choice([torch.int32, torch.int64]))
        indptr = torch.full((bs * branches + 1,), POISON, dtype=torch.int32)
        out = torch.full((bs * branches * (ctx + width) + 3,), POISON, dtype=torch.int32)  # a static plan's bound
        run_both(K.create_kv_layout, K.create_kv_layout_ref, [table, rows, prefix, wide[:, 2:], indptr, out], device)
        # the draft's ancestors arrive as a column slice (strided rows), which run_both's clones would not keep
        got = [t.clone().to(device) for t in (indptr, out)]
        K.create_kv_layout(table.to(device), rows.to(device), prefix.to(device), wide.to(device)[:, :width], *got)
        K.create_kv_layout_ref(table, rows, prefix, wide[:, :width].contiguous(), indptr, out)
        assert torch.equal(got[0].cpu(), indptr) and torch.equal(got[1].cpu(), out)


# --------------------------------------------------------------------------- validation and errors
def test_validation_names_the_argument():
    table = torch.zeros(2, 8, dtype=torch.int32)
    ok = dict(req_to_token=table, req_pool_indices=torch.tensor([0]), start_offsets=torch.tensor([0]),
              end_offsets=torch.tensor([2]), out_cache_loc=torch.tensor([1, 2]))
    for key, bad in [("req_to_token", table.float()), ("req_pool_indices", torch.tensor([[0]])),
                     ("end_offsets", torch.tensor([2, 2])), ("out_cache_loc", torch.tensor([1.0, 2.0]))]:
        with pytest.raises(ValueError, match=key):
            K.assign_req_to_token(**{**ok, key: bad})
    with pytest.raises(ValueError, match="src_locs"):
        K.compact_accepted_kv_locs(table, torch.tensor([0]), torch.tensor([0]), torch.zeros(1, 2, dtype=torch.int32),
                                   torch.tensor([0]), torch.zeros(1, 3, dtype=torch.int64),
                                   torch.zeros(1, 2, dtype=torch.int64), torch.zeros(1, 2, dtype=torch.int64),
                                   num_draft_tokens=2)
    with pytest.raises(ValueError, match="ancestors_out"):
        K.draft_scratch_slots(torch.zeros(1, 2, dtype=torch.int64), torch.zeros(2, 1, dtype=torch.int64),
                              torch.zeros(2, 1, dtype=torch.int64), torch.zeros(2, dtype=torch.int64),
                              scratch_base=0, num_steps=3, step=1)
    cache, slots = torch.zeros(2, 4, 1, 16), lambda *shape: torch.zeros(*shape, dtype=torch.int64)
    for args, key in [((cache, cache[:, :3], slots(1, 2), slots(1, 2)), "v_cache"),
                      ((cache, cache, slots(2), slots(2)), "src_locs"),
                      ((cache, cache, slots(1, 2), slots(1, 3)), "dst_locs"),
                      ((cache, cache, slots(1, 257), slots(1, 257)), "src_locs")]:  # wider than MAX_MOVE_WIDTH
        with pytest.raises(ValueError, match=f"^{key}:"):
            K.move_kv_slots(*args)
    empty = torch.zeros(0, 4, 1, 16)  # a cache of no layers: nothing to move, no error
    K.move_kv_slots(empty, empty.clone(), slots(1, 2), slots(1, 2))
    with pytest.raises(ValueError, match="kv_indptr"):
        K.create_kv_indices(table, torch.tensor([0]), torch.tensor([2]), torch.tensor([0], dtype=torch.int32), None,
                            torch.zeros(2, dtype=torch.int32))


def out_of_range_calls() -> dict[str, tuple]:
    """By op: (arguments whose request 1 is out of range, the written tensor's index, the part of it
    request 0 may write); request 1 must write none of its part."""
    table = torch.zeros(2, 8, dtype=torch.int32)
    return {
        # request 1 assigns positions [6, 9) of an 8-slot row
        "assign_req_to_token": ([table, torch.tensor([0, 1]), torch.tensor([0, 6]), torch.tensor([2, 9]),
                                 torch.tensor([1, 2, 3, 4, 5])], 0, None),
        # request 1 lists a 9-token prefix of an 8-slot row
        "create_kv_layout": ([table, torch.tensor([0, 1]), torch.tensor([2, 9]), torch.zeros(2, 1, dtype=torch.int64),
                              torch.zeros(3, dtype=torch.int32), torch.full((20,), POISON, dtype=torch.int32)], 5, 3),
    }


@pytest.mark.parametrize("device", DEVICES)
def test_move_kv_out_of_range_is_flagged(device):
    """A group naming a slot past the cache: CPU raises naming the group; CUDA flags it and moves
    nothing of that group, while the valid group still moves."""
    k = torch.arange(8.0).view(1, 8, 1, 1).repeat(1, 1, 1, 16)
    src, dst = torch.tensor([[0, 3], [4, 9]]), torch.tensor([[0, 1], [4, 5]])
    with pytest.raises(ValueError, match="group 1"):
        K.move_kv_slots_ref(k.clone(), k.clone(), src, dst)
    k, src, dst = k.to(device), src.to(device), dst.to(device)
    if device == "cpu":
        with pytest.raises(ValueError, match="group 1"):
            K.move_kv_slots(k, k.clone(), src, dst)
    else:
        flag = torch.zeros(2, dtype=torch.int32, device=device)
        triton_cache_ops.move_kv_slots(k, k.clone(), src, dst, error_flag=flag)
        assert flag.tolist() == [0, 2]
        assert k[0, :, 0, 0].tolist() == [0, 3, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("op", ["assign_req_to_token", "create_kv_layout"])
@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_is_flagged(device, op):
    """CPU: the op (and the reference) raise ValueError naming request 1. CUDA: no raise, the flag
    set for request 1 and nothing of its written."""
    args, written, request0_end = out_of_range_calls()[op]
    with pytest.raises(ValueError):
        getattr(K, f"{op}_ref")(*[a.clone() for a in args])
    args = [a.to(device) for a in args]
    if device == "cpu":
        with pytest.raises(ValueError, match="request 1"):
            getattr(K, op)(*args)
    else:
        flag = torch.zeros(2, dtype=torch.int32, device=device)
        getattr(triton_cache_ops, op)(*args, error_flag=flag)
        assert flag.tolist() == [0, 2]
        if request0_end is None:  # assign: request 1's table row untouched
            assert args[written][1].eq(0).all()
        else:
            assert args[written][request0_end:].eq(POISON).all()


def valid_calls() -> dict[str, tuple]:
    """One valid call of each op (bs = 2) by name: (op, arguments by keyword)."""
    table, rows = torch.zeros(3, 8, dtype=torch.int32), torch.tensor([0, 2])
    lens, i64 = torch.tensor([2, 3]), dict(dtype=torch.int64)
    return {
        "assign_req_to_token": (K.assign_req_to_token, dict(
            req_to_token=table, req_pool_indices=rows, start_offsets=torch.tensor([0, 1]),
            end_offsets=torch.tensor([2, 3]), out_cache_loc=torch.arange(4))),
        "compact_accepted_kv_locs": (K.compact_accepted_kv_locs, dict(
            req_to_token=table, req_pool_indices=rows, seq_lens=torch.tensor([0, 2]),
            accept_index=torch.tensor([[0, 1], [2, -1]], dtype=torch.int32),
            accept_length=torch.tensor([1, 0], dtype=torch.int32), src_locs=torch.zeros(2, 2, **i64),
            dst_locs=torch.zeros(2, 2, **i64), positions=torch.zeros(2, 2, **i64), num_draft_tokens=2)),
        "draft_scratch_slots": (K.draft_scratch_slots, dict(
            parent_branch=torch.tensor([[0, 1], [1, 1]]), ancestors_in=torch.zeros(4, 1, **i64),
            ancestors_out=torch.zeros(4, 2, **i64), slots_out=torch.zeros(4, **i64), scratch_base=0, num_steps=3,
            step=1)),
        "create_kv_indices": (K.create_kv_indices, dict(
            req_to_token=table, req_pool_indices=rows, seq_lens=lens,
            kv_indptr=torch.tensor([0, 2, 5], dtype=torch.int32), kv_start_idx=torch.tensor([0, 1]),
            kv_indices=torch.zeros(5, dtype=torch.int32))),
        "create_kv_layout": (K.create_kv_layout, dict(
            req_to_token=table, req_pool_indices=rows, prefix_lens=lens, own=torch.zeros(4, 2, **i64),
            kv_indptr=torch.zeros(5, dtype=torch.int32), kv_indices=torch.zeros(18, dtype=torch.int32))),
        "create_kv_page_indices": (K.create_kv_page_indices, dict(
            req_to_token=table, req_pool_indices=rows, seq_lens=lens,
            page_indptr=torch.tensor([0, 1, 2], dtype=torch.int32), page_indices=torch.zeros(2, dtype=torch.int32),
            page_size=4)),
    }


@pytest.mark.parametrize(
    "op, key, bad",
    [
        ("assign_req_to_token", "req_pool_indices", torch.tensor(0)),  # 0 dims
        ("assign_req_to_token", "start_offsets", torch.tensor([0, 1], device="meta")),  # another device
        ("assign_req_to_token", "end_offsets", [2, 3]),  # not a tensor
        ("compact_accepted_kv_locs", "req_to_token", torch.zeros(8, 3, dtype=torch.int32).t()),  # not contiguous
        ("compact_accepted_kv_locs", "seq_lens", torch.tensor([0.0, 2.0])),
        ("compact_accepted_kv_locs", "accept_length", torch.tensor([1])),
        ("compact_accepted_kv_locs", "accept_index", torch.zeros(3, 2, dtype=torch.int32)),
        ("compact_accepted_kv_locs", "dst_locs", torch.zeros(2, 2, dtype=torch.int32)),
        ("compact_accepted_kv_locs", "positions", torch.zeros(2, 3, dtype=torch.int64)),
        ("compact_accepted_kv_locs", "num_draft_tokens", 0),
        ("draft_scratch_slots", "parent_branch", torch.zeros(2, 2)),
        ("draft_scratch_slots", "ancestors_in", torch.zeros(4, 0, dtype=torch.int64)),
        ("draft_scratch_slots", "slots_out", torch.zeros(3, dtype=torch.int64)),
        ("draft_scratch_slots", "step", 2),
        ("create_kv_indices", "seq_lens", torch.tensor([2, 3, 4])),
        ("create_kv_indices", "kv_start_idx", torch.tensor([0, 1], dtype=torch.int16)),
        ("create_kv_indices", "kv_indices", torch.zeros(5, 1, dtype=torch.int32)),
        ("create_kv_layout", "prefix_lens", torch.tensor([2])),
        ("create_kv_layout", "own", torch.zeros(3, 2, dtype=torch.int64)),  # not branches per request
        ("create_kv_layout", "kv_indptr", torch.zeros(4, dtype=torch.int32)),
        ("create_kv_page_indices", "page_indptr", torch.tensor([0, 1], dtype=torch.int32)),
        ("create_kv_page_indices", "page_indices", torch.zeros(2, dtype=torch.int32, device="meta")),
        ("create_kv_page_indices", "page_size", 0),
    ],
)
def test_every_op_names_the_bad_argument(op, key, bad):
    """Valid input takes the one-pass check; each kind of mismatch it rejects goes through the
    named checks (other device, dims, dtype, shape, contiguity, not a tensor, option range)."""
    fn, args = valid_calls()[op]
    fn(**args)
    with pytest.raises(ValueError, match=f"^{key}:"):
        fn(**{**args, key: bad})


@pytest.mark.parametrize("device", DEVICES)
def test_cache_custom_ops_pass_opcheck(device):
    """Schemas declare every mutated argument and the fake impls trace (torch.compile / graphs)."""
    def tensors(op: str) -> list:  # the custom ops take the public op's tensors, then the flag, then options
        return [v.to(device) for v in valid_calls()[op][1].values() if isinstance(v, torch.Tensor)]

    flag, ops = torch.zeros(2, dtype=torch.int32, device=device), torch.ops.specdec
    torch.library.opcheck(ops.assign_req_to_token.default, (*tensors("assign_req_to_token"), flag))
    torch.library.opcheck(ops.compact_accepted_kv_locs.default, (*tensors("compact_accepted_kv_locs"), flag, 2))
    torch.library.opcheck(ops.draft_scratch_slots.default,
                          (*tensors("draft_scratch_slots"), torch.zeros(4, dtype=torch.int32, device=device), 0, 3, 1))
    cache, slots = torch.zeros(2, 6, 2, 16, device=device), torch.tensor([[0, 3], [4, 2]], device=device)
    torch.library.opcheck(ops.move_kv_slots.default, (cache, cache.clone(), slots, slots.flip(1), flag))
    torch.library.opcheck(ops.create_kv_layout.default,
                          (*tensors("create_kv_layout"), torch.zeros(4, dtype=torch.int32, device=device)))
    table, rows, lens, indptr, start, out = tensors("create_kv_indices")
    for kv_start_idx in (start, None):
        torch.library.opcheck(ops.create_kv_indices.default, (table, rows, lens, indptr, kv_start_idx, out, flag, 1))
