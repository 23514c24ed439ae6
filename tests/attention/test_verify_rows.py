"""``decode_attention_rows``' node groups (a request's verify nodes in one query tile, sharing its prefix
tiles) against the per-node grid, bit for bit, and both against the reference.

Random trees of several requests over shuffled slots: prefixes that end inside a tile, on a tile's
edge and past several tiles, a chain as deep as the decode kernel's tail, node groups that fill a query tile,
leave it part empty, take a program's two query tiles or several programs (GQA groups 1-8), one or
several KV splits.
CPU runs the kernels interpreted (16-entry tiles); the GPU test compiles them (the tensor-core
products whose rows must not depend on their tile's other rows are the point there)."""

from __future__ import annotations

import pytest
import torch

from ..triton_env import import_kernels, kernel_devices, rand

kernels = import_kernels("specdec.attention.triton_kernels.verify_rows")
decode_attention_rows = kernels.decode_attention_rows
decode_attention_rows_ref = kernels.decode_attention_rows_ref
decode_kernels = import_kernels("specdec.attention.triton_kernels.decode")
decode_plan = decode_kernels.decode_plan

pytestmark = pytest.mark.usefixtures("triton_interpreter")
D = 16


def random_trees(prefixes: list[int], nodes: int, *, seed: int, num_slots: int, chain: bool = False):
    """(kv_table [bs * nodes, stride] int32, row_lens [bs * nodes] int32): request b's
    nodes list its prefix's slots, then their ancestors' and their own (node 0 the root, each other
    node's parent an earlier node; under ``chain`` the one before it)."""
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_slots, generator=gen).tolist()
    stride = max(prefixes) + nodes
    table = torch.zeros(len(prefixes) * nodes, stride, dtype=torch.int32)
    lens = []
    for b, prefix in enumerate(prefixes):
        own = [slots.pop() for _ in range(prefix + nodes)]
        parents = [-1] + [i - 1 if chain else int(torch.randint(0, i, (), generator=gen)) for i in range(1, nodes)]
        for i in range(nodes):
            path, node = [], i
            while node >= 0:
                path.append(own[prefix + node])
                node = parents[node]
            row = own[:prefix] + path[::-1]
            table[b * nodes + i, : len(row)] = torch.tensor(row, dtype=torch.int32)
            lens.append(len(row))
    return table, torch.tensor(lens, dtype=torch.int32)


def run(op, device, *, hq, hkv, prefixes, nodes, dtype, num_splits=None, plan_seqs=None, grouped=True, seed=0,
        chain=False, head_dim=D):
    num_slots = max(max(prefixes) * 3, sum(prefixes) + len(prefixes) * nodes) + 400
    table, lens = random_trees(prefixes, nodes, seed=seed, num_slots=num_slots, chain=chain)
    k = rand(num_slots, hkv, head_dim, dtype=dtype, device=device, seed=seed + 1)
    v = rand(num_slots, hkv, head_dim, dtype=dtype, device=device, seed=seed + 2)
    q = rand(len(lens), hq, head_dim, dtype=dtype, device=device, seed=seed + 3)
    out = torch.full_like(q, float("nan"))
    extra = dict(nodes_per_seq=nodes) if grouped else {}
    op(q, k, v, table.to(device), lens.to(device), out, sm_scale=head_dim**-0.5, max_kv_len=max(prefixes) + 1,
       plan_seqs=plan_seqs or len(prefixes), num_splits=num_splits, **extra)
    return out


CASES = [  # (hq, hkv, prefixes, nodes): GQA group, where prefixes end, tree size
    (4, 2, [15, 16, 17], 5),  # group 2: 8 nodes a tile
    (8, 2, [47, 3, 64], 8),  # group 4: two query tiles of 4 nodes, one program a request
    (8, 2, [50, 20], 9),  # three tiles: two programs a request, the second's second tile empty
    (3, 1, [33, 100], 7),  # group 3: 5 nodes a tile (one row left empty), then 2
    (8, 1, [40], 4),  # group 8: 2 nodes a tile
    (2, 2, [20, 31, 0], 16),  # MHA: 16 nodes a tile; a chain as deep as the decode kernel's tail
]


