"""The fa4 (FlashAttention-4) backend: split plans, the tree mask rule, and the backend against
torch_native in every forward mode.

CPU, without flash-attn-4: the whole backend with ``flash_attn_varlen_func`` replaced by a torch
model of its semantics for the arguments we use (varlen queries; either dense varlen K/V with
``cu_seqlens_k`` or a paged cache through ``page_table`` + ``seqused_k``; causal aligned to the bottom
right; ``mask_mod`` applied as ``fa4_masks.tree_mask_mod_ref`` with ``aux_tensors``; natural-log LSE
[num_heads, total_q], -inf and zero output for a row that sees nothing, as measured on the H100;
``num_splits`` must be 1: FA4's own split-KV refuses SM90). The model takes exactly FA4's parameter list (4.0.0b36), so a
misspelt keyword fails here too; on the GPU a test compares the lists.

GPU (CUDA and flash-attn-4): the real kernel at real sizes in both tree modes, forced splits, and a
forward captured in a CUDA graph replayed against eager.
"""

import dataclasses
import importlib.util
import inspect

import pytest
import torch

from specdec.attention import available_backends, create_attention_backend
from specdec.attention import fa4_backend as fa4
from specdec.attention import fa4_split
from specdec.attention.fa4_masks import tree_mask_mod_ref
from specdec.forward import ForwardMode

from .test_flashinfer_backend import LOW_PRECISION, check_backend
from .test_triton_backend import GPU_SCENARIOS, SCENARIOS, STATIC_SCENARIOS, Scenario, make_problem

HAS_FA4 = importlib.util.find_spec("flash_attn") is not None and "fa4" in available_backends()
CPU = torch.device("cpu")


