"""Deterministic inference's batch-invariant linear (``specdec.models.ops.batch_invariant``): a row's
bits do not depend on M. Interpreted on CPU (TRITON_INTERPRET=1), compiled on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdec.forward import batch_invariant
from specdec.models.ops import gemv
from specdec.models.ops.batch_invariant import linear_batch_invariant, linear_batch_invariant_ref

from ..triton_env import import_kernels, rand

import_kernels("specdec.models.ops.batch_invariant_kernels")
pytestmark = pytest.mark.usefixtures("triton_interpreter")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n,k", [(100, 72), (37, 130)])  # N, K not multiples of the 64-wide tiles
def test_rows_identical_at_any_m(dtype, n, k):
    """Each of 37 rows computed alone (M = 1) equals its row of the M = 37 product, bit for bit;
    and the product is F.linear up to one rounding of the output."""
    x, w, b = (rand(*s, dtype=dtype, device=DEVICE, seed=i) for i, s in enumerate([(37, k), (n, k), (n,)]))
    whole = linear_batch_invariant(x, w, b)
    alone = torch.cat([linear_batch_invariant(x[i : i + 1], w, b) for i in range(37)])
    assert torch.equal(whole, alone)
    middle = linear_batch_invariant(x[5:22], w, b)  # M = 17: rows at other tile positions
    assert torch.equal(middle, whole[5:22])
    ref = F.linear(x.float(), w.float(), b.float())
    bound = torch.finfo(dtype).eps * ref.abs() + 1e-5 * k  # one output rounding + fp32 sums
    assert ((whole.float() - ref).abs() <= bound).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_launch_gives_the_same_rows(dtype):
    """launch_for's launches and others (16- and 64-row tiles, 16 to 128 columns, 64- and
    128-deep K chunks) give every row the bits M = 1 gives it, at M = 1, 5, 16, 40 and 130 (K 200:
    full chunks and a tail)."""
    kernels = pytest.importorskip("specdec.models.ops.batch_invariant_kernels")
    x, w = rand(130, 200, dtype=dtype, device=DEVICE, seed=3), rand(90, 200, dtype=dtype, device=DEVICE, seed=4)
    alone = torch.cat([linear_batch_invariant(x[i : i + 1], w) for i in range(130)])
    launches = [kernels.SKINNY, kernels.WIDE, kernels.WIDER, kernels.WIDE_NARROW, kernels.WIDER_NARROW,
                kernels.Launch(16, 64, 4, 2, block_k=128),
                kernels.Launch(64, 32, 4, 2, block_k=128)]
    for launch in launches:
        for m in (1, 5, 16, 40, 130):
            got = kernels.linear(x[:m], w, None, out_dtype=dtype, launch=launch)
            assert torch.equal(got, alone[:m]), (launch, m)
    logits = kernels.linear(x, w, None, out_dtype=torch.float32, launch=kernels.WIDER)
    assert torch.equal(logits[129:], linear_batch_invariant(x[129:], w, out_dtype=torch.float32))


def test_launch_by_rows():
    kernels = pytest.importorskip("specdec.models.ops.batch_invariant_kernels")
    assert [kernels.launch_for(m, 6144).tile_m for m in (1, 16, 17, 64, 65, 4096)] == [16, 16, 64, 64, 64, 64]
    assert kernels.launch_for(64, 6144) == kernels.WIDE and kernels.launch_for(65, 6144) == kernels.WIDER
    assert kernels.launch_for(64, 4096) == kernels.WIDE_NARROW and kernels.launch_for(65, 4096) == kernels.WIDER_NARROW
    assert kernels.launch_for(16, 4096) == kernels.launch_for(16, 6144) == kernels.SKINNY


def test_pipeline_fits_shared_memory():
    """The stages shrink to what the GPU's shared memory holds (never below 2); nothing else changes."""
    kernels = pytest.importorskip("specdec.models.ops.batch_invariant_kernels")
    wider = kernels.WIDER  # a stage: (64 + 128) x 128 x 2 B = 48 KiB
    assert kernels.fit_stages(wider, 2, 232_448) == wider  # an H200: 4 stages
    assert kernels.fit_stages(wider, 2, 166_912) == wider._replace(num_stages=3)  # an A100
    assert kernels.fit_stages(wider, 4, 101_376).num_stages == 2


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 14336), (128256, 4096)])  # 8B: qkv, down, lm_head
def test_gpu_decode_rows_equal_verify_rows_at_real_sizes(n, k):
    """At the 8B's shapes, compiled: a decode step's rows (M = 1 and 16: 16-row tiles) equal the same
    rows of a bs-8 verify of 8 nodes (M = 64: 64-row tiles) and of a bs-128 step (M = 128: 64 rows by
    128 columns), bit for bit, bf16 and fp32 logits."""
    x, w = rand(128, k, dtype=torch.bfloat16, device=DEVICE), rand(n, k, dtype=torch.bfloat16, device=DEVICE, seed=1)
    out_dtype = torch.float32 if n > 100_000 else None
    whole = linear_batch_invariant(x, w, out_dtype=out_dtype)
    assert torch.equal(linear_batch_invariant(x[:64], w, out_dtype=out_dtype), whole[:64])
    assert torch.equal(linear_batch_invariant(x[5:6], w, out_dtype=out_dtype), whole[5:6])
    assert torch.equal(linear_batch_invariant(x[16:32], w, out_dtype=out_dtype), whole[16:32])
    x_graph = x[:1].clone()
    graph = torch.cuda.CUDAGraph()
    linear_batch_invariant(x_graph, w, out_dtype=out_dtype)  # compile outside the capture
    with torch.cuda.graph(graph):
        captured = linear_batch_invariant(x_graph, w, out_dtype=out_dtype)
    x_graph.copy_(x[9:10])
    graph.replay()
    assert torch.equal(captured, whole[9:10])


