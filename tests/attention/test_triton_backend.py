"""The triton backend against torch_native, for every forward mode, slot layout and dtype.

Tolerances are derived, not picked (flash-attention's rule): ``ref`` is torch_native in fp32 on
the very values the test dtype holds, ``lowp`` is the same algebra with its two matmuls and the
probabilities rounded to the test dtype (what any flash kernel rounds). Triton must satisfy

    max |triton - ref| <= FACTOR * max |lowp - ref| + FLOOR

Observed on the CPU cases: |triton - ref| / |lowp - ref| <= 2.0 for bf16 and <= 1.0 for fp16, so
FACTOR = 4 leaves a 2x margin for other seeds and sizes. FLOOR = 1e-5 covers fp32, where lowp is
ref and only the summation order differs (observed errors <= 7e-7); a single wrongly seen or
missed KV entry moves an fp32 output by far more.

On CPU the kernels run in the Triton interpreter, so CPU shapes are tiny (4 query / 2 KV heads,
head_dim 16, contexts < 64); the same comparisons at real sizes, and an end-to-end lossless test,
are marked ``gpu``.
"""

import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch

from ..triton_env import import_kernels

import_kernels("specdec.attention.triton_backend")

from specdec.attention import AttentionLayer, KVCache, create_attention_backend  # noqa: E402
from specdec.attention.kv_dtype import cast_kv  # noqa: E402
from specdec.attention.torch_native import TorchNativeBackend  # noqa: E402
from specdec.forward import ForwardBatch, ForwardMode, batch_invariant  # noqa: E402


pytestmark = pytest.mark.usefixtures("triton_interpreter")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FACTOR, FLOOR = 4.0, 1e-5


