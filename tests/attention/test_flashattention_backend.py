"""The fa3 (FlashAttention-3) backend: its log-sum-exp merge, its page tables, and the backend
against torch_native.

CPU, without flash-attn: the merge against attention over the union on random inputs (empty parts
included); the page tables on a worked example; and the whole backend with
``flash_attn_with_kvcache`` replaced by a torch model of its documented semantics (varlen queries,
a page table of any page size, ``cache_seqlens``, causal aligned to the bottom right, natural-log
LSE of shape [num_heads, total_q], +inf LSE and zero output for a row that sees nothing). The
model takes exactly FA3's parameter list, so a misspelt keyword fails here too.

GPU (CUDA and an FA3 build): the real kernel at real sizes, as in test_flashinfer_backend.
"""

import dataclasses
import importlib.util
import inspect

import pytest
import torch

from specdec.attention import flashattention_backend as fab
from specdec.attention.layout import build_ragged_layout
from specdec.attention.merge import merge_attention_states
from specdec.forward import ForwardMode

from .test_flashinfer_backend import LOW_PRECISION, check_backend
from .test_triton_backend import GPU_SCENARIOS, SCENARIOS, Scenario, make_problem


def _has_fa3() -> bool:
    try:
        fab.import_flash_attn_with_kvcache()
    except ImportError:
        return False
    return True


HAS_FA3 = (importlib.util.find_spec("flash_attn_interface") or importlib.util.find_spec("sgl_kernel")) is not None \
    and _has_fa3()


# ----------------------------------------------------------------------------- merge
def _attention(q, k, v, scale):
    """q [n, h, d], k/v [m, h, d] fp64 -> (out [n, h, d], lse [n, h]); an empty set gives 0 and +inf (as FA)."""
    if k.shape[0] == 0:
        return torch.zeros_like(q), torch.full(q.shape[:2], float("inf"), dtype=q.dtype)
    scores = torch.einsum("nhd,mhd->nhm", q, k) * scale
    return torch.einsum("nhm,mhd->nhd", torch.softmax(scores, -1), v), torch.logsumexp(scores, -1)


@pytest.mark.parametrize("sizes", [(7, 5), (1, 30), (0, 4), (4, 0), (13, 1)])
def test_merge_equals_attention_over_the_union(sizes):
    gen = torch.Generator().manual_seed(sum(sizes))
    n, h, d = 6, 3, 16
    q = torch.randn(n, h, d, generator=gen, dtype=torch.float64)
    k = torch.randn(sum(sizes), h, d, generator=gen, dtype=torch.float64) * 2
    v = torch.randn(sum(sizes), h, d, generator=gen, dtype=torch.float64)
    a = slice(0, sizes[0])
    b = slice(sizes[0], sum(sizes))
    out_a, lse_a = _attention(q, k[a], v[a], 0.3)
    out_b, lse_b = _attention(q, k[b], v[b], 0.3)
    out, lse = merge_attention_states(out_a, lse_a, out_b, lse_b)
    ref, ref_lse = _attention(q, k, v, 0.3)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, ref_lse.float(), atol=1e-5, rtol=1e-6)


def test_merge_of_two_empty_parts_is_zero_and_ignores_garbage():
    out = torch.full((2, 1, 4), float("nan"))
    lse = torch.tensor([[float("inf")], [float("-inf")]])
    merged, merged_lse = merge_attention_states(out, lse, out, lse)
    assert torch.equal(merged, torch.zeros_like(merged)) and torch.isneginf(merged_lse).all()


def test_merge_keeps_low_precision_dtype():
    out = torch.randn(3, 2, 8, dtype=torch.bfloat16)
    lse = torch.randn(3, 2)
    merged, _ = merge_attention_states(out, lse, out, lse + 1)
    assert merged.dtype == torch.bfloat16
    torch.testing.assert_close(merged, out)  # the same output from both parts merges to itself


# ----------------------------------------------------------------------------- page tables
def test_page_tables_worked_example():
    """Prefix [p0 p1], tree 0 -> {1, 2} in [n0 n1 n2] (the module docstring's example)."""
    sc = Scenario(ForwardMode.TARGET_VERIFY, (2,), (3,), trees=((-1, 0, 0),))
    pb = make_problem(sc, page_size=1, dtype=torch.bfloat16, device=torch.device("cpu"))
    layout = build_ragged_layout(pb.batch)
    p0, p1, n0, n1, n2 = layout.kv_indices.tolist()
    md = fab.flash_attention_metadata(layout)
    assert md.main.page_table.tolist() == [[p0, p1]] and md.main.cache_seqlens.tolist() == [2]
    assert md.main.cu_seqlens_q.tolist() == [0, 3] and md.main.max_seqlen_q == 3 and not md.main.causal
    assert md.tree.page_table.tolist() == [[n0, 0, 0], [n0, n1, 0], [n0, n2, 0]]
    assert md.tree.cache_seqlens.tolist() == [1, 2, 2]
    assert md.tree.cu_seqlens_q.tolist() == [0, 1, 2, 3] and md.tree.max_seqlen_q == 1
    assert md.main.page_table.dtype == md.tree.page_table.dtype == torch.int32


def test_page_table_from_ragged_pads_and_truncates():
    indptr = torch.tensor([0, 3, 3, 7])
    indices = torch.tensor([10, 11, 12, 20, 21, 22, 23])
    assert fab.page_table_from_ragged(indptr, indices, [3, 0, 4]).tolist() == [[10, 11, 12, 0], [0] * 4, [20, 21, 22, 23]]
    assert fab.page_table_from_ragged(indptr, indices, [2, 0, 1]).tolist() == [[10, 11], [0, 0], [20, 0]]
    assert fab.page_table_from_ragged(torch.tensor([0, 0]), torch.zeros(0, dtype=torch.int64), [0]).tolist() == [[0]]


