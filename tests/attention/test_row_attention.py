"""Deterministic inference's attention: ``row_attention`` (fixed position splits) against its
reference, a row's bits depending on its KV list alone, and through both backends a verify node
equal bit for bit to the decode step at its position, eager and under the CUDA-graph (static) plan.

CPU runs the kernels in Triton's interpreter at tiny shapes (4 query / 2 KV heads, head_dim 16,
splits of 32 positions, 2 programs a row), with lists long enough to fold several splits into one
program; the same tests run compiled on a GPU (splits of 256)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from ..triton_env import import_kernels, rand

import_kernels("specdec.attention.triton_backend")

from specdec.attention import AttentionLayer, KVCache, create_attention_backend  # noqa: E402
from specdec.attention.triton_kernels import (  # noqa: E402
    decode_attention_rows,
    decode_attention_rows_ref,
    row_attention,
    row_attention_ref,
)
from specdec.forward import ForwardBatch, ForwardMode, batch_invariant  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HQ, HKV, D = 4, 2, 16


def kv_cache(num_slots: int, dtype: torch.dtype, seed: int = 0) -> KVCache:
    cache = KVCache(num_layers=1, num_slots=num_slots, num_kv_heads=HKV, head_dim=D, dtype=dtype, device=DEVICE)
    cache.k_buffers[0].copy_(rand(num_slots, HKV, D, dtype=dtype, device=DEVICE, seed=seed))
    cache.v_buffers[0].copy_(rand(num_slots, HKV, D, dtype=dtype, device=DEVICE, seed=seed + 1))
    return cache


def run_rows(lens: list[int], *, dtype=torch.bfloat16, max_kv_len: int | None = None, seed: int = 0, op=row_attention):
    """Rows of the given lengths over shuffled slots of one cache; returns (out, q, table)."""
    gen = torch.Generator().manual_seed(seed)
    stride = max(lens)
    table = torch.stack([torch.randperm(400, generator=gen)[:stride] for _ in lens]).to(torch.int32)
    cache = kv_cache(400, dtype)
    q = rand(len(lens), HQ, D, dtype=dtype, device=DEVICE, seed=seed + 2)
    out = torch.full_like(q, float("nan"))
    k, v = cache.get_kv(0)
    op(q, k, v, table.to(DEVICE), torch.arange(len(lens), device=DEVICE), torch.tensor(lens, dtype=torch.int32,
       device=DEVICE), out, sm_scale=D**-0.5, max_kv_len=max_kv_len or stride)
    return out, q, table


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_reference(dtype):
    lens = [1, 31, 32, 33, 64, 65, 97, 130]  # split edges (32), folded splits (> 64 at two programs)
    ours, _, _ = run_rows(lens, dtype=dtype)
    ref, _, _ = run_rows(lens, dtype=dtype, op=row_attention_ref)
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(ours.float(), ref.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def decode_rows(op, plan_seqs: int, num_splits: int | None = None):
    """``op`` (``decode_attention_rows`` or its reference) in ``run_rows``'s calling convention (each
    row reads its own table row, so the row list is not passed)."""
    def run(q, k, v, table, _row_list, lens, out, *, sm_scale, max_kv_len, **kw):
        extra = {} if num_splits is None else {"num_splits": num_splits}
        op(q, k, v, table, lens, out, sm_scale=sm_scale, max_kv_len=max_kv_len, plan_seqs=plan_seqs, **extra, **kw)
    return run


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("plan_seqs, num_splits", [(1, None), (8, None), (2, 3)])
def test_decode_rows_match_reference(dtype, plan_seqs, num_splits):
    """``decode_attention_rows`` (the default path's verify nodes as decode steps) against its
    reference, whatever the plan it is given (a split count and tiles, not the result)."""
    lens = [1, 15, 16, 17, 40, 97]
    ours, _, _ = run_rows(lens, dtype=dtype, op=decode_rows(decode_attention_rows, plan_seqs, num_splits))
    ref, _, _ = run_rows(lens, dtype=dtype, op=decode_rows(decode_attention_rows_ref, plan_seqs))
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(ours.float(), ref.float(), rtol=tol, atol=tol)


def run_windowed_rows(op, lens: list[int], window: int, *, poison: bool, dtype=torch.float32) -> torch.Tensor:
    """Rows of the given lengths over disjoint shuffled slots, a sliding ``window``; ``poison``: the
    entries before each row's window hold NaN (a kernel that reads one shows it)."""
    gen = torch.Generator().manual_seed(9)
    stride = max(lens)
    table = torch.randperm(len(lens) * stride, generator=gen).view(len(lens), stride).to(torch.int32)
    cache = kv_cache(len(lens) * stride, dtype)
    k, v = cache.get_kv(0)
    if poison:
        hidden = torch.cat([table[r, : max(0, n - window)] for r, n in enumerate(lens)]).long()
        k[hidden], v[hidden] = float("nan"), float("nan")
    q = rand(len(lens), HQ, D, dtype=dtype, device=DEVICE, seed=2)
    out = torch.full_like(q, float("nan"))
    op(q, k, v, table.to(DEVICE), torch.arange(len(lens), device=DEVICE),
       torch.tensor(lens, dtype=torch.int32, device=DEVICE), out, sm_scale=D**-0.5, max_kv_len=stride, window=window)
    return out


@pytest.mark.parametrize("window", [1, 20, 40, 200])
@pytest.mark.parametrize("kernel", ["row_attention", "decode_attention_rows"])
def test_kernels_with_window_read_the_window_alone(kernel, window):
    """A row sees its list's last ``window`` entries (the list is its positions up to its own): 20
    and 40 start mid-split and reach two or three 32-position splits, 200 is the whole list; both row
    kernels equal their reference and read nothing before the window."""
    ops = {"row_attention": (row_attention, row_attention_ref),
           "decode_attention_rows": (decode_rows(decode_attention_rows, 2, 3),
                                     decode_rows(decode_attention_rows_ref, 2))}
    op, ref_op = ops[kernel]
    lens = [1, 19, 33, 64, 97, 130]
    ours = run_windowed_rows(op, lens, window, poison=True)
    ref = run_windowed_rows(ref_op, lens, window, poison=False)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_a_row_depends_on_its_list_alone():
    """One row of 97 entries (three splits, two of them in program 0), alone at its own grid and
    inside batches of other rows with larger grids, is the same bits every time."""
    alone, _, _ = run_rows([97], seed=5)
    batched, _, _ = run_rows([97, 3, 150, 40], seed=5)  # seed 5: same first row's slots, q, cache
    wide, _, _ = run_rows([97], seed=5, max_kv_len=1000)
    assert torch.equal(alone[0], batched[0]) and torch.equal(alone, wide)


# ----------------------------------------------------------------------------- decode == verify node
# request 0:   0          request 1:  0 - 1 - 2 - 3 - 4  (a chain)
#             / \
#            1   2
#            |   |
#            3   4
TREES = [(-1, 0, 0, 1, 2), (-1, 0, 1, 2, 3)]
PREFIXES = [45, 70]  # with the 4 or 5 tree positions: two and three 32-position splits


def ancestors(parents: tuple[int, ...], node: int) -> list[int]:
    """Root first, ``node`` last."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def _batch(mode, positions, out_cache_loc, rows, prefix, extend, table, cache, backend, *, tree_mask=None,
           static: int | None = None) -> ForwardBatch:
    n = len(positions)
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=DEVICE)  # noqa: E731
    return ForwardBatch(
        forward_mode=mode, input_ids=torch.zeros(n, dtype=torch.int64, device=DEVICE), positions=t(positions),
        out_cache_loc=t(out_cache_loc), req_pool_indices=t(rows), prefix_lens=t(prefix), extend_lens=t(extend),
        req_to_token=table, kv_cache=cache, attn_backend=backend, prefix_lens_cpu=list(prefix),
        extend_lens_cpu=list(extend), tree_mask=tree_mask, static_max_seq_len=static)


def _forward(backend, batch, q, k, v, window: int | None = None):
    layer = AttentionLayer(layer_id=0, num_heads=HQ, num_kv_heads=HKV, head_dim=D, scaling=D**-0.5,
                           sliding_window=window)
    backend.init_forward_metadata(batch)
    return backend.forward(q, k, v, layer, batch)


def verify_then_decode(backend_name: str, static: int | None, dtype: torch.dtype = torch.float32, *,
                       deterministic: bool = True, window: int | None = None, **backend_kw):
    """(verify output, decode output): decode row i rebuilds verify node i's context in a request of
    its own, every slot different (prefix and ancestors copied to fresh slots), then attends from the
    node's query, key and value. Deterministic: one decode batch of every node; default: a batch a
    node index (node i of each request), as many requests as the verify batch, as plain decoding
    of those requests would run. ``window``: the layer's sliding window."""
    backend, n = create_attention_backend(backend_name, **backend_kw), len(TREES[0])
    gen = torch.Generator().manual_seed(0)
    cache = kv_cache(2000, dtype)
    k_buf, v_buf = cache.get_kv(0)
    table = torch.zeros(16, 128, dtype=torch.int32, device=DEVICE)
    slots = torch.randperm(2000, generator=gen)
    table[:2, :max(PREFIXES)] = slots[: 2 * max(PREFIXES)].view(2, -1).to(table)
    q, k, v = (rand(2 * n, h * D, dtype=dtype, device=DEVICE, seed=s) for s, h in [(1, HQ), (2, HKV), (3, HKV)])
    depth = [len(ancestors(t, i)) - 1 for t in TREES for i in range(n)]
    mask = torch.tensor([[j in ancestors(t, i) for j in range(n)] for t in TREES for i in range(n)], device=DEVICE)
    node_slots = slots[300 : 300 + 2 * n].tolist()
    positions = [PREFIXES[r // n] + depth[r] for r in range(2 * n)]
    mode = batch_invariant if deterministic else contextlib.nullcontext
    verify = _batch(ForwardMode.TARGET_VERIFY, positions, node_slots, [0, 1], PREFIXES, [n, n], table, cache, backend,
                    tree_mask=mask.flatten(), static=static)
    with mode():
        out_verify = _forward(backend, verify, q, k, v, window)
    fresh = iter(slots[400:].tolist())
    for r in range(2 * n):  # table row 2 + r: node r's prefix and ancestors at fresh slots
        b = r // n
        path = [b * n + a for a in ancestors(TREES[b], r % n)]
        context = table[b, : PREFIXES[b]].tolist() + [node_slots[a] for a in path[:-1]]
        for pos, src in enumerate(context):
            dst = next(fresh)
            k_buf[dst], v_buf[dst], table[2 + r, pos] = k_buf[src], v_buf[src], dst
    out_decode = torch.full_like(out_verify, float("nan"))
    for rows in [list(range(2 * n))] if deterministic else [[i, n + i] for i in range(n)]:
        decode = _batch(ForwardMode.DECODE, [positions[r] for r in rows], [next(fresh) for _ in rows],
                        [2 + r for r in rows], [positions[r] for r in rows], [1] * len(rows), table, cache, backend,
                        static=static)
        with mode():
            out_decode[rows] = _forward(backend, decode, q[rows], k[rows], v[rows], window)
    return out_verify, out_decode


# NOTE: fp32 is the sharper test on CPU: the interpreter multiplies bf16 tiles in fp32, and rounding
# the output to bf16 hides most order differences (the default path's decode and extend kernels agree
# in bf16 here, and differ in fp32 by 6e-8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["triton", "torch_native"])
def test_verify_node_equals_decode_step_bit_for_bit(backend, dtype):
    out_verify, out_decode = verify_then_decode(backend, None, dtype)
    assert torch.equal(out_verify, out_decode)
    if backend == "triton":  # the CUDA-graph plan (device-built lists, grid from the bound) gives the same bits
        graph_verify, graph_decode = verify_then_decode(backend, 200, dtype)
        assert torch.equal(graph_verify, out_verify) and torch.equal(graph_decode, out_decode)


# The default path (no batch invariance): the triton backend runs each verify node as a decode step
# planned for the verify's requests, so a node equals the decode step of its token in a batch of as
# many requests, split or not, eagerly and under the CUDA-graph plan
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [None, 3])
def test_default_verify_node_equals_decode_step_bit_for_bit(dtype, num_splits):
    for static in (None, 200):
        out_verify, out_decode = verify_then_decode("triton", static, dtype, deterministic=False,
                                                    num_splits=num_splits)
        assert torch.equal(out_verify, out_decode), f"static={static}"


# A local layer (sliding window): a node and its decode step see the same last ``window`` positions,
# split alike (the plan sized by the window), so the equality holds there too. Window 40: inside both
# prefixes, over two or three 32-position splits; 5: the node's ancestors and the prefix's last entries
@pytest.mark.parametrize("window, num_splits", [(40, None), (5, 3)])
def test_default_verify_node_equals_decode_step_with_window(window, num_splits):
    for static in (None, 200):
        out_verify, out_decode = verify_then_decode("triton", static, deterministic=False, num_splits=num_splits,
                                                    window=window)
        assert torch.equal(out_verify, out_decode), f"static={static}"


@pytest.mark.parametrize("backend", ["triton", "torch_native"])
def test_deterministic_verify_node_equals_decode_step_with_window(backend):
    out_verify, out_decode = verify_then_decode(backend, None, window=40)
    assert torch.equal(out_verify, out_decode)
    if backend == "triton":
        graph_verify, _ = verify_then_decode(backend, 200, window=40)
        assert torch.equal(graph_verify, out_verify)


def test_default_verify_through_extend_kernel_differs_from_decode():
    """The check above can fail: through the extend kernel (both verify-as-decode bounds 0, 3 splits)
    the same nodes differ from the decode steps in fp32 (summation order), within rounding."""
    out_verify, out_decode = verify_then_decode("triton", None, deterministic=False, num_splits=3,
                                                verify_as_decode_max_rows=0, verify_rows_max_nodes=0)
    assert not torch.equal(out_verify, out_decode)
    torch.testing.assert_close(out_verify, out_decode, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 40])
def test_backends_agree_up_to_summation_order(window):
    triton_verify, _ = verify_then_decode("triton", None, window=window)
    native_verify, _ = verify_then_decode("torch_native", None, window=window)
    torch.testing.assert_close(triton_verify, native_verify, rtol=1e-5, atol=1e-5)
    if window is not None:  # the window changes the result (it is honoured at all)
        unwindowed, _ = verify_then_decode("torch_native", None)
        assert not torch.allclose(native_verify, unwindowed, rtol=1e-3, atol=1e-3)


def test_static_plan_reads_nothing_on_the_host(monkeypatch):
    """Under ``static_max_seq_len`` the plan takes no host lengths (CUDA-graph capture)."""
    def refuse(self):
        raise AssertionError("host lengths read")

    monkeypatch.setattr(ForwardBatch, "host_prefix_lens", refuse)
    monkeypatch.setattr(ForwardBatch, "host_extend_lens", refuse)
    out_verify, out_decode = verify_then_decode("triton", 200)
    assert out_verify.isfinite().all() and out_decode.isfinite().all()