# ----------------------------------------------------------------------------- trees
def tree_mask(parents: tuple[int, ...]) -> torch.Tensor:
    """[N, N] bool: node i sees node j iff j is i or one of its ancestors (parents[root] = -1)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def random_tree(n: int, seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return (-1,) + tuple(int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n))


ROOT_ONLY = (-1,)
# 0 - 1 - 2 - 3 - 4
CHAIN = (-1, 0, 1, 2, 3)
#        0
#       / \
#      1   2
#     / \   \
#    3   4   5
#    |
#    6
TOPK2 = (-1, 0, 0, 1, 1, 2, 3)
# root 0 with 10 children 1..10; 1 -> {11, 12}, 2 -> 13, 5 -> 14, 11 -> 15
WIDE10 = (-1,) + (0,) * 10 + (1, 1, 2, 5, 11)


def test_tree_mask_worked_example():
    """Tree 0 -> {1, 2}, 1 -> 3: rows are ancestors-and-self."""
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(tree_mask((-1, 0, 0, 1)), expected)


# ----------------------------------------------------------------------------- batches
@dataclasses.dataclass(frozen=True)
class Scenario:
    mode: ForwardMode
    prefix: tuple[int, ...]  # [bs] cached tokens per request
    extend: tuple[int, ...]  # [bs] new tokens per request (topk for draft decode, N for verify)
    trees: tuple[tuple[int, ...], ...] | None = None  # verify: parents of each request's tree
    depth: int = 0  # draft decode: ancestors per branch, itself last


@dataclasses.dataclass(frozen=True)
class Problem:
    batch: ForwardBatch
    layer: AttentionLayer
    cache: KVCache
    q: torch.Tensor  # [num_tokens, hq * d]
    k: torch.Tensor  # [num_tokens, hkv * d]
    v: torch.Tensor  # [num_tokens, hkv * d]


def _rand(shape, gen, dtype, device):
    return torch.randn(shape, generator=gen).to(dtype).to(device)


def make_problem(sc: Scenario, *, page_size: int, dtype: torch.dtype, hq: int = 4, hkv: int = 2,
                 d: int = 16, seed: int = 0, device: torch.device = DEVICE, window: int | None = None) -> Problem:
    """A batch whose request rows own shuffled pages (page_size 1: every slot shuffled); ``window``:
    the layer's sliding window."""
    gen = torch.Generator().manual_seed(seed)
    bs = len(sc.prefix)
    ctx = max(p + (0 if sc.depth else e) for p, e in zip(sc.prefix, sc.extend))
    pages_per_req = max(1, math.ceil(ctx / page_size))
    max_reqs = bs + 2
    num_pages = max_reqs * pages_per_req
    scratch_base = num_pages * page_size
    num_branches = sum(sc.extend) if sc.depth else 0
    num_slots = scratch_base + num_branches * sc.depth + 1
    pages = torch.randperm(num_pages, generator=gen).view(max_reqs, pages_per_req)
    pos = torch.arange(pages_per_req * page_size)
    table = (pages[:, pos // page_size] * page_size + pos % page_size).to(torch.int32)  # [max_reqs, ctx]
    rows = torch.randperm(max_reqs, generator=gen)[:bs]

    kw = {}
    if sc.depth:  # each branch: depth - 1 random earlier scratch slots, then its own
        own = scratch_base + torch.randperm(num_branches * sc.depth, generator=gen)[:num_branches]
        earlier = scratch_base + torch.randint(0, num_branches * sc.depth, (num_branches, sc.depth - 1), generator=gen)
        kw["draft_ancestors"] = torch.cat([earlier, own[:, None]], 1).to(device)
        out_cache_loc = own
    else:
        out_cache_loc = torch.cat([table[r, p : p + e].long() for r, p, e in zip(rows.tolist(), sc.prefix, sc.extend)])
    if sc.trees is not None:
        assert tuple(len(t) for t in sc.trees) == sc.extend
        kw["tree_mask"] = torch.cat([tree_mask(t).flatten() for t in sc.trees]).to(device)

    cache = KVCache(num_layers=1, num_slots=num_slots, num_kv_heads=hkv, head_dim=d, dtype=dtype, device=device)
    cache.k_buffers[0].copy_(_rand(cache.k_buffers[0].shape, gen, dtype, device))
    cache.v_buffers[0].copy_(_rand(cache.v_buffers[0].shape, gen, dtype, device))
    n = sum(sc.extend)
    batch = ForwardBatch(
        forward_mode=sc.mode,
        input_ids=torch.zeros(n, dtype=torch.int64, device=device),
        positions=positions(sc).to(device),
        out_cache_loc=out_cache_loc.to(device),
        req_pool_indices=rows.to(device),
        prefix_lens=torch.tensor(sc.prefix, device=device),
        extend_lens=torch.tensor(sc.extend, device=device),
        req_to_token=table.to(device),
        kv_cache=None,
        attn_backend=None,
        prefix_lens_cpu=list(sc.prefix),
        extend_lens_cpu=list(sc.extend),
        **kw,
    )
    layer = AttentionLayer(layer_id=0, num_heads=hq, num_kv_heads=hkv, head_dim=d, scaling=d**-0.5,
                           sliding_window=window)
    return Problem(batch, layer, cache, _rand((n, hq * d), gen, dtype, device),
                   _rand((n, hkv * d), gen, dtype, device), _rand((n, hkv * d), gen, dtype, device))


def positions(sc: Scenario) -> torch.Tensor:
    """[num_tokens] the prefix, plus each verify node's depth, each new token's index, or a draft
    branch's depth (depth - 1 ancestors before it: every branch of a step at the same position)."""
    if sc.trees is not None:
        return torch.cat([p + tree_mask(t).sum(1) - 1 for p, t in zip(sc.prefix, sc.trees)])
    if sc.depth:
        return torch.cat([torch.full((e,), p + sc.depth - 1) for p, e in zip(sc.prefix, sc.extend)])
    return torch.cat([p + torch.arange(e) for p, e in zip(sc.prefix, sc.extend)])


def _copy_cache(cache: KVCache, dtype: torch.dtype) -> KVCache:
    k, v = cache.get_kv(0)
    out = KVCache(num_layers=1, num_slots=cache.num_slots, num_kv_heads=cache.num_kv_heads,
                  head_dim=cache.head_dim, dtype=dtype, device=k.device)
    out.k_buffers[0].copy_(k)
    out.v_buffers[0].copy_(v)
    return out


def run_backend(backend, pb: Problem, dtype: torch.dtype | None = None):
    """(output, cache after the forward) of ``backend`` on a fresh copy of the problem's cache."""
    dtype = dtype or pb.cache.dtype
    cache = _copy_cache(pb.cache, dtype)
    batch = dataclasses.replace(pb.batch, kv_cache=cache, attn_backend=backend)
    backend.init_forward_metadata(batch)
    out = backend.forward(pb.q.to(dtype), pb.k.to(dtype), pb.v.to(dtype), pb.layer, batch)
    return out, cache


def torch_lowp(pb: Problem) -> torch.Tensor:
    """torch_native's algebra with q·k, the probabilities and p·v rounded to the cache dtype."""
    native = TorchNativeBackend()
    _, cache = run_backend(native, pb)  # writes the new K/V the same way
    batch = dataclasses.replace(pb.batch, kv_cache=cache, attn_backend=native)
    native.init_forward_metadata(batch)
    md, layer, dtype = batch.attn_metadata, pb.layer, pb.cache.dtype
    hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    k_buf, v_buf = cache.get_kv(0)
    qs = pb.q.view(-1, hq, d)[md.q_rows]  # [s, q, hq, d]
    qs = qs.view(qs.shape[0], qs.shape[1], hkv, hq // hkv, d).permute(0, 2, 3, 1, 4)  # [s, hkv, g, q, d]
    scores = torch.einsum("shgqd,skhd->shgqk", qs, k_buf[md.kv_slots]).float() * layer.scaling
    visible = md.window(layer.sliding_window)  # [s, q, kv]
    probs = torch.softmax(scores.masked_fill(~visible[:, None, None], float("-inf")), -1).to(dtype)
    out = torch.einsum("shgqk,skhd->sqhgd", probs, v_buf[md.kv_slots]).reshape(qs.shape[0], -1, hq * d)
    return out[md.q_valid].float()[torch.argsort(md.q_rows[md.q_valid])]


def check_against_torch(pb: Problem, *, deterministic: bool = False, **backend_kw) -> tuple[float, float]:
    """Triton vs fp32 torch_native within the derived tolerance; returns (error, tolerance).
    ``deterministic``: triton plans and runs under batch invariance (``row_attention``)."""
    with batch_invariant(deterministic):
        ours, our_cache = run_backend(create_attention_backend("triton", **backend_kw), pb)
    ref, _ = run_backend(TorchNativeBackend(), pb, torch.float32)
    lowp = torch_lowp(pb)
    tol = FACTOR * (lowp - ref).abs().max().item() + FLOOR
    assert ours.dtype == pb.q.dtype and ours.shape == pb.q.shape
    assert torch.isfinite(ours).all()
    err = (ours.float() - ref).abs().max().item()
    assert err <= tol, f"max |triton - torch_fp32| = {err:.3g} > tol {tol:.3g}"
    loc = pb.batch.out_cache_loc
    assert torch.equal(our_cache.k_buffers[0][loc], pb.k.view(-1, pb.layer.num_kv_heads, pb.layer.head_dim))
    return err, tol


# ----------------------------------------------------------------------------- CPU-size cases
E, D, V, DE = ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND
SCENARIOS = {
    # bs 3, one request without prefix, one with a single new token
    "extend_prefix": Scenario(E, (7, 0, 13), (5, 3, 1)),
    # 20 rows x 2 heads = 40 tile rows: two row blocks, causal skipping of the second's tiles
    "extend_long": Scenario(E, (37,), (20,)),
    "decode_bs5": Scenario(D, (7, 1, 13, 40, 0), (1, 1, 1, 1, 1)),
    "draft_extend": Scenario(DE, (9, 30, 4), (3, 1, 2)),
    "verify_root_only": Scenario(V, (5, 17), (1, 1), trees=(ROOT_ONLY, ROOT_ONLY)),
    "verify_chain": Scenario(V, (9, 2), (5, 5), trees=(CHAIN, CHAIN)),
    "verify_topk2": Scenario(V, (11, 0, 23), (7, 7, 7), trees=(TOPK2, TOPK2, TOPK2)),
    "verify_wide10": Scenario(V, (20,), (16,), trees=(WIDE10,)),
    "verify_mixed": Scenario(V, (3, 30), (7, 12), trees=(TOPK2, random_tree(12, 3))),
    "draft_decode_k1": Scenario(D, (6, 0), (1, 1), depth=1),
    "draft_decode_k3": Scenario(D, (5, 11), (3, 3), depth=2),
    "draft_decode_k10": Scenario(D, (13,), (10,), depth=4),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_matches_torch_native(name, page_size, dtype):
    check_against_torch(make_problem(SCENARIOS[name], page_size=page_size, dtype=dtype, seed=len(name)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", [n for n in SCENARIOS if n.startswith("verify")])
def test_verify_through_extend_kernel_matches_torch_native(name, dtype):
    """``verify_as_decode_max_rows=0``: the tree nodes through the extend kernel under the tree mask."""
    check_against_torch(make_problem(SCENARIOS[name], page_size=16, dtype=dtype, seed=2), verify_as_decode_max_rows=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["extend_prefix", "decode_bs5", "verify_chain", "verify_mixed", "draft_decode_k3"])
def test_split_kv_matches_torch_native(name, dtype):
    """Forced splits: prefixes cut into 16-entry chunks, some empty, merged by log-sum-exp."""
    check_against_torch(make_problem(SCENARIOS[name], page_size=16, dtype=dtype, seed=1), num_splits=3)


STATIC_SCENARIOS = {
    "decode_bs5": SCENARIOS["decode_bs5"],
    "verify_topk2": SCENARIOS["verify_topk2"],
    "verify_chain": SCENARIOS["verify_chain"],
    "draft_decode_k3": SCENARIOS["draft_decode_k3"],
    # the worker's draft extend after verify: S + 1 tokens per request, padding after the committed
    "draft_extend_uniform": Scenario(DE, (9, 30, 0), (4, 4, 4)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("bound", [64, 600])
@pytest.mark.parametrize("name", list(STATIC_SCENARIOS))
def test_static_plan_matches_torch_native(name, bound, page_size, dtype):
    """The CUDA-graph plan: lengths read on the device only, grids sized by a bound: 64, or 600,
    which splits KV (in up to four), each sequence's own entries spread over every split."""
    pb = make_problem(STATIC_SCENARIOS[name], page_size=page_size, dtype=dtype, seed=3)
    static = dataclasses.replace(pb.batch, prefix_lens_cpu=None, extend_lens_cpu=None, static_max_seq_len=bound)
    check_against_torch(dataclasses.replace(pb, batch=static))


@pytest.mark.parametrize("name", ["decode_bs5", "verify_topk2", "draft_extend_uniform", "draft_decode_k3"])
def test_static_plan_equals_the_eager_plan_bitwise(name):
    """A sequence's chunks follow from its own length and the split count alone, so the static
    plan (a bound of 600) and the eager plan (the actual lengths) with the same split count
    compute the same, bit for bit (fp32, so any change shows)."""
    pb = make_problem(STATIC_SCENARIOS[name], page_size=1, dtype=torch.float32, seed=5)
    eager, _ = run_backend(create_attention_backend("triton", num_splits=3), pb)
    static = dataclasses.replace(pb.batch, prefix_lens_cpu=None, extend_lens_cpu=None, static_max_seq_len=600)
    planned, _ = run_backend(create_attention_backend("triton", num_splits=3), dataclasses.replace(pb, batch=static))
    assert torch.equal(planned, eager)


# ----------------------------------------------------------------------------- sliding windows
# (scenario, window): 1 (a query sees itself alone), windows inside the prefixes, one past every
# context (a global layer's result)
WINDOW_CASES = [
    ("decode_bs5", 1), ("decode_bs5", 6), ("decode_bs5", 100),
    ("extend_prefix", 1), ("extend_prefix", 4), ("extend_prefix", 100),
    # 20 rows after a 37-entry prefix in two row blocks: at 9 the second block reads no prefix entry
    # and starts its new tokens past the first; at 30 each block starts at its first row's window
    ("extend_long", 9), ("extend_long", 30),
    ("draft_extend", 5),
    ("verify_chain", 3), ("verify_topk2", 2), ("verify_wide10", 4), ("verify_mixed", 6),
    # depth 1, 2, 4: at 2 a depth-4 branch sees its last two ancestors alone
    ("draft_decode_k1", 1), ("draft_decode_k3", 4), ("draft_decode_k10", 2), ("draft_decode_k10", 7),
]
# bf16: one case a kernel
BF16_WINDOW_CASES = [("decode_bs5", 6), ("extend_long", 30), ("verify_topk2", 2), ("draft_decode_k10", 7)]


@pytest.mark.parametrize("name, window, dtype", [c + (torch.float32,) for c in WINDOW_CASES]
                         + [c + (torch.bfloat16,) for c in BF16_WINDOW_CASES], ids=str)
def test_sliding_window_matches_torch_native(name, window, dtype):
    """A local layer: a query at position q sees the entries at positions > q - window (torch_native's
    ``window``) in every path: decode, extend, verify as decode steps, draft step."""
    check_against_torch(make_problem(SCENARIOS[name], page_size=1, dtype=dtype, seed=len(name), window=window))


@pytest.mark.parametrize("name, window", [c for c in WINDOW_CASES if c[0].startswith("verify")])
def test_sliding_window_verify_through_extend_kernel(name, window):
    """Tree nodes under the tree mask and the window (each at its own position) in the extend kernel."""
    pb = make_problem(SCENARIOS[name], page_size=16, dtype=torch.float32, seed=2, window=window)
    check_against_torch(pb, verify_as_decode_max_rows=0)


@pytest.mark.parametrize("name, window", [("decode_bs5", 6), ("extend_prefix", 4), ("extend_long", 30),
                                          ("verify_mixed", 6), ("verify_chain", 3), ("draft_decode_k10", 7)])
def test_sliding_window_split_kv(name, window):
    """Forced splits cut each sequence's windowed range (some splits empty)."""
    pb = make_problem(SCENARIOS[name], page_size=16, dtype=torch.float32, seed=1, window=window)
    check_against_torch(pb, num_splits=3)


@pytest.mark.parametrize("name, window", [("decode_bs5", 6), ("verify_topk2", 2), ("draft_decode_k3", 4),
                                          ("draft_extend_uniform", 3)])
def test_sliding_window_static_plan(name, window):
    """The CUDA-graph plan (device lengths, a bound of 600 that splits) with a window: the plan is sized
    by the window, each sequence's window cut from its own length on the device."""
    pb = make_problem(STATIC_SCENARIOS[name], page_size=1, dtype=torch.float32, seed=3, window=window)
    static = dataclasses.replace(pb.batch, prefix_lens_cpu=None, extend_lens_cpu=None, static_max_seq_len=600)
    check_against_torch(dataclasses.replace(pb, batch=static))


@pytest.mark.parametrize("name, window", [("decode_bs5", 6), ("extend_prefix", 4), ("extend_long", 30),
                                          ("verify_topk2", 2), ("draft_extend", 5), ("draft_decode_k3", 4)])
def test_sliding_window_deterministic_rows(name, window):
    """Deterministic inference's rows (``row_attention``: each row's list is its positions up to its
    own, so the window is the list's last entries) against torch_native's padded attention."""
    pb = make_problem(SCENARIOS[name], page_size=1, dtype=torch.float32, seed=4, window=window)
    check_against_torch(pb, deterministic=True)


def test_group_of_one_and_head_dim_32():
    """hq == hkv (no GQA) and a wider head."""
    pb = make_problem(SCENARIOS["verify_topk2"], page_size=1, dtype=torch.bfloat16, hq=2, hkv=2, d=32)
    check_against_torch(pb)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only error path")
def test_cpu_without_interpreter_names_the_requirement():
    code = (
        "import torch\n"
        "from specdec.attention import create_attention_backend\n"
        "from specdec.forward import ForwardBatch, ForwardMode\n"
        "b = ForwardBatch(ForwardMode.DECODE, *[torch.zeros(1, dtype=torch.int64)] * 6,\n"
        "                 req_to_token=torch.zeros(1, 1, dtype=torch.int32), kv_cache=None, attn_backend=None)\n"
        "try:\n"
        "    create_attention_backend('triton').init_forward_metadata(b)\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert "needs a CUDA device (or TRITON_INTERPRET=1)" in res.stdout, res.stdout + res.stderr


# ----------------------------------------------------------------------------- FP8 KV cache
def fp8_valued(pb: Problem, *, wide_range: bool = True) -> Problem:
    """The problem with its cache and new K/V rounded to e4m3 values (kept in the problem's dtype,
    which holds them exactly); ``wide_range``: scaled per channel first, so that some saturate
    (|x| > 448) and some are subnormal.
    NOTE: fp32 problems stay at unit scale: scores of hundreds make fp32's summation order alone
    differ by more than FLOOR, while bf16's tolerance (from its rounding) scales with them."""
    def fp8(x, scale):
        return cast_kv(x.float() * scale, torch.float8_e4m3fn).to(x.dtype)

    gen = torch.Generator().manual_seed(11)
    k_scale, v_scale = (10 ** (4 * torch.rand(pb.cache.head_dim, generator=gen) - 2.5) for _ in range(2))  # [d]
    k_scale[0], v_scale[-1] = 1e4, 1e-4  # channels that saturate / go subnormal
    if not wide_range:
        k_scale, v_scale = torch.ones_like(k_scale), torch.ones_like(v_scale)
    kb, vb = pb.cache.get_kv(0)
    kb.copy_(fp8(kb, k_scale.to(kb.device)))
    vb.copy_(fp8(vb, v_scale.to(vb.device)))
    hkv, d = pb.layer.num_kv_heads, pb.layer.head_dim
    k = fp8(pb.k.view(-1, hkv, d), k_scale.to(kb.device)).view_as(pb.k)
    v = fp8(pb.v.view(-1, hkv, d), v_scale.to(kb.device)).view_as(pb.v)
    return dataclasses.replace(pb, k=k, v=v)


def check_fp8_cache_against_torch(pb: Problem, backend: str = "triton") -> None:
    """A bf16 or fp32 problem of e4m3 values: the backend over an FP8 copy of its cache (queries in the
    problem's dtype, the new K/V stored through the FP8 cast) computes what it computes over the
    problem's own cache, within that dtype's tolerance (triton), or bit for bit (torch_native, which
    computes in fp32 either way)."""
    pb = fp8_valued(pb, wide_range=pb.q.dtype != torch.float32)
    cache = _copy_cache(pb.cache, torch.float8_e4m3fn)
    batch = dataclasses.replace(pb.batch, kv_cache=cache, attn_backend=create_attention_backend(backend))
    batch.attn_backend.init_forward_metadata(batch)
    ours = batch.attn_backend.forward(pb.q, pb.k, pb.v, pb.layer, batch)
    loc = pb.batch.out_cache_loc
    shape = (-1, pb.layer.num_kv_heads, pb.layer.head_dim)
    assert torch.equal(cache.k_buffers[0][loc].to(pb.k.dtype), pb.k.view(shape))
    assert torch.equal(cache.v_buffers[0][loc].to(pb.v.dtype), pb.v.view(shape))
    if backend == "torch_native":
        same, _ = run_backend(TorchNativeBackend(), pb)
        assert torch.equal(ours, same)
        return
    ref, _ = run_backend(TorchNativeBackend(), pb, torch.float32)
    tol = FACTOR * (torch_lowp(pb) - ref).abs().max().item() + FLOOR
    assert ours.dtype == pb.q.dtype and torch.isfinite(ours).all()
    err = (ours.float() - ref).abs().max().item()
    assert err <= tol, f"max |triton over fp8 - torch_fp32| = {err:.3g} > tol {tol:.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("backend", ["triton", "torch_native"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fp8_kv_cache_matches_its_values_in_16_or_32_bits(name, page_size, backend, dtype):
    check_fp8_cache_against_torch(make_problem(SCENARIOS[name], page_size=page_size, dtype=dtype, seed=len(name)),
                                  backend)


@pytest.mark.parametrize("name", ["decode_bs5", "verify_topk2", "draft_decode_k3", "draft_extend_uniform"])
def test_fp8_kv_cache_static_plan(name):
    pb = make_problem(STATIC_SCENARIOS[name], page_size=16, dtype=torch.bfloat16, seed=3)
    static = dataclasses.replace(pb.batch, prefix_lens_cpu=None, extend_lens_cpu=None, static_max_seq_len=600)
    check_fp8_cache_against_torch(dataclasses.replace(pb, batch=static))


# ----------------------------------------------------------------------------- kernels vs refs
from specdec.attention import triton_kernels as tk  # noqa: E402


def test_fp8_cache_tiles_multiply_in_fp16_under_a_16_bit_query():
    from specdec.attention.triton_kernels.common import tile_dtype

    assert tile_dtype(torch.bfloat16, torch.float8_e4m3fn) == torch.float16
    assert tile_dtype(torch.float32, torch.float8_e4m3fn) == torch.float32
    assert tile_dtype(torch.bfloat16, torch.bfloat16) == torch.bfloat16


def test_bf16_query_past_fp16_range_over_fp8_cache_is_clamped():
    """Over an FP8 cache a bf16 query narrows to fp16: a channel of 1e5 is clamped to fp16's largest
    value (65504) rather than becoming inf (inf x 0 = nan): the output is the reference's over the
    clamped query, which differs from the unclamped one's."""
    gen = torch.Generator().manual_seed(5)
    num_slots, kv_len = 64, 40
    k = cast_kv(_rand((num_slots, 2, 16), gen, torch.float32, DEVICE) * 100, torch.float8_e4m3fn)
    v = cast_kv(_rand((num_slots, 2, 16), gen, torch.float32, DEVICE), torch.float8_e4m3fn)
    k[:, :, 1] = 0  # channel 1 of every key is 0: an inf query channel there would give nan scores
    q = _rand((1, 4, 16), gen, torch.float32, DEVICE)
    q[..., :2] = 1e5
    q = q.to(torch.bfloat16)
    slots = torch.randperm(num_slots, generator=gen)[:kv_len].to(torch.int32).to(DEVICE)
    args = (k, v, torch.tensor([0, kv_len], dtype=torch.int32, device=DEVICE), slots)
    kw = dict(sm_scale=1e-6, max_kv_len=kv_len)
    out = torch.full_like(q, float("nan"))
    tk.decode_attention(q, *args, out, **kw)
    clamped, unclamped = torch.empty_like(q, dtype=torch.float32), torch.empty_like(q, dtype=torch.float32)
    tk.decode_attention_ref(q.float().clamp(-65504, 65504), *args, clamped, **kw)
    tk.decode_attention_ref(q.float(), *args, unclamped, **kw)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), clamped, atol=2e-2, rtol=2e-2)
    assert not torch.allclose(out.float(), unclamped, atol=2e-2, rtol=2e-2)


def _indptr(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("bound", [None, 4096], ids=["bound=longest", "bound=4096"])
@pytest.mark.parametrize("num_splits", [None, 1, 2, 7])
def test_decode_kernel_matches_ref(num_splits, bound):
    """Split counts planned or forced, from the longest sequence or from a bound far past every
    length (CUDA graphs at a server's context length): each sequence spreads over the splits. Lengths
    around the kernel's 16-entry tail: no body, a body of one entry, a body of a tile and one."""
    gen = torch.Generator().manual_seed(num_splits or 0)
    lens = [5, 1, 37, 20, 2, 16, 17, 33]
    k = _rand((160, 2, 16), gen, torch.float32, DEVICE)
    v = _rand((160, 2, 16), gen, torch.float32, DEVICE)
    q = _rand((len(lens), 4, 16), gen, torch.float32, DEVICE)
    slots = torch.randperm(160, generator=gen)[: sum(lens)].to(torch.int32).to(DEVICE)
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    args = (q, k, v, _indptr(lens), slots)
    kw = dict(sm_scale=0.3, max_kv_len=bound or max(lens), num_splits=num_splits)
    tk.decode_attention(*args, out, **kw)
    tk.decode_attention_ref(*args, ref, **kw)
    torch.testing.assert_close(out, ref, atol=FLOOR, rtol=0)


# the extend kernel's cases: four sequences, one without a prefix, one whose prefix spans tiles
EXTEND_Q_LENS, EXTEND_PREFIX = [5, 3, 1, 9], [7, 0, 13, 40]
EXTEND_KV_LENS = [a + b for a, b in zip(EXTEND_Q_LENS, EXTEND_PREFIX)]


def _extend_inputs(gen):
    """k, v [150, 2, 16], q [sum(EXTEND_Q_LENS), 4, 16] (fp32) and the sequences' KV slots, packed."""
    k = _rand((150, 2, 16), gen, torch.float32, DEVICE)
    v = _rand((150, 2, 16), gen, torch.float32, DEVICE)
    q = _rand((sum(EXTEND_Q_LENS), 4, 16), gen, torch.float32, DEVICE)
    slots = torch.randperm(150, generator=gen)[: sum(EXTEND_KV_LENS)].to(torch.int32).to(DEVICE)
    return k, v, q, slots


@pytest.mark.parametrize("bound", [None, 4096], ids=["bound=longest", "bound=4096"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("num_splits, new_split", [(1, False), (3, False), (1, True), (3, True), (None, None)])
def test_extend_kernel_matches_ref(masked, num_splits, new_split, bound):
    """Random tree-block masks (diagonal set); a sequence without prefix; the new tokens after the
    last prefix chunk or in a split of their own (unsplit: always after the prefix); the plan from
    the longest prefix or from a bound far past every prefix."""
    gen = torch.Generator().manual_seed(7)
    q_lens, prefix, kv_lens = EXTEND_Q_LENS, EXTEND_PREFIX, EXTEND_KV_LENS
    k, v, q, slots = _extend_inputs(gen)
    mask = mask_indptr = None
    if masked:
        blocks = []
        for n in q_lens:
            m = (torch.rand(n, n, generator=gen) < 0.5) | torch.eye(n, dtype=torch.bool)
            blocks.append(m.flatten())
        mask = torch.cat(blocks).to(torch.uint8).to(DEVICE)
        mask_indptr = _indptr([n * n for n in q_lens]).long()
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    args = (q, k, v, _indptr(q_lens), _indptr(kv_lens), slots, mask, mask_indptr)
    kw = dict(sm_scale=0.25, max_q_len=max(q_lens), max_prefix_len=bound or max(prefix), num_splits=num_splits,
              new_split=new_split)
    tk.extend_attention(*args, out, **kw)
    tk.extend_attention_ref(*args, ref, **kw)
    torch.testing.assert_close(out, ref, atol=FLOOR, rtol=0)


# a prefill batch's sequences (new rows, cached prefix): a prompt recomputed over a long cached prefix, a
# fresh prompt, a chunk after a short prefix, one long new block (several query tiles)
ONE_PLAN_SEQS = [(1, 300), (12, 0), (5, 7), (40, 3)]


def _one_plan_rows(seqs, k, v, q_of, slots_of, dtype, window):
    """extend_attention(one_plan=True) over ``seqs`` (indices into ONE_PLAN_SEQS), causal: each one's rows."""
    q_lens = [ONE_PLAN_SEQS[s][0] for s in seqs]
    kv_lens = [sum(ONE_PLAN_SEQS[s]) for s in seqs]
    q = torch.cat([q_of[s] for s in seqs]).to(dtype)
    out = torch.full_like(q, float("nan"))
    tk.extend_attention(q, k.to(dtype), v.to(dtype), _indptr(q_lens), _indptr(kv_lens),
                        torch.cat([slots_of[s] for s in seqs]), None, None, out, sm_scale=0.25,
                        max_q_len=max(q_lens), max_prefix_len=max(ONE_PLAN_SEQS[s][1] for s in seqs),
                        window=window, one_plan=True)
    return dict(zip(seqs, out.split(q_lens)))


@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_extend_one_plan_rows_depend_on_their_own_sequence_alone(dtype, window):
    """A prefill's rows get the same bits alone and beside any other sequences (the planned path's split
    count and tiles follow the batch: without a window, the recomputed prompt's row over its 300 cached
    entries took other bits alone than beside the others, in bf16 and fp32 alike), and equal the specification."""
    gen = torch.Generator().manual_seed(11)
    k = _rand((400, 2, 16), gen, torch.float32, DEVICE)
    v = _rand((400, 2, 16), gen, torch.float32, DEVICE)
    perm = torch.randperm(400, generator=gen).to(torch.int32).to(DEVICE)
    slots_of, q_of, used = {}, {}, 0
    for s, (n, prefix) in enumerate(ONE_PLAN_SEQS):
        slots_of[s], used = perm[used : used + n + prefix], used + n + prefix
        q_of[s] = _rand((n, 4, 16), gen, torch.float32, DEVICE)
    batches = [[0, 1, 2, 3], [3, 2, 1, 0], [0, 1], [2, 0]] + [[s] for s in range(len(ONE_PLAN_SEQS))]
    rows = [_one_plan_rows(b, k, v, q_of, slots_of, dtype, window) for b in batches]
    for s in range(len(ONE_PLAN_SEQS)):
        mine = [r[s] for r in rows if s in r]
        assert len(mine) >= 2 and all(torch.equal(m, mine[0]) for m in mine), f"sequence {s}"
    alone = {s: rows[len(batches) - len(ONE_PLAN_SEQS) + s][s] for s in range(len(ONE_PLAN_SEQS))}
    q_lens = [n for n, _ in ONE_PLAN_SEQS]
    kv_lens = [n + p for n, p in ONE_PLAN_SEQS]
    q = torch.cat([q_of[s] for s in range(len(ONE_PLAN_SEQS))]).to(dtype)
    ref = torch.full_like(q, float("nan"))
    tk.extend_attention_ref(q, k.to(dtype), v.to(dtype), _indptr(q_lens), _indptr(kv_lens),
                            torch.cat([slots_of[s] for s in range(len(ONE_PLAN_SEQS))]), None, None, ref,
                            sm_scale=0.25, max_q_len=max(q_lens), max_prefix_len=300, window=window)
    got = torch.cat([alone[s] for s in range(len(ONE_PLAN_SEQS))])
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, atol=FLOOR, rtol=0)
    else:
        torch.testing.assert_close(got.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_extend_one_plan_skip_leaves_those_rows():
    """``skip``: the marked sequences' rows keep what ``out`` held (another kernel's), the others equal ref."""
    gen = torch.Generator().manual_seed(3)
    k, v, q, slots = _extend_inputs(gen)
    skip = torch.tensor([0, 1, 1, 0], dtype=torch.int8, device=DEVICE)
    args = (q, k, v, _indptr(EXTEND_Q_LENS), _indptr(EXTEND_KV_LENS), slots, None, None)
    kw = dict(sm_scale=0.25, max_q_len=max(EXTEND_Q_LENS), max_prefix_len=max(EXTEND_PREFIX), one_plan=True,
              skip=skip)
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    tk.extend_attention(*args, out, **kw)
    tk.extend_attention_ref(*args, ref, **kw)
    kept = torch.cat([torch.full((n,), bool(s)) for n, s in zip(EXTEND_Q_LENS, skip.tolist())]).to(DEVICE)
    assert out[kept].isnan().all() and not out[~kept].isnan().any()
    torch.testing.assert_close(out[~kept], ref[~kept], atol=FLOOR, rtol=0)
    with pytest.raises(ValueError, match="skip needs one_plan"):
        tk.extend_attention(*args, out, **{**kw, "one_plan": False})


def test_extend_one_plan_refuses_a_split_plan():
    gen = torch.Generator().manual_seed(0)
    k, v, q, slots = _extend_inputs(gen)
    with pytest.raises(ValueError, match="one_plan"):
        tk.extend_attention(q, k, v, _indptr(EXTEND_Q_LENS), _indptr(EXTEND_KV_LENS), slots, None, None,
                            torch.empty_like(q), sm_scale=0.25, max_q_len=9, max_prefix_len=40, num_splits=2,
                            one_plan=True)


@pytest.mark.parametrize("bound", [None, 4096], ids=["bound=longest", "bound=4096"])
@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("topk, hq", [(1, 4), (3, 4), (8, 4), (5, 16)])  # 5 x 8 = 40 rows: two 32-row m-blocks on CPU
def test_draft_decode_kernel_matches_ref(topk, hq, num_splits, bound):
    """Requests of prefixes 0 to 41 (one empty) in shuffled table rows; each branch's ancestors a
    column slice of a wider scratch table (itself last); split counts planned or forced, from the
    longest prefix or a bound far past it."""
    gen = torch.Generator().manual_seed(topk * 10 + (num_splits or 0))
    prefix, depth, width = [9, 0, 41], 3, 5
    bs, num_slots = len(prefix), 400
    k = _rand((num_slots, 2, 16), gen, torch.float32, DEVICE)
    v = _rand((num_slots, 2, 16), gen, torch.float32, DEVICE)
    q = _rand((bs * topk, hq, 16), gen, torch.float32, DEVICE)
    table = torch.randperm(num_slots, generator=gen)[: 6 * 48].view(6, 48).to(torch.int32).to(DEVICE)
    rows = torch.tensor([4, 0, 2], device=DEVICE)
    scratch = torch.randint(0, num_slots, (bs * topk, width), generator=gen).to(DEVICE)
    args = (q, k, v, table, rows, torch.tensor(prefix, device=DEVICE), scratch[:, :depth])
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    kw = dict(sm_scale=0.3, max_prefix_len=bound or max(prefix), num_splits=num_splits)
    tk.draft_decode_attention(*args, out, **kw)
    tk.draft_decode_attention_ref(*args, ref, **kw)
    torch.testing.assert_close(out, ref, atol=FLOOR, rtol=0)


def _poisoned(buf: torch.Tensor, slots: list[torch.Tensor]) -> torch.Tensor:
    """A copy of ``buf`` with NaN at ``slots``: entries a kernel must not read (one read poisons its row)."""
    out = buf.clone()
    out[torch.cat(slots).long()] = float("nan")
    return out


@pytest.mark.parametrize("bound", [None, 4096], ids=["bound=longest", "bound=4096"])
@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("window", [1, 6, 30])
def test_decode_kernel_with_window_reads_the_window_alone(window, num_splits, bound):
    """A local layer's decode: each sequence's last ``window`` entries, cut into the splits, give the
    reference's result, and every entry before them holds NaN."""
    gen = torch.Generator().manual_seed(window)
    lens = [5, 1, 37, 20, 2]
    k = _rand((120, 2, 16), gen, torch.float32, DEVICE)
    v = _rand((120, 2, 16), gen, torch.float32, DEVICE)
    q = _rand((len(lens), 4, 16), gen, torch.float32, DEVICE)
    slots = torch.randperm(120, generator=gen)[: sum(lens)].to(torch.int32).to(DEVICE)
    indptr = _indptr(lens)
    ends = indptr[1:].tolist()
    hidden = [slots[e - n : max(e - n, e - window)] for e, n in zip(ends, lens)]
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    kw = dict(sm_scale=0.3, max_kv_len=bound or max(lens), num_splits=num_splits, window=window)
    tk.decode_attention(q, _poisoned(k, hidden), _poisoned(v, hidden), indptr, slots, out, **kw)
    tk.decode_attention_ref(q, k, v, indptr, slots, ref, **kw)
    torch.testing.assert_close(out, ref, atol=FLOOR, rtol=0)


@pytest.mark.parametrize("num_splits, new_split", [(None, None), (3, False), (3, True)])
@pytest.mark.parametrize("window", [1, 5, 12])
@pytest.mark.parametrize("masked", [False, True])
def test_extend_kernel_with_window_matches_ref(masked, window, num_splits, new_split):
    """Causal rows at prefix + row, or random trees' nodes at prefix + depth (``positions``), each over
    its own window; the entries before the first row's window (prefix - window + 1) hold NaN."""
    gen = torch.Generator().manual_seed(13)
    q_lens, prefix, kv_lens = EXTEND_Q_LENS, EXTEND_PREFIX, EXTEND_KV_LENS
    k, v, q, slots = _extend_inputs(gen)
    kv_indptr = _indptr(kv_lens)
    hidden = [slots[s : s + max(0, p - window + 1)] for s, p in zip(kv_indptr.tolist(), prefix)]
    mask = mask_indptr = None
    positions = torch.cat([p + torch.arange(n) for p, n in zip(prefix, q_lens)])  # causal: not read
    if masked:
        trees = [random_tree(n, seed) for seed, n in enumerate(q_lens)]
        mask = torch.cat([tree_mask(t).flatten() for t in trees]).to(torch.uint8).to(DEVICE)
        mask_indptr = _indptr([n * n for n in q_lens]).long()
        positions = torch.cat([p + tree_mask(t).sum(1) - 1 for p, t in zip(prefix, trees)])
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    kw = dict(sm_scale=0.25, max_q_len=max(q_lens), max_prefix_len=max(prefix), num_splits=num_splits,
              new_split=new_split, window=window, positions=positions.to(DEVICE))
    tk.extend_attention(q, _poisoned(k, hidden), _poisoned(v, hidden), _indptr(q_lens), kv_indptr, slots, mask,
                        mask_indptr, out, **kw)
    tk.extend_attention_ref(q, k, v, _indptr(q_lens), kv_indptr, slots, mask, mask_indptr, ref, **kw)
    torch.testing.assert_close(out, ref, atol=FLOOR, rtol=0)


def test_extend_kernel_window_under_a_mask_needs_positions():
    q = torch.zeros(2, 4, 16, device=DEVICE)
    kv = torch.zeros(10, 2, 16, device=DEVICE)
    one = _indptr([2])
    mask = torch.ones(4, dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="needs the rows' positions"):
        tk.extend_attention(q, kv, kv, one, one, one[:2], mask, _indptr([4]).long(), torch.empty_like(q),
                            sm_scale=1.0, max_q_len=2, max_prefix_len=0, window=3)


@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("window", [1, 2, 10, 45])
def test_draft_decode_kernel_with_window_reads_the_window_alone(window, num_splits):
    """Branches at prefix + depth - 1 (depth 3, topk 3): windows 1 and 2 see their last ancestors
    alone, 10 the prefix's end too, 45 everything; every entry before the window holds NaN."""
    gen = torch.Generator().manual_seed(window)
    prefix, depth, topk, num_slots = [9, 0, 41], 3, 3, 400
    bs = len(prefix)
    k = _rand((num_slots, 2, 16), gen, torch.float32, DEVICE)
    v = _rand((num_slots, 2, 16), gen, torch.float32, DEVICE)
    q = _rand((bs * topk, 4, 16), gen, torch.float32, DEVICE)
    perm = torch.randperm(num_slots, generator=gen).to(torch.int32)
    table = perm[: 6 * 48].view(6, 48).to(DEVICE)
    ancestors = perm[6 * 48 : 6 * 48 + bs * topk * depth].view(bs * topk, depth).long().to(DEVICE)
    rows = [4, 0, 2]
    hidden = [table[r, : min(p, max(0, p + depth - window))] for r, p in zip(rows, prefix)]
    hidden.append(ancestors[:, : max(0, depth - window)].flatten().to(torch.int32))
    args = (table, torch.tensor(rows, device=DEVICE), torch.tensor(prefix, device=DEVICE), ancestors)
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    kw = dict(sm_scale=0.3, max_prefix_len=max(prefix), num_splits=num_splits, window=window)
    tk.draft_decode_attention(q, _poisoned(k, hidden), _poisoned(v, hidden), *args, out, **kw)
    tk.draft_decode_attention_ref(q, k, v, *args, ref, **kw)
    torch.testing.assert_close(out, ref, atol=FLOOR, rtol=0)


def test_draft_decode_kernel_rejects_rows_that_are_not_topk_per_request():
    q = torch.zeros(5, 4, 16, device=DEVICE)
    kv = torch.zeros(10, 2, 16, device=DEVICE)
    table = torch.zeros(2, 8, dtype=torch.int32, device=DEVICE)
    two = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="not topk each for 2 requests"):
        tk.draft_decode_attention(q, kv, kv, table, two, two, torch.zeros(5, 1, dtype=torch.int64, device=DEVICE),
                                  torch.empty_like(q), sm_scale=1.0, max_prefix_len=8)


def test_extend_kernel_new_split_chosen_by_the_planner():
    """A tree of 32 nodes over a prefix spanning several chunks, one sequence: the planner runs the
    new block in a split of its own (on CPU: 6 SMs, 32-row tiles, so 64 rows of one KV head are 2
    programs), and the result still equals the reference."""
    from specdec.attention.triton_kernels import common

    gen = torch.Generator().manual_seed(11)
    n, prefix = 32, 300  # 32 nodes x group 2 = 64 rows
    if DEVICE.type == "cpu":
        assert common.plan_extend_splits(2, prefix, 2 * n, device=DEVICE, tile=16) == (2, 160, True)
    k = _rand((340, 1, 16), gen, torch.float32, DEVICE)
    v = _rand((340, 1, 16), gen, torch.float32, DEVICE)
    q = _rand((n, 2, 16), gen, torch.float32, DEVICE)
    slots = torch.randperm(340, generator=gen)[: prefix + n].to(torch.int32).to(DEVICE)
    mask = ((torch.rand(n, n, generator=gen) < 0.5) | torch.eye(n, dtype=torch.bool)).flatten().to(torch.uint8)
    args = (q, k, v, _indptr([n]), _indptr([prefix + n]), slots, mask.to(DEVICE), _indptr([n * n]).long())
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    kw = dict(sm_scale=0.25, max_q_len=n, max_prefix_len=prefix)
    tk.extend_attention(*args, out, **kw)
    tk.extend_attention_ref(*args, ref, **kw)
    torch.testing.assert_close(out, ref, atol=FLOOR, rtol=0)


@pytest.mark.parametrize("ctas, prefix_len, rows, forced, expected", [
    (8, 1088, 128, None, (5, 256, True)),  # bs 1 tree verify at 1 k: 5 chunks of 2 tiles + the new block
    (8, 4160, 128, None, (11, 384, True)),  # at 4 k: 12 x 8 = 96 programs, one wave
    (32, 1088, 128, None, (3, 384, True)),  # bs 4: 4 x 32 = 128 programs
    (32, 1088, 16, None, (5, 256, False)),  # a chain's 4 nodes: plan_num_splits, new block after the prefix
    (64, 1088, 128, None, (3, 384, False)),  # past a third of the SMs: likewise
    (8, 200, 128, None, (1, 256, False)),  # a prefix under two chunks: nothing to take off its path
    (8, 1088, 128, 3, (3, 384, False)),  # a forced split count keeps the new block after the prefix
])
def test_plan_extend_splits(ctas, prefix_len, rows, forced, expected, monkeypatch):
    from specdec.attention.triton_kernels import common

    monkeypatch.setattr(common, "_sm_count", lambda device: 132)
    assert common.plan_extend_splits(ctas, prefix_len, rows, device=torch.device("cuda"), tile=128,
                                     num_splits=forced) == expected


@pytest.mark.parametrize("ctas, prefix_len, expected", [
    (128, 512, (1, 512)),  # bs 8, 64 nodes: two 128-row tiles a KV head fill the SMs; one split
    (128, 4160, (1, 4224)),  # likewise at 4 k (two splits took 236 µs a layer against 165)
    (64, 1088, (2, 640)),  # bs 8, 32 nodes: two splits fit one wave (plan_num_splits: three, two waves)
    (200, 4160, (1, 4224)),  # more programs than SMs: none
])
def test_plan_extend_splits_full_tiles_fit_one_wave(ctas, prefix_len, expected, monkeypatch):
    """Full 128-row tiles past a third of the SMs: the prefix is cut only as far as every program
    still runs in the first wave."""
    from specdec.attention.triton_kernels import common

    monkeypatch.setattr(common, "_sm_count", lambda device: 132)
    cuda = torch.device("cuda")
    assert common.plan_extend_splits(ctas, prefix_len, 128, device=cuda, tile=128, block_m=128) == expected + (False,)
    # smaller tiles keep plan_num_splits' cut
    assert common.plan_extend_splits(ctas, prefix_len, 16, device=cuda, tile=128, block_m=16)[:2] == \
        common.plan_num_splits(ctas, prefix_len, device=cuda, tile=128)


@pytest.mark.parametrize("num_seqs, rows, prefix_len, expected", [
    (1, 128, 1088, 64),  # bs 1, 32 tree nodes x 4 heads at 1 k: 16 programs of 64 rows
    (1, 256, 1088, 64),  # 64 nodes: 32 programs
    (2, 128, 1600, 64),  # bs 2: 32 programs
    (4, 128, 1088, 128),  # bs 4: 64 programs of 64 rows fill more than a third of the SMs
    (1, 256, 4160, 128),  # a 4 k prefix
    (1, 64, 1088, 64),  # 64 rows or fewer: as many as the rows
    (16, 16, 1088, 16),  # a chain of 4 nodes
])
def test_extend_block_m(num_seqs, rows, prefix_len, expected, monkeypatch):
    from specdec.attention.triton_kernels import common

    monkeypatch.setattr(common, "_sm_count", lambda device: 132)
    got = common.extend_block_m(torch.device("cuda"), rows=rows, num_seqs=num_seqs, num_kv_heads=8,
                                max_prefix_len=prefix_len)
    assert got == expected
    assert common.extend_block_m(torch.device("cpu"), rows=rows, num_seqs=num_seqs, num_kv_heads=8,
                                 max_prefix_len=prefix_len) == min(32, max(16, rows))


@pytest.mark.parametrize("ctas, splits, expected", [
    (512, 1, True),  # bs 64 decode, 8 KV heads: 3.9 programs an SM
    (1024, 1, True),
    (256, 1, False),  # bs 32: 1.9 an SM keeps the default tiles
    (512, 2, False),  # a split grid is not streaming
])
def test_streaming_decode_grid(ctas, splits, expected, monkeypatch):
    from specdec.attention.triton_kernels import common

    monkeypatch.setattr(common, "_sm_count", lambda device: 132)
    cuda = torch.device("cuda")
    assert common.is_streaming_grid(cuda, ctas, splits) == expected
    assert not common.is_streaming_grid(torch.device("cpu"), ctas, splits)
    # verify and draft-step tiles stream up to STREAMING_MAX_ROWS (query row, head) rows, never past
    assert common.is_streaming_grid(cuda, ctas, splits, block_m=common.STREAMING_MAX_ROWS) == expected
    assert not common.is_streaming_grid(cuda, ctas, splits, block_m=2 * common.STREAMING_MAX_ROWS)


def test_launch_config_streaming_and_shared_memory_fit():
    from specdec.attention.triton_kernels import common

    cuda = torch.device("cuda")
    assert common.launch_config(cuda, block_m=16, head_dim=128, elem_size=2) == (128, 4, 2)
    assert common.launch_config(cuda, block_m=16, head_dim=128, elem_size=2, streaming=True) == (64, 2, 3)
    # fp32 head_dim 256: stages, then tile width, shrink into SMEM_BUDGET
    big = common.launch_config(cuda, block_m=16, head_dim=256, elem_size=4, streaming=True)
    assert big.num_stages * 2 * big.block_n * 256 * 4 + 16 * 256 * 4 <= common.SMEM_BUDGET
    assert big == (32, 2, 2)


@pytest.mark.parametrize("q_len, block_n, expected", [(1, 128, 16), (4, 128, 16), (16, 128, 16), (17, 128, 128),
                                                       (64, 128, 128), (300, 64, 64), (4, 16, 16)])
def test_new_block_n(q_len, block_n, expected):
    from specdec.attention.triton_kernels.extend import new_block_n

    assert new_block_n(q_len, block_n) == expected


@pytest.mark.parametrize("rows,heads,splits,d", [(5, 3, 4, 16), (3, 32, 8, 128), (2, 5, 1, 16), (4, 12, 3, 64)])
def test_merge_kernel_matches_ref_with_empty_splits(rows, heads, splits, d):
    """Several heads a program, the last block of heads ragged; empty splits and rows with one."""
    gen = torch.Generator().manual_seed(3)
    partial = _rand((rows, heads, splits, d), gen, torch.float32, DEVICE)
    lse = _rand((rows, heads, splits), gen, torch.float32, DEVICE) * 4
    lse[:, :, -1] = float("-inf") if splits > 1 else lse[:, :, -1]  # an empty last split
    lse[0, 0, 1:] = float("-inf")  # only one split saw anything
    out, ref = (torch.full((rows, heads, d), float("nan"), device=DEVICE) for _ in range(2))
    tk.merge_partials(partial, lse, out)
    tk.merge_partials_ref(partial, lse, ref)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out[0, 0], partial[0, 0, 0])


def test_kernel_wrappers_check_inputs():
    q = torch.randn(2, 4, 16, device=DEVICE)
    kv = torch.randn(10, 2, 16, device=DEVICE)
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="kv_indices"):
        tk.decode_attention(q, kv, kv, indptr, torch.zeros(2, dtype=torch.int64, device=DEVICE),
                            torch.empty_like(q), sm_scale=1.0, max_kv_len=1)
    with pytest.raises(ValueError, match="do not fit"):
        tk.decode_attention(q[:, :3], kv, kv, indptr, indptr[:2], torch.empty_like(q[:, :3]),
                            sm_scale=1.0, max_kv_len=1)


# ----------------------------------------------------------------------------- GPU: real sizes
GPU_SCENARIOS = {
    "decode_bs8": Scenario(D, (512, 4096, 777, 1500, 2048, 3001, 600, 4000), (1,) * 8),
    "decode_bs1_long": Scenario(D, (4096,), (1,)),
    "extend_prefix": Scenario(E, (1024, 0), (512, 300)),
    "draft_extend": Scenario(DE, (2000, 513, 4095), (5, 1, 3)),
    "verify_n8": Scenario(V, (512, 4096, 1000, 2222), (8,) * 4, trees=tuple(random_tree(8, s) for s in range(4))),
    "verify_n64": Scenario(V, (4096, 700), (64, 64), trees=(random_tree(64, 1), random_tree(64, 2))),
    "verify_chain_bs1": Scenario(V, (3000,), (5,), trees=(CHAIN,)),
    # 64 x 8 KV heads: a grid of 3+ programs an SM, which streams its KV through the decode tiles
    "verify_chain_bs64": Scenario(V, tuple(300 + 23 * i for i in range(64)), (4,) * 64, trees=(CHAIN[:4],) * 64),
    "verify_n8_bs64": Scenario(V, tuple(1100 - 9 * i for i in range(64)), (8,) * 64,
                               trees=tuple(random_tree(8, s) for s in range(64))),
    "draft_decode_k8": Scenario(D, (2048, 512, 4000), (8, 8, 8), depth=5),
    # 64 requests x 8 KV heads, 2 branches: the draft step's grid that streams its KV through small tiles
    "draft_decode_bs64_k2": Scenario(D, tuple(700 + 31 * i for i in range(64)), (2,) * 64, depth=2),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", [(32, 8, 128), (8, 1, 64)], ids=["llama3_d128", "g8_d64"])
@pytest.mark.parametrize("name", list(GPU_SCENARIOS))
def test_gpu_matches_torch_native(name, heads, dtype):
    hq, hkv, d = heads
    pb = make_problem(GPU_SCENARIOS[name], page_size=16 if "verify" in name else 1, dtype=dtype,
                      hq=hq, hkv=hkv, d=d, seed=len(name))
    check_against_torch(pb)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_SCENARIOS))
def test_gpu_fp8_kv_cache_matches_its_values_in_bf16(name):
    pb = make_problem(GPU_SCENARIOS[name], page_size=16 if "verify" in name else 1, dtype=torch.bfloat16,
                      hq=32, hkv=8, d=128, seed=len(name))
    check_fp8_cache_against_torch(pb)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 5])
@pytest.mark.parametrize("name", ["decode_bs8", "verify_n8", "draft_decode_k8"])
def test_gpu_forced_splits(name, num_splits):
    pb = make_problem(GPU_SCENARIOS[name], page_size=1, dtype=torch.bfloat16, hq=32, hkv=8, d=128)
    check_against_torch(pb, num_splits=num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("window", [1, 128, 1000])
@pytest.mark.parametrize("name", list(GPU_SCENARIOS))
def test_gpu_sliding_window_matches_torch_native(name, window):
    """Local layers at real sizes: a window of 1, of one tile, and one inside the longer contexts
    (Gemma 3's are 512 or 1024 entries, Mistral's 4096)."""
    pb = make_problem(GPU_SCENARIOS[name], page_size=16 if "verify" in name else 1, dtype=torch.bfloat16,
                      hq=32, hkv=8, d=128, seed=len(name), window=window)
    check_against_torch(pb)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 5])
@pytest.mark.parametrize("name", ["decode_bs8", "verify_n8", "verify_chain_bs64", "draft_decode_k8"])
def test_gpu_sliding_window_static_plan(name, num_splits):
    """The CUDA-graph plan at a server's bound (8192) with a 512-entry window: planned, and forced splits."""
    pb = make_problem(GPU_SCENARIOS[name], page_size=1, dtype=torch.bfloat16, hq=32, hkv=8, d=128, window=512)
    static = dataclasses.replace(pb.batch, prefix_lens_cpu=None, extend_lens_cpu=None, static_max_seq_len=8192)
    check_against_torch(dataclasses.replace(pb, batch=static), num_splits=num_splits)


# ----------------------------------------------------------------------------- GPU: end to end
def _greedy(max_new):
    return [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in max_new]


def _pair(algorithm: str, kind: str, dtype: torch.dtype):
    from specdec.models.llama import default_eagle3_layers
    from ..builders import make_perfect_draft_pair, make_random_eagle3_head, \
        make_random_eagle_head, make_random_target, tiny_llama_config

    config = tiny_llama_config()
    if kind == "perfect":
        target, draft = make_perfect_draft_pair(config, algorithm, seed=0, dtype=dtype)
        return target.to("cuda"), draft.to("cuda")
    aux = default_eagle3_layers(config.num_hidden_layers) if algorithm == "EAGLE3" else None
    target = make_random_target(config, 0, dtype, aux_hidden_layers=aux, device="cuda")
    if algorithm == "EAGLE3":
        return target, make_random_eagle3_head(target, 1, draft_vocab_size=config.vocab_size - 20)
    return target, make_random_eagle_head(target, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1, 2), (3, 1, 4), (5, 4, 8), (6, 10, 60)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("algorithm, kind", [("EAGLE", "random"), ("EAGLE3", "random"), ("EAGLE", "perfect")])
@pytest.mark.parametrize("bs, page_size", [(1, 1), (7, 16)])
def test_gpu_engine_lossless(shape, algorithm, kind, bs, page_size):
    import specdec

    target, draft = _pair(algorithm, kind, torch.float32)
    gen = torch.Generator().manual_seed(0)
    lengths = [11] if bs == 1 else [1, 9, 4, 23, 2, 15, 6]
    max_new = [28] if bs == 1 else [17, 5, 30, 12, 1, 24, 9]
    prompts = [torch.randint(3, target.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    common = dict(target_model=target, attention_backend="triton", device="cuda", page_size=page_size,
                  max_total_tokens=8192, max_running_requests=16)
    plain = specdec.Engine(**common)
    expected = [r["output_ids"] for r in plain.generate(input_ids=prompts, sampling_params=_greedy(max_new))]
    steps, topk, ntok = shape
    spec = specdec.Engine(**common, draft_model=draft, speculative_algorithm=algorithm, speculative_num_steps=steps,
                          speculative_eagle_topk=topk, speculative_num_draft_tokens=ntok)
    results = spec.generate(input_ids=prompts, sampling_params=_greedy(max_new))
    assert [r["output_ids"] for r in results] == expected


def test_verify_runs_as_decode_steps_up_to_the_caps():
    """Tree nodes run as decode steps up to ``verify_rows_max_nodes`` nodes a tree or
    ``verify_as_decode_max_rows`` nodes a batch (trees of one size); larger trees in larger batches and
    mixed tree sizes take the extend kernel."""
    from specdec.attention.triton_backend import TritonMetadata, VerifyRowsMetadata

    def plan(name, **kw):
        batch = dataclasses.replace(make_problem(SCENARIOS[name], page_size=1, dtype=torch.float32).batch)
        create_attention_backend("triton", **kw).init_forward_metadata(batch)
        return type(batch.attn_metadata)

    assert plan("verify_chain") is VerifyRowsMetadata  # 2 requests x 5 nodes
    assert plan("verify_chain", verify_as_decode_max_rows=9, verify_rows_max_nodes=4) is TritonMetadata
    assert plan("verify_chain", verify_as_decode_max_rows=10, verify_rows_max_nodes=4) is VerifyRowsMetadata
    assert plan("verify_chain", verify_as_decode_max_rows=9, verify_rows_max_nodes=5) is VerifyRowsMetadata
    assert plan("verify_mixed") is TritonMetadata  # trees of 7 and 12 nodes


def test_ngram_default_chains_verify_as_decode_steps_at_any_batch():
    """NGRAM's default verify (a chain of ``DEFAULT_MAX_MATCH_WINDOW`` = 12 nodes) runs as decode steps by
    default past the row cap too (6 requests: 72 rows): on the extend kernel its bf16 answers parted from
    plain decoding's far more often (benchmarks/results/2026-12-01-h200-ngram-agreement); trees past 16 nodes
    take the extend kernel."""
    from specdec.attention.triton_backend import TritonMetadata, VerifyRowsMetadata
    from specdec.ngram.config import DEFAULT_MAX_MATCH_WINDOW

    def plan(nodes):
        chain = tuple(range(-1, nodes - 1))
        sc = Scenario(V, (5, 9, 0, 14, 3, 7), (nodes,) * 6, trees=(chain,) * 6)
        batch = make_problem(sc, page_size=1, dtype=torch.float32).batch
        create_attention_backend("triton").init_forward_metadata(batch)
        return type(batch.attn_metadata)

    assert plan(DEFAULT_MAX_MATCH_WINDOW) is VerifyRowsMetadata
    assert plan(16) is VerifyRowsMetadata
    assert plan(17) is TritonMetadata