# ----------------------------------------------------------------------------- CPU: modelled kernel
def fake_flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                                max_seqlen_k=None, min_seqlen_k=None, seqused_q=None, seqused_k=None,
                                gather_kv_indices=None, page_table=None, softmax_scale=None, causal=False,
                                window_size=(None, None), learnable_sink=None, softcap=0.0, num_splits=1,
                                pack_gqa=None, deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None,
                                block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, return_lse=False,
                                scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False,
                                gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):
    """FA4's ``flash_attn_varlen_func`` (flash_attn/cute/interface.py) for the arguments we use."""
    assert cu_seqlens_q.dtype == torch.int32 and isinstance(max_seqlen_q, int)
    assert num_splits == 1, "FA4 4.0.0b36 asserts 'SplitKV not supported on SM 9.0'"
    assert (page_table is None) != (cu_seqlens_k is None), "paged (page_table + seqused_k) or dense (cu_seqlens_k)"
    assert mask_mod is None or (aux_tensors is not None and not causal)
    total, hq, _ = q.shape
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full((hq, total), float("-inf"))
    for s in range(cu_seqlens_q.shape[0] - 1):
        q0, q1 = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        assert q1 - q0 <= max_seqlen_q
        if page_table is not None:
            assert page_table.dtype == seqused_k.dtype == torch.int32
            page_size, m = k.shape[1], int(seqused_k[s])
            assert m <= page_table.shape[1] * page_size
            pos = torch.arange(m)
            pages = page_table[s, pos // page_size].long()
            keys, values = k[pages, pos % page_size].float(), v[pages, pos % page_size].float()
        else:
            k0, k1 = int(cu_seqlens_k[s]), int(cu_seqlens_k[s + 1])
            keys, values, m = k[k0:k1].float(), v[k0:k1].float(), k1 - k0
            assert m <= max_seqlen_k
        group = hq // keys.shape[1]
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scores = torch.einsum("nhd,mhd->hnm", q[q0:q1].float(), keys) * softmax_scale
        n = q1 - q0
        rows, cols = torch.arange(n)[:, None], torch.arange(m)[None]
        if causal:
            scores = scores.masked_fill(cols > (m - n) + rows, float("-inf"))
        if mask_mod is not None:
            visible = mask_mod(torch.full((n, m), s), rows.expand(n, m), cols.expand(n, m), torch.tensor(n),
                               torch.tensor(m), aux_tensors[0])
            scores = scores.masked_fill(~visible, float("-inf"))
        seen = torch.isfinite(scores).any(-1)  # [h, n]
        out[q0:q1] = torch.einsum("hnm,mhd->nhd", torch.softmax(scores, -1).nan_to_num(0.0), values)
        lse[:, q0:q1] = torch.where(seen, torch.logsumexp(scores, -1), float("-inf"))
    return out.to(q.dtype), (lse if return_lse else None)


@pytest.fixture
def fake_fa4(monkeypatch):
    monkeypatch.setattr(fa4, "import_flash_attn_varlen_func", lambda: fake_flash_attn_varlen_func)
    monkeypatch.setattr(fa4, "check_device", lambda device: None)
    import specdec.attention.fa4_masks as masks

    monkeypatch.setattr(masks, "tree_mask_mod", lambda: tree_mask_mod_ref)


def _backend(**kw) -> fa4.FA4Backend:
    backend = fa4.FA4Backend(**kw)
    backend._num_sms = 132  # the H100's; CPU has no device to ask
    return backend


@pytest.mark.parametrize("tree", fa4.TREE_MODES)
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_modelled_kernel_matches_torch_native(fake_fa4, name, page_size, dtype, tree):
    pb = make_problem(SCENARIOS[name], page_size=page_size, dtype=dtype, seed=len(name), d=32, device=CPU)
    check_backend(_backend(tree=tree), pb)


@pytest.mark.parametrize("tree", fa4.TREE_MODES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", list(STATIC_SCENARIOS))
def test_static_plan_matches_torch_native(fake_fa4, name, page_size, tree):
    """The CUDA-graph plan: page tables built on the device from the length bound (here 64)."""
    pb = make_problem(STATIC_SCENARIOS[name], page_size=page_size, dtype=torch.bfloat16, seed=3, d=32, device=CPU)
    backend = _backend(tree=tree)
    assert backend.supports_cuda_graph and not backend.plans_on_host
    static = dataclasses.replace(pb.batch, prefix_lens_cpu=None, extend_lens_cpu=None, static_max_seq_len=64)
    check_backend(backend, dataclasses.replace(pb, batch=static))


def test_prefill_without_prefix_is_one_dense_call(fake_fa4):
    pb = make_problem(Scenario(ForwardMode.EXTEND, (0, 0), (5, 9)), page_size=1, dtype=torch.bfloat16, d=32,
                      device=CPU)
    backend = _backend()
    check_backend(backend, pb)
    batch = dataclasses.replace(pb.batch, attn_backend=backend, kv_cache=pb.cache)
    backend.init_forward_metadata(batch)
    assert batch.attn_metadata.paged is None and batch.attn_metadata.dense_cu_seqlens.tolist() == [0, 5, 14]
    off = _backend(dense_prefill=False)
    off.init_forward_metadata(batch)
    assert batch.attn_metadata.dense_cu_seqlens is None and batch.attn_metadata.paged.main.causal


def test_verify_plans_per_tree_mode(fake_fa4):
    """merge: prefix table + one sequence per tree row; mask_mod: one table over prefix + tree."""
    sc = Scenario(ForwardMode.TARGET_VERIFY, (2,), (3,), trees=((-1, 0, 0),))
    pb = make_problem(sc, page_size=1, dtype=torch.bfloat16, device=CPU)
    batch = dataclasses.replace(pb.batch, kv_cache=pb.cache)
    _backend(tree="merge").init_forward_metadata(batch)
    md = batch.attn_metadata
    assert md.paged.tree is not None and md.paged.main.cache_seqlens.tolist() == [2] and md.tree_blocks is None
    _backend(tree="mask_mod").init_forward_metadata(batch)
    md = batch.attn_metadata
    assert md.paged.tree is None and md.paged.main.cache_seqlens.tolist() == [5] and not md.paged.main.causal
    assert md.tree_blocks.tolist() == [[[1, 0, 0], [1, 1, 0], [1, 0, 1]]] and md.tree_blocks.dtype == torch.int32


def test_tree_mask_rule_worked_example():
    """fa4_masks' docstring: prefix 2, tree 0 -> {1, 2}."""
    tree = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.int32)
    rows, cols = torch.arange(3)[:, None].expand(3, 5), torch.arange(5)[None].expand(3, 5)
    got = tree_mask_mod_ref(torch.zeros(3, 5, dtype=torch.long), rows, cols, torch.tensor(3), torch.tensor(5), tree)
    assert got.int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]