# Llama-3.1-8B (qkv, o, gate_up whole and its tp-2 shard, down, lm_head) and SmolLM2-135M (qkv, gate_up,
# down, lm_head: K = 576 and 1536, not multiples of the 256-deep chunks)
_MODEL_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (14336, 4096), (4096, 14336), (128256, 4096),
                 (960, 576), (3072, 576), (576, 1536), (49152, 576)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", _MODEL_SHAPES, ids=lambda v: str(v))
def test_gpu_deterministic_linear_rows_equal_at_every_m(n, k):
    """Under the switch ``gemv.linear`` takes the default path's tensor-core tilings where its table
    has one (32- and 16-row tiles, swap-AB tiles up to 64 tokens) and the batch-invariant kernel
    elsewhere: every M from 1 to 130 gives each row the bits of the batch-invariant kernel's M = 1
    launch, the logits (fp32, unrounded) too."""
    x, w = rand(130, k, dtype=torch.bfloat16, device=DEVICE), rand(n, k, dtype=torch.bfloat16, device=DEVICE, seed=1)
    out_dtype = torch.float32 if n > 40_000 else None
    alone = torch.cat([linear_batch_invariant(x[i : i + 1], w, out_dtype=out_dtype) for i in (0, 7, 40, 129)])
    with batch_invariant():
        for m in (1, 2, 3, 8, 9, 16, 17, 32, 33, 48, 64, 65, 130):
            rows = gemv.linear(x[:m], w, out_dtype=out_dtype)
            config = gemv.plan(x[:m], w, None)
            picked = [i for i in (0, 7, 40, 129) if i < m]
            assert torch.equal(rows[picked], alone[: len(picked)]), (m, config)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 14336), (49152, 576)], ids=lambda v: str(v))
def test_gpu_every_default_tiling_gives_the_batch_invariant_rows(n, k):
    """The default path's kernel at each tensor-core tiling of its table, at M = 1, 64 and 130 (two or
    more row tiles): the batch-invariant kernel's M = 1 bits, so any of them may serve deterministic
    inference at any M."""
    gk = pytest.importorskip("specdec.models.ops.gemv_kernels")
    C = gk.GemvConfig
    configs = [C(32, 256, 4, 4, use_dot=True), C(32, 512, 4, 3, use_dot=True),
               C(64, 128, 4, 5, use_dot=True, swap_ab=True), C(128, 128, 8, 3, use_dot=True, swap_ab=True)]
    x, w = rand(130, k, dtype=torch.bfloat16, device=DEVICE), rand(n, k, dtype=torch.bfloat16, device=DEVICE, seed=1)
    out_dtype = torch.float32 if n > 40_000 else None
    picked = [0, 63, 64, 129]
    alone = torch.cat([linear_batch_invariant(x[i : i + 1], w, out_dtype=out_dtype) for i in picked])
    for config in configs:
        for m in (1, 64, 130):
            rows = gk.gemv(x[:m], w, None, config, out_dtype=out_dtype, round_out=False)
            inside = [j for j, i in enumerate(picked) if i < m]
            assert torch.equal(rows[[picked[j] for j in inside]], alone[inside]), (config, m)


def test_fp32_logits_are_not_rounded_to_the_model_dtype():
    x, w = rand(9, 64, dtype=torch.bfloat16, device=DEVICE), rand(50, 64, dtype=torch.bfloat16, device=DEVICE, seed=1)
    logits = linear_batch_invariant(x, w, out_dtype=torch.float32)
    assert logits.dtype == torch.float32
    assert not torch.equal(logits, logits.to(torch.bfloat16).float())  # fp32 values, not widened bf16 ones
    assert torch.equal(logits[3:4], linear_batch_invariant(x[3:4], w, out_dtype=torch.float32))
    torch.testing.assert_close(logits, F.linear(x.float(), w.float()), rtol=1e-5, atol=1e-5)


def test_reference_is_row_by_row():
    x, w = rand(7, 32, dtype=torch.bfloat16), rand(16, 32, dtype=torch.bfloat16, seed=1)
    whole = linear_batch_invariant_ref(x, w)
    assert torch.equal(whole[2:3], linear_batch_invariant_ref(x[2:3], w))


def test_linear_takes_the_batch_invariant_path_under_the_switch():
    x, w = rand(20, 64, dtype=torch.bfloat16, device=DEVICE), rand(48, 64, dtype=torch.bfloat16, device=DEVICE, seed=1)
    with batch_invariant():
        out = gemv.linear(x, w)
        assert torch.equal(out, linear_batch_invariant(x, w))
        assert torch.equal(out[7:8], gemv.linear(x[7:8], w))


def test_inputs_checked():
    with pytest.raises(ValueError, match="expected \\[M, K\\]"):
        linear_batch_invariant(torch.zeros(2, 3), torch.zeros(4, 5))
    with pytest.raises(ValueError, match="dtype"):
        linear_batch_invariant(torch.zeros(2, 3), torch.zeros(4, 3, dtype=torch.bfloat16))
