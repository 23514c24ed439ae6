"""The split-K Triton W8A8 GEMM (``specdec.models.ops.w8a8_kernels``) against ``gemv.linear_w8a8_ref``.

CPU (Triton's interpreter, small shapes): every split of K (1, 2, uneven 3, more splits than K
chunks), token and weight counts that are no multiple of the tile, a bias; the tickets back at
zero after every launch; a second launch equal to the first (the reduction sums the partials in
split order). GPU (marked): the draft head's shapes at the dispatch table's tilings and at every
split, and CUDA-graph replays equal to eager launches.

Tolerance, per output element, against the float64 product of the same quantized operands with
both scales and the bias applied (what ``gemv.linear_w8a8_ref`` rounds once to bf16):

    |out - ref| <= eps * |ref|  +  (K + 3) * 2^-24 * (|x_q| @ |W_q|^T, scaled)

eps = bf16's machine epsilon (one rounding; the interpreter truncates, a whole ulp); the second
term bounds fp32 sums over K in any order and the scalings (on the GPU the FP8 MMA sums each
chunk of 128 products in its own precision before the promotion to fp32; the H100 stays inside
the bound at every shape tested). A split's partial sum lost or counted
twice, a wrong scale or an unwritten tile is off by O(|ref|).
"""

from __future__ import annotations

import pytest
import torch

from ..triton_env import import_kernels, rand

wk = import_kernels("specdec.models.ops.w8a8_kernels")
quantize_rows_fp8 = import_kernels("specdec.models.ops.gemv_kernels").quantize_rows_fp8

from specdec.models.ops import gemv  # noqa: E402

C = wk.W8A8Config
pytestmark = pytest.mark.usefixtures("triton_interpreter")


def operands(m: int, n: int, k: int, *, device: str = "cpu", seed: int = 0):
    """x [m, k] bf16 with rows of very different scales, its per-token FP8 quantization, and an
    FP8 copy of a random [n, k] weight."""
    x = rand(m, k, dtype=torch.bfloat16, device=device, seed=seed, scale=2.0)
    x[0] *= 30.0
    weight = gemv.attach_fp8_copy_(rand(n, k, dtype=torch.bfloat16, device=device, seed=seed + 1, scale=k**-0.5))
    return x, *quantize_rows_fp8(x), *weight.fp8_copy


def check_product(out: torch.Tensor, xq, x_scale, q, scale, bias) -> None:
    """``out`` against the float64 scaled product of the quantized operands (module docstring)."""
    x_rounded = xq.double() * x_scale.double()[:, None]
    w_rounded = q.double() * scale.double()[:, None]
    ref = x_rounded @ w_rounded.T + (0 if bias is None else bias.double())
    mag = x_rounded.abs() @ w_rounded.abs().T + (0 if bias is None else bias.double().abs())
    bound = torch.finfo(torch.bfloat16).eps * ref.abs() + (xq.shape[1] + 3) * 2.0**-24 * mag
    err = (out.double() - ref).abs()
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3g}, max error {err.max().item():.3g}"


def check(config: C, m: int, n: int, k: int, *, bias: bool = False, device: str = "cpu") -> None:
    x, xq, x_scale, q, scale = operands(m, n, k, device=device, seed=m + n)
    b = rand(n, dtype=torch.bfloat16, device=device, seed=3) if bias else None
    out = wk.w8a8_gemm(xq, x_scale, q, scale, b, config)
    assert out.shape == (m, n)
    check_product(out, xq, x_scale, q, scale, b)
    assert not wk._tickets(out.device).any(), "a tile's counter was left non-zero"
    assert torch.equal(wk.w8a8_gemm(xq, x_scale, q, scale, b, config), out)  # deterministic


# ============================================================================= interpreted
@pytest.mark.skipif(not wk.INTERPRETED, reason="triton was imported compiled")
@pytest.mark.parametrize("config", [C(16, 16, 32), C(16, 32, 32, split_k=2), C(32, 16, 64, split_k=3),
                                    C(16, 16, 32, split_k=8)],
                         ids=["one-split", "split2", "split3-uneven", "split8-past-k"])
@pytest.mark.parametrize("m,n,k,bias", [(17, 40, 160, False), (37, 48, 96, True)])
def test_kernel_matches_ref_interpreted(config, m, n, k, bias):
    """K = 160 in chunks of 32 (5) or 64 (3, the last half full); 8 splits of 96 (3 chunks) leave
    splits with nothing to sum, which still take their tickets."""
    check(config, m, n, k, bias=bias)


@pytest.mark.skipif(not wk.INTERPRETED, reason="triton was imported compiled")
def test_dispatch_takes_the_triton_gemm_interpreted():
    """Where the table has a tiling, the W8A8 product is the quantization and this kernel (here on
    CPU tensors): equal to launching them by hand."""
    m, n, k = 40, 96, 64
    config = gemv._w8a8_config(gemv._bucket(m), n, k)
    assert config is not None
    x = rand(m, k, dtype=torch.bfloat16, seed=1)
    q, scale = gemv.attach_fp8_copy_(rand(n, k, dtype=torch.bfloat16, seed=2, scale=0.125)).fp8_copy
    out = gemv._w8a8_product(x, q, scale, None)
    xq, x_scale = quantize_rows_fp8(x)
    assert torch.equal(out, wk.w8a8_gemm(xq, x_scale, q, scale, None, config))
    check_product(out, xq, x_scale, q, scale, None)


# ============================================================================= GPU
DRAFT_SHAPES = {"qkv": (6144, 8192), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                "lm_head": (32000, 4096), "fc": (4096, 12288)}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(DRAFT_SHAPES))
@pytest.mark.parametrize("m", [17, 64, 128, 200, 256])
def test_gpu_table_tiling_matches_ref(shape, m):
    """The dispatch table's tiling (where it has one) at the head's shapes."""
    n, k = DRAFT_SHAPES[shape]
    config = gemv._w8a8_config(gemv._bucket(m), n, k)
    if config is None:
        pytest.skip("torch._scaled_mm's shape")
    check(config, m, n, k, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("block_m,block_n,num_warps", [(64, 128, 4), (128, 128, 8), (128, 256, 8)])
def test_gpu_every_split_matches_ref(split_k, block_m, block_n, num_warps):
    """down's shape (K = 14336: 112 chunks, 3 splits uneven) at 150 tokens, with a bias."""
    check(C(block_m, block_n, 128, split_k, num_warps, 3), 150, 4096, 14336, bias=True, device="cuda")


@pytest.mark.gpu
def test_gpu_graph_replays_equal_eager():
    """Three launches (two split-K tilings and one unsplit) captured in one CUDA graph with PDL,
    replayed twice on new inputs: equal to eager launches bit for bit, the tickets zero after."""
    m, n, k = 128, 4096, 14336
    x, xq, x_scale, q, scale = operands(m, n, k, device="cuda")
    configs = [C(128, 128, 128, 4, 8, 3), C(64, 64, 128, 8), C(64, 256, 128, 1, 4, 3)]

    def run() -> list[torch.Tensor]:
        return [wk.w8a8_gemm(xq, x_scale, q, scale, None, c) for c in configs]

    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    for seed in (5, 6):
        fresh = rand(m, k, dtype=torch.bfloat16, device="cuda", seed=seed)
        new_q, new_scale = quantize_rows_fp8(fresh)
        xq.copy_(new_q)
        x_scale.copy_(new_scale)
        graph.replay()
        eager = run()
        for a, b in zip(outs, eager):
            assert torch.equal(a, b)
        assert not wk._tickets(xq.device).any()