@pytest.mark.parametrize("args, splits", [
    ((32, 1, 1024), 2),  # 256 CTAs unsplit: 2 waves of 132 SMs want 264
    ((64, 1, 4096), 1),  # 512 CTAs: enough
    ((1, 1, 4096), 32),  # 8 CTAs: as many chunks as key tiles
    ((8, 1, 100), 1),  # one key tile
    ((4, 8, 4096), 9),  # verify's prefix part: 8 rows x 4 heads = 32 packed rows, one M tile
])
def test_plan_num_splits(args, splits):
    assert fa4_split.plan_num_splits(*args, num_kv_heads=8, num_sms=132) == splits


def test_split_keys_worked_example():
    """fa4_split's docstring: key lengths [300, 40], table width 384, 3 splits of 128 columns."""
    table = torch.arange(2 * 384, dtype=torch.int32).view(2, 384)
    part = fa4.PagedCall(cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32), max_seqlen_q=1,
                         cache_seqlens=torch.tensor([300, 40], dtype=torch.int32), page_table=table, causal=True)
    split = fa4_split.split_keys(part, 3)
    assert split.num_splits == 3 and not split.part.causal and split.part.page_table.shape == (6, 128)
    assert split.part.cache_seqlens.tolist() == [128, 128, 44, 40, 0, 0]
    assert split.part.page_table[2, 0] == 256 and split.part.page_table[4, 0] == 384 + 128
    assert split.part.cu_seqlens_q.tolist() == list(range(7))


@pytest.fixture
def small_tiles(monkeypatch):
    """Key chunks of 4 entries, so CPU-sized sequences split into several."""
    monkeypatch.setattr(fa4_split, "TILE_N", 4)


@pytest.mark.parametrize("num_splits", [2, 5])
@pytest.mark.parametrize("name", ["decode_bs5", "verify_topk2", "verify_chain", "draft_decode_k3", "draft_decode_k10"])
def test_split_keys_match_torch_native(fake_fa4, small_tiles, name, num_splits, monkeypatch):
    calls = []
    monkeypatch.setattr(fa4, "import_flash_attn_varlen_func",
                        lambda: lambda *a, **kw: (calls.append(kw), fake_flash_attn_varlen_func(*a, **kw))[1])
    pb = make_problem(SCENARIOS[name], page_size=1, dtype=torch.bfloat16, d=32, device=CPU, seed=num_splits)
    check_backend(_backend(num_splits=num_splits, tree="merge"), pb)  # mask_mod calls are never split
    assert calls[0]["cu_seqlens_q"].numel() - 1 > pb.batch.batch_size  # the keys were cut
    assert not calls[0]["causal"]


@pytest.mark.parametrize("name", ["decode_bs5", "verify_topk2", "draft_decode_k3"])
def test_static_split_keys_match_torch_native(fake_fa4, small_tiles, name):
    pb = make_problem(STATIC_SCENARIOS[name], page_size=16, dtype=torch.bfloat16, seed=4, d=32, device=CPU)
    static = dataclasses.replace(pb.batch, prefix_lens_cpu=None, extend_lens_cpu=None, static_max_seq_len=64)
    check_backend(_backend(num_splits=4, tree="merge"), dataclasses.replace(pb, batch=static))


def test_causal_multi_row_calls_are_not_split(fake_fa4, small_tiles):
    pb = make_problem(SCENARIOS["draft_extend"], page_size=1, dtype=torch.bfloat16, d=32, device=CPU)
    batch = dataclasses.replace(pb.batch, kv_cache=pb.cache)
    _backend(num_splits=4).init_forward_metadata(batch)
    assert batch.attn_metadata.split is None


def test_rejects_fp32_and_unknown_modes(fake_fa4):
    pb = make_problem(SCENARIOS["decode_bs5"], page_size=1, dtype=torch.float32, device=CPU)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        check_backend(_backend(), pb)
    with pytest.raises(ValueError, match="tree='dense'"):
        fa4.FA4Backend(tree="dense")


@pytest.mark.skipif(HAS_FA4, reason="flash-attn-4 is installed")
def test_missing_package_names_the_extra():
    assert "fa4" not in available_backends()
    with pytest.raises(ImportError, match=r"specdec\[fa4\]"):
        create_attention_backend("fa4")
    with pytest.raises(ImportError, match=r"specdec\[fa4\]"):
        fa4.import_flash_attn_varlen_func()