def test_unmasked_layouts_are_one_causal_call():
    pb = make_problem(SCENARIOS["draft_decode_k3"], page_size=16, dtype=torch.bfloat16, device=torch.device("cpu"))
    layout = build_ragged_layout(pb.batch)
    md = fab.flash_attention_metadata(layout)
    assert md.tree is None and md.main.causal and md.main.max_seqlen_q == 1
    assert md.main.cache_seqlens.tolist() == layout.kv_lens


# ----------------------------------------------------------------------------- CPU: modelled kernel
def fake_flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                                 cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                                 cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                                 q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                                 window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                                 scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                                 return_softmax_lse=False):
    """FA3's ``flash_attn_with_kvcache`` (hopper/flash_attn_interface.py) for the arguments we use."""
    assert k is v is None and page_table.dtype == cache_seqlens.dtype == cu_seqlens_q.dtype == torch.int32
    page_size = k_cache.shape[1]
    total, hq, _ = q.shape
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full((hq, total), float("inf"))
    for s in range(cache_seqlens.shape[0]):
        q0, q1, m = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1]), int(cache_seqlens[s])
        assert q1 - q0 <= max_seqlen_q and m <= page_table.shape[1] * page_size
        pos = torch.arange(m)
        pages = page_table[s, pos // page_size].long()
        keys, values = k_cache[pages, pos % page_size].float(), v_cache[pages, pos % page_size].float()
        group = hq // keys.shape[1]
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scores = torch.einsum("nhd,mhd->hnm", q[q0:q1].float(), keys) * softmax_scale
        if causal:
            n = q1 - q0
            scores = scores.masked_fill(torch.arange(m)[None] > (m - n) + torch.arange(n)[:, None], float("-inf"))
        seen = torch.isfinite(scores).any(-1)  # [h, n]
        probs = torch.softmax(scores, -1).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("hnm,mhd->nhd", probs, values)
        lse[:, q0:q1] = torch.where(seen, torch.logsumexp(scores, -1), float("inf"))
    out = out.to(q.dtype)
    return (out, lse) if return_softmax_lse else out


@pytest.fixture
def fake_fa3(monkeypatch):
    monkeypatch.setattr(fab, "import_flash_attn_with_kvcache", lambda: fake_flash_attn_with_kvcache)
    monkeypatch.setattr(fab, "check_device", lambda device: None)


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_modelled_kernel_matches_torch_native(fake_fa3, name, page_size, dtype):
    pb = make_problem(SCENARIOS[name], page_size=page_size, dtype=dtype, seed=len(name), d=32,
                      device=torch.device("cpu"))
    check_backend(fab.FlashAttentionBackend(), pb)


def test_rejects_fp32(fake_fa3):
    pb = make_problem(SCENARIOS["decode_bs5"], page_size=1, dtype=torch.float32, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        check_backend(fab.FlashAttentionBackend(), pb)


@pytest.mark.skipif(not HAS_FA3, reason="no FA3 build installed")
def test_model_signature_is_the_real_one():
    real = inspect.signature(fab.import_flash_attn_with_kvcache())
    assert list(real.parameters) == list(inspect.signature(fake_flash_attn_with_kvcache).parameters)


# ----------------------------------------------------------------------------- GPU: real kernel
gpu = pytest.mark.skipif(not (torch.cuda.is_available() and HAS_FA3), reason="needs CUDA and an FA3 build")
HEADS = {"llama3_d128": (32, 8, 128), "g8_d64": (8, 1, 64)}


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("name", list(GPU_SCENARIOS))
def test_gpu_matches_torch_native(name, heads, dtype):
    """Real sizes (page_size 16 for verify, 1 otherwise, as for triton; both at small sizes below)."""
    hq, hkv, d = HEADS[heads]
    page_size = 16 if "verify" in name else 1
    pb = make_problem(GPU_SCENARIOS[name], page_size=page_size, dtype=dtype, hq=hq, hkv=hkv, d=d, seed=len(name))
    check_backend(fab.FlashAttentionBackend(), pb, label=f"{name}-{heads}-p{page_size}-{dtype}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_gpu_awkward_shapes(name, page_size, dtype):
    pb = make_problem(SCENARIOS[name], page_size=page_size, dtype=dtype, hq=4, hkv=2, d=64, seed=len(name))
    check_backend(fab.FlashAttentionBackend(), pb, label=f"{name}-h4x2x64-p{page_size}-{dtype}")


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", ["decode_bs5", "verify_topk2", "verify_chain", "draft_decode_k3",
                                  "draft_extend_uniform"])
def test_static_plan_matches_torch_native(fake_fa3, name, page_size):
    """The CUDA-graph plan: page tables built on the device from the length bound (here 64)."""
    from .test_triton_backend import STATIC_SCENARIOS

    pb = make_problem(STATIC_SCENARIOS[name], page_size=page_size, dtype=torch.bfloat16, seed=3, d=32,
                      device=torch.device("cpu"))
    backend = fab.FlashAttentionBackend()
    assert backend.supports_cuda_graph and not backend.plans_on_host
    static = dataclasses.replace(pb.batch, prefix_lens_cpu=None, extend_lens_cpu=None, static_max_seq_len=64)
    check_backend(backend, dataclasses.replace(pb, batch=static))