@pytest.mark.parametrize("device", kernel_devices(kernels._node_group_kernel))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("hq, hkv, prefixes, nodes", CASES)
def test_node_groups_equal_the_per_node_grid_bit_for_bit(device, dtype, num_splits, hq, hkv, prefixes, nodes,
                                                         monkeypatch):
    args = dict(hq=hq, hkv=hkv, prefixes=prefixes, nodes=nodes, dtype=dtype, num_splits=num_splits)
    launches = []
    launch = kernels._launch_node_groups
    monkeypatch.setattr(kernels, "_launch_node_groups", lambda *a, **kw: launches.append(1) or launch(*a, **kw))
    grouped = run(decode_attention_rows, device, **args)
    assert launches == [1]  # the node-group grid ran
    per_node = run(decode_attention_rows, device, grouped=False, **args)
    assert grouped.isfinite().all()
    assert torch.equal(grouped, per_node)
    ref = run(decode_attention_rows_ref, device, grouped=False, **args)
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(grouped.float(), ref.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("device", kernel_devices(kernels._node_group_kernel))
@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("hq, hkv, prefixes, nodes", [CASES[1], CASES[5]])
def test_node_group_chains_equal_the_per_node_grid_bit_for_bit(device, num_splits, hq, hkv, prefixes, nodes):
    """A chain: one pass over the ancestors' tile, from the last node's list, serves every node of a
    query tile (each row's entries past its own length not visible to it); across a tile's edge too."""
    args = dict(hq=hq, hkv=hkv, prefixes=prefixes, nodes=nodes, dtype=torch.bfloat16, num_splits=num_splits,
                chain=True)
    grouped = run(decode_attention_rows, device, **args)
    assert grouped.isfinite().all()
    assert torch.equal(grouped, run(decode_attention_rows, device, grouped=False, **args))


@pytest.mark.gpu
@pytest.mark.parametrize("nodes", [8, 12])
@pytest.mark.parametrize("chain", [False, True])
def test_node_groups_under_the_streaming_plan_equal_the_per_node_grid(chain, nodes):
    """Llama-3-8B's heads (32 query, 8 KV, 128 wide) verifying 8- and 12-node trees and chains for 64 requests
    at contexts of 0.3-1.1 k: the decode batch's unsplit streaming plan (64-entry tiles, its own warps), the
    plan of the large-batch verify forwards (12 nodes: two programs a request)."""
    prefixes = torch.randint(300, 1100, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    q = torch.empty(64 * nodes, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(1, 8, 128, device="cuda", dtype=torch.bfloat16)
    plan = decode_plan(q, k, max_kv_len=max(prefixes) + 1, plan_seqs=64, num_splits=None, window=None)
    assert plan.streaming and plan.splits == 1 and plan.block_n == 64  # 32-row node tiles, row sums by product
    args = dict(hq=32, hkv=8, prefixes=prefixes, nodes=nodes, dtype=torch.bfloat16, chain=chain, head_dim=128)
    grouped = run(decode_attention_rows, "cuda", **args)
    assert grouped.isfinite().all()
    assert torch.equal(grouped, run(decode_attention_rows, "cuda", grouped=False, **args))


@pytest.mark.parametrize("device", kernel_devices(kernels._node_group_kernel))
def test_node_groups_follow_the_decode_plan(device):
    """The plan (``plan_seqs``: the decode batch's split count) changes the bits alike on both grids,
    so the check above is not vacuous: a different split count gives different fp32 bits (the lists
    span several tiles of the device: 16 entries interpreted, 128 compiled)."""
    prefixes = [90, 70] if device == "cpu" else [900, 700]
    args = dict(hq=8, hkv=2, prefixes=prefixes, nodes=6, dtype=torch.float32)
    one = run(decode_attention_rows, device, num_splits=1, **args)
    three = run(decode_attention_rows, device, num_splits=3, **args)
    assert not torch.equal(one, three)
    torch.testing.assert_close(one, three, rtol=1e-5, atol=1e-5)


def test_node_groups_check_their_arguments():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = dict(hq=4, hkv=2, prefixes=[5, 6], nodes=3, dtype=torch.float32)
    with pytest.raises(ValueError, match="nodes_per_seq=4"):
        run(lambda *a, nodes_per_seq, **kw: decode_attention_rows(*a, nodes_per_seq=4, **kw), device, **args)


@pytest.mark.parametrize("device", kernel_devices(kernels._node_group_kernel))
def test_trees_past_the_decode_tail_run_the_per_node_grid(device, monkeypatch):
    """A tree of more than DECODE_TAIL nodes may have a node whose body passes its request's prefix: it runs the
    per-node grid, not node groups."""
    launches = []
    launch = kernels._launch_node_groups
    monkeypatch.setattr(kernels, "_launch_node_groups", lambda *a, **kw: launches.append(1) or launch(*a, **kw))
    args = dict(hq=2, hkv=2, prefixes=[20, 31, 0], nodes=kernels.DECODE_TAIL + 2, dtype=torch.float32, chain=True)
    out = run(decode_attention_rows, device, **args)
    assert launches == []
    assert torch.equal(out, run(decode_attention_rows, device, grouped=False, **args))
    torch.testing.assert_close(out, run(decode_attention_rows_ref, device, grouped=False, **args), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("device", kernel_devices(kernels._node_group_kernel))
@pytest.mark.parametrize("block_n", [32, 64])
def test_node_groups_fold_several_nodes_tails_in_one_tile(device, block_n, monkeypatch):
    """With KV tiles wider than DECODE_TAIL (a GPU's: 64 or 128 entries) the bodies fold in those tiles and, in 16-bit
    tiles on a GPU, one tile holds several nodes' tails side by side, a row's product with it taking its own node's
    columns among others' zeros: still the decode step's bits (the interpreter's 16-entry tiles widened here for
    both grids; there and in fp32 a node's tail is a tile of its own, as the tests above check at the plan's
    widths)."""
    plan = kernels.decode_plan
    for module in (kernels, decode_kernels):
        monkeypatch.setattr(module, "decode_plan", lambda *a, **kw: plan(*a, **kw)._replace(block_n=block_n))
    for hq, hkv, prefixes, nodes in (CASES[1], CASES[5]):  # GQA 4 in two query tiles; MHA, 16 nodes a tile
        args = dict(hq=hq, hkv=hkv, prefixes=prefixes, nodes=nodes, dtype=torch.bfloat16)
        assert torch.equal(run(decode_attention_rows, device, **args),
                           run(decode_attention_rows, device, grouped=False, **args))


@pytest.mark.parametrize("device", kernel_devices(kernels._node_group_kernel))
@pytest.mark.parametrize("streaming", [False, True], ids=["decode-tile", "streaming"])
@pytest.mark.parametrize("hq, hkv, nodes, rows, pair", [(8, 2, 8, 32, False), (8, 2, 4, 16, False),
                                                       (8, 2, 12, 32, False), (2, 2, 16, 16, False)],
                         ids=["8-nodes-gqa4", "chain-gqa4", "12-nodes-gqa4", "16-nodes-mha"])
def test_node_groups_take_one_tile_of_up_to_32_rows_when_streaming(device, streaming, hq, hkv, nodes, rows, pair,
                                                                    monkeypatch):
    """Under the streaming plan a tree of 8 nodes under GQA 4 is one 32-row query tile (one product a prefix
    tile, not two 16-row ones), with the row sums as products in both grids, and a larger one takes more
    programs of one such tile (two would spill at the plan's 2 warps); other plans keep the decode kernel's
    16 rows (two tiles a program past 4 nodes). Either way each row equals the per-node grid's bit for bit."""
    launched = []
    kernel = kernels._node_group_kernel
    monkeypatch.setattr(kernels, "_node_group_kernel", type("K", (), {
        "__getitem__": lambda self, grid: lambda *a, **kw: launched.append(kw) or kernel[grid](*a, **kw)})())
    plan = kernels.decode_plan
    for module in (kernels, decode_kernels):  # the node groups' plan and the per-node grid's alike
        monkeypatch.setattr(module, "decode_plan", lambda *a, **kw: plan(*a, **kw)._replace(streaming=streaming))
    args = dict(hq=hq, hkv=hkv, prefixes=[40, 20], nodes=nodes, dtype=torch.float32)
    grouped = run(decode_attention_rows, device, **args)
    (kw,) = launched
    if not streaming:
        rows, pair = 16, nodes * hq // hkv > 16
    assert (kw["BLOCK_H"], kw["PAIR"]) == (rows, pair)
    assert torch.equal(grouped, run(decode_attention_rows, device, grouped=False, **args))