# ----------------------------------------------------------------------------- GPU: real kernel
gpu = pytest.mark.skipif(not (torch.cuda.is_available() and HAS_FA4), reason="needs CUDA and flash-attn-4")
HEADS = {"llama3_d128": (32, 8, 128), "g8_d64": (8, 1, 64)}


@pytest.mark.gpu
@gpu
def test_model_signature_is_the_real_one():
    real = inspect.signature(fa4.import_flash_attn_varlen_func())
    assert list(real.parameters) == list(inspect.signature(fake_flash_attn_varlen_func).parameters)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("tree", fa4.TREE_MODES)
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("name", list(GPU_SCENARIOS))
def test_gpu_matches_torch_native(name, heads, dtype, tree):
    if tree == "mask_mod" and "verify" not in name:
        pytest.skip("the tree mode only changes TARGET_VERIFY")
    hq, hkv, d = HEADS[heads]
    page_size = 16 if "verify" in name else 1
    pb = make_problem(GPU_SCENARIOS[name], page_size=page_size, dtype=dtype, hq=hq, hkv=hkv, d=d, seed=len(name))
    check_backend(fa4.FA4Backend(tree=tree), pb, label=f"{name}-{heads}-p{page_size}-{tree}-{dtype}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("tree", fa4.TREE_MODES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_gpu_awkward_shapes(name, page_size, tree):
    if tree == "mask_mod" and "verify" not in name:
        pytest.skip("the tree mode only changes TARGET_VERIFY")
    pb = make_problem(SCENARIOS[name], page_size=page_size, dtype=torch.bfloat16, hq=4, hkv=2, d=64, seed=len(name))
    check_backend(fa4.FA4Backend(tree=tree), pb, label=f"{name}-h4x2x64-p{page_size}-{tree}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("num_splits", [1, 3, 40])
@pytest.mark.parametrize("name", ["decode_bs8", "decode_bs1_long", "verify_n8", "draft_decode_k8"])
def test_gpu_forced_splits(name, num_splits):
    pb = make_problem(GPU_SCENARIOS[name], page_size=1, dtype=torch.bfloat16, hq=32, hkv=8, d=128, seed=2)
    check_backend(fa4.FA4Backend(num_splits=num_splits), pb, label=f"{name}-splits{num_splits}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("tree", fa4.TREE_MODES)
@pytest.mark.parametrize("name", list(STATIC_SCENARIOS))
def test_gpu_graph_replay_equals_eager(name, tree):
    """A static forward captured in a CUDA graph, replayed on new lengths and slots, equals eager."""
    from .test_triton_backend import run_backend

    pbs = [make_problem(STATIC_SCENARIOS[name], page_size=16, dtype=torch.bfloat16, hq=8, hkv=2, d=128, seed=s)
           for s in (1, 2)]
    backend = fa4.FA4Backend(tree=tree)
    static = [dataclasses.replace(pb, batch=dataclasses.replace(pb.batch, prefix_lens_cpu=None, extend_lens_cpu=None,
                                                                static_max_seq_len=128)) for pb in pbs]
    cache = static[0].cache
    batch = dataclasses.replace(static[0].batch, kv_cache=cache, attn_backend=backend)
    bufs = {f: getattr(batch, f).clone() for f in ("input_ids", "out_cache_loc", "req_pool_indices", "prefix_lens",
                                                   "extend_lens", "req_to_token")}
    for f in ("tree_mask", "draft_ancestors"):
        if getattr(batch, f) is not None:
            bufs[f] = getattr(batch, f).clone()
    batch = dataclasses.replace(batch, **bufs)
    q, k, v = (t.clone() for t in (pbs[0].q, pbs[0].k, pbs[0].v))

    def step():
        backend.init_forward_metadata(batch)
        return backend.forward(q, k, v, pbs[0].layer, batch)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for pb in static:
        if pb.batch.out_cache_loc.shape != bufs["out_cache_loc"].shape:
            continue
        for f, buf in bufs.items():
            buf.copy_(getattr(pb.batch, f))
        q.copy_(pb.q), k.copy_(pb.k), v.copy_(pb.v)
        cache.k.copy_(pb.cache.k), cache.v.copy_(pb.cache.v)
        graph.replay()
        expected, _ = run_backend(fa4.FA4Backend(tree=tree), pb)
        torch.testing.assert_close(out, expected, atol=2e-2, rtol=0)
