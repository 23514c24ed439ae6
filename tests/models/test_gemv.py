"""The skinny GEMM of ``specdec.models.ops.gemv`` and programmatic dependent launch (``ops.launch``).

1. The kernel against ``F.linear`` on awkward shapes (tokens 1, 3, 17; N and K not multiples of the
   blocks; bias or not; both inner products), CPU through Triton's interpreter, small; marked
   ``gpu``: compiled, at the Llama-3.1-8B and EAGLE-3 head shapes with the table's configs.
2. Dispatch: which calls take the kernel and which ``F.linear``.
3. GPU: CUDA-graph replay == eager, PDL on == PDL off bit for bit (model ops and GEMMs in one
   graph); an 8B-shaped model with the new path == the old path within bf16 rounding.

Tolerance, per output element, against the float64 product of the same (rounded) inputs:

    |out - ref| <= eps * |ref|  +  K * 2^-24 * (|x| @ |W|^T)

eps = the dtype's machine epsilon: one rounding of the output (round-to-nearest is half of that;
the interpreter rounds toward zero, a whole ulp); the second term bounds fp32 accumulation over K
in any order. A wrong index or an unwritten output is off by O(|ref|), far outside.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from ..triton_env import import_kernels, rand

gk = import_kernels("specdec.models.ops.gemv_kernels")

from specdec.models import ops  # noqa: E402
from specdec.models.ops import gemv, launch  # noqa: E402

_INTERPRETED = gk.INTERPRETED
C = gk.GemvConfig


pytestmark = pytest.mark.usefixtures("triton_interpreter")


def check_gemm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``out`` against float64 ``x @ weight^T + bias`` within the module docstring's bound."""
    assert out.dtype == x.dtype and out.shape == (x.shape[0], weight.shape[0])
    ref = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    mag = F.linear(x.double().abs(), weight.double().abs()) + (0 if bias is None else bias.double().abs())
    bound = torch.finfo(x.dtype).eps * ref.abs() + x.shape[1] * 2.0**-24 * mag
    err = (out.double() - ref).abs()
    assert torch.isfinite(out).all()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3g}, max error {err.max().item():.3g}"


# ============================================================================= kernel vs reference
@pytest.mark.skipif(not _INTERPRETED, reason="triton was imported compiled")
@pytest.mark.parametrize("config", [C(8, 32, prefetch=True), C(4, 64), C(16, 32, 4, 2, True),
                                    C(16, 32, 4, 2, True, swap_ab=True)],
                         ids=["ew8x32-prefetch", "ew4x64", "dot16x32", "swap16x32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("m,n,k", [(1, 24, 64), (3, 37, 72), (17, 20, 40), (45, 20, 40)])
def test_kernel_matches_ref_interpreted(config, dtype, m, n, k):
    x = rand(m, k, dtype=dtype, seed=m + k, scale=2.0)
    x[0] *= 8.0  # rows of very different scales
    weight = rand(n, k, dtype=dtype, seed=n, scale=k**-0.5)
    bias = rand(n, dtype=dtype, seed=n + 1) if m != 3 else None
    check_gemm(gk.gemv(x, weight, bias, config), x, weight, bias)


@pytest.mark.skipif(not _INTERPRETED, reason="triton was imported compiled")
@pytest.mark.parametrize("config", [C(8, 32, prefetch=True), C(16, 32, 4, 2, True),
                                    C(16, 32, 4, 2, True, swap_ab=True)],
                         ids=["ew8x32-prefetch", "dot16x32", "swap16x32"])
def test_fp32_out_is_the_rounded_result_widened_interpreted(config):
    """out_dtype=float32 (logits): bit for bit the 16-bit result, widened: F.linear(...).float()."""
    x = rand(5, 72, dtype=torch.bfloat16, seed=4, scale=2.0)
    weight = rand(37, 72, dtype=torch.bfloat16, seed=5, scale=0.3)
    wide = gk.gemv(x, weight, None, config, out_dtype=torch.float32)
    assert wide.dtype == torch.float32 and torch.equal(wide, gk.gemv(x, weight, None, config).float())


@pytest.mark.skipif(not _INTERPRETED, reason="triton was imported compiled")
@pytest.mark.parametrize("config", [C(16, 32, 4, 2, True), C(16, 32, 4, 2, True, swap_ab=True)],
                         ids=["dot16x32", "swap16x32"])
def test_fp32_out_unrounded_holds_the_sums_interpreted(config):
    """round_out=False (deterministic inference's logits): the fp32 sums themselves, which the
    rounded result is one bf16 rounding of."""
    x = rand(5, 72, dtype=torch.bfloat16, seed=4, scale=2.0)
    weight = rand(37, 72, dtype=torch.bfloat16, seed=5, scale=0.3)
    sums = gk.gemv(x, weight, None, config, out_dtype=torch.float32, round_out=False)
    rounded = gk.gemv(x, weight, None, config)
    assert sums.dtype == torch.float32 and not torch.equal(sums, rounded.float())
    # NOTE: one rounding apart (the interpreter truncates: up to a whole ulp)
    assert ((rounded.float() - sums).abs() <= torch.finfo(torch.bfloat16).eps * sums.abs()).all()
    torch.testing.assert_close(sums, F.linear(x.double(), weight.double()).float(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not _INTERPRETED, reason="triton was imported compiled")
def test_strided_rows_interpreted():
    """x as a column slice of a wider tensor (q/k/v slices, attention output views)."""
    wide = rand(5, 100, dtype=torch.bfloat16, seed=1)
    weight = rand(12, 48, dtype=torch.bfloat16, seed=2, scale=0.15)
    config = C(8, 32, prefetch=True)
    check_gemm(gk.gemv(wide[:, 8:56], weight, None, config), wide[:, 8:56].contiguous(), weight, None)


@pytest.mark.skipif(not _INTERPRETED, reason="triton was imported compiled")
@pytest.mark.parametrize("config", [C(8, 32, prefetch=True), C(4, 64), C(16, 32, 4, 2, True), C(16, 64, 4, 3, True),
                                    C(16, 64, 4, 3, True, swap_ab=True)],
                         ids=["ew8x32-prefetch", "ew4x64", "dot16x32", "dot16x64-3stages", "swap16x64"])
@pytest.mark.parametrize("m,n,k", [(1, 24, 64), (3, 37, 72), (17, 20, 40)])
def test_fp8_weight_matches_ref_interpreted(config, m, n, k):
    """An FP8 copy (e4m3 + a scale per row): the kernel computes x @ (scale * W_fp8)^T (+ bias)."""
    x = rand(m, k, dtype=torch.bfloat16, seed=m + k, scale=2.0)
    weight = gemv.attach_fp8_copy_(rand(n, k, dtype=torch.bfloat16, seed=n, scale=k**-0.5))
    q, scale = weight.fp8_copy
    bias = rand(n, dtype=torch.bfloat16, seed=n + 1) if m != 3 else None
    check_gemm(gk.gemv(x, q, bias, config, scale=scale), x, q.double() * scale.double()[:, None], bias)


@pytest.mark.skipif(not _INTERPRETED, reason="triton was imported compiled")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_quantize_rows_fp8_matches_ref_interpreted(dtype):
    """Per-token FP8 activations (W8A8): the kernel's scales and e4m3 values bit for bit the
    reference's, on rows of very different scales, a zero row, an outlier and a strided view."""
    wide = rand(19, 300, dtype=dtype, seed=7, scale=3.0)
    wide[1] *= 1e-3
    wide[2] = 0.0
    wide[3, 5] = 2e3  # one outlier sets its row's scale
    x = wide[:, 20:276]  # rows of a wider tensor
    q, scale = gk.quantize_rows_fp8(x)
    q_ref, scale_ref = gemv.quantize_rows_fp8_ref(x)
    assert q.dtype == gemv.FP8 and q.shape == x.shape and scale.shape == (19,)
    assert torch.equal(scale, scale_ref) and torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(q.float()[[0, 1, 3]].abs().amax(dim=1), torch.full((3,), gemv.FP8_MAX))  # each row's max at 448
    assert not q.float()[2].any()


def test_w8a8_ref_is_the_product_of_the_quantized_operands():
    """``linear_w8a8_ref``: x and W each rounded to e4m3 with one scale per row, multiplied exactly
    (within check_gemm's bound), and near the unquantized product (each rounding moves a value by
    at most 1/16 of itself)."""
    x = rand(24, 64, dtype=torch.bfloat16, seed=1, scale=2.0)
    x[0] *= 50.0
    weight = gemv.attach_fp8_copy_(rand(40, 64, dtype=torch.bfloat16, seed=2, scale=0.125))
    q, scale = weight.fp8_copy
    bias = rand(40, dtype=torch.bfloat16, seed=3)
    out = gemv.linear_w8a8_ref(x, q, scale, bias)
    xq, x_scale = gemv.quantize_rows_fp8_ref(x)
    x_rounded = xq.double() * x_scale.double()[:, None]
    assert ((x_rounded - x.double()).abs() <= x.double().abs() / 16).all()
    w_rounded = q.double() * scale.double()[:, None]
    ref = F.linear(x_rounded, w_rounded, bias.double())
    mag = F.linear(x_rounded.abs(), w_rounded.abs()) + bias.double().abs()
    bound = torch.finfo(torch.bfloat16).eps * ref.abs() + (64 + 3) * 2.0**-24 * mag  # fp32 sums and the two scalings
    assert out.dtype == torch.bfloat16 and ((out.double() - ref).abs() <= bound).all()
    exact = F.linear(x.double(), weight.double(), bias.double())
    assert (out.double() - exact).norm() <= 0.05 * exact.norm()


# ============================================================================= dispatch
@pytest.fixture
def kernel_on_cpu(monkeypatch):
    """Let the dispatch take the kernel for CPU tensors; records each launch's config (and, for
    speed, stands in for the launch with F.linear: the kernel itself is tested above)."""
    if not _INTERPRETED:
        pytest.skip("needs the interpreter")
    monkeypatch.setattr(gemv, "_applies", lambda device: True)
    calls = []
    monkeypatch.setattr(gk, "gemv", lambda x, w, b, config, out_dtype=None: calls.append(config)
                        or F.linear(x, w, b).to(out_dtype or x.dtype))
    return calls


@pytest.mark.parametrize("n", [16, 28672, 40000], ids=["small", "gate_up", "lm_head"])
@pytest.mark.parametrize("m", [1, 2, 5, 8, 16, 20, 32])
def test_dispatch_takes_the_kernel(kernel_on_cpu, m, n):
    """Every shape at 1..MAX_TOKENS tokens (inside a step the kernel's PDL overlap beats cuBLAS)."""
    dt = torch.bfloat16
    x, b = rand(m, 64, dtype=dt, seed=m), rand(n, dtype=dt, seed=2)
    w = rand(n, 64, dtype=dt, seed=3, scale=0.125)
    gemv.linear(x, w, b)
    assert kernel_on_cpu == [gemv._config(gemv._bucket(m), n, 64)] and kernel_on_cpu[0] is not None
    assert kernel_on_cpu[0].use_dot
    with pytest.raises(ValueError, match="bias"):
        gemv.linear(x, w, b[:-1])
    logits = gemv.linear(x, w, b, out_dtype=torch.float32)  # the lm_head's logits: the same kernel
    assert logits.dtype == torch.float32 and len(kernel_on_cpu) == 2 and kernel_on_cpu[1] == kernel_on_cpu[0]


@pytest.mark.parametrize("n", [16, 4096, 14336, 28672, 40000, 128256])
def test_one_tiling_from_1_to_8_tokens(n):
    """A decode step (1 token a request) and a verify of up to 8 rows take the same tiling, of 16
    token rows whatever M: a token's row then does the same arithmetic in both (next test)."""
    configs = {gemv._config(gemv._bucket(m), n, 4096) for m in range(1, 9)}
    assert len(configs) == 1 and next(iter(configs)).block_m_for(1) == next(iter(configs)).block_m_for(8) == 16


@pytest.mark.skipif(not _INTERPRETED, reason="triton was imported compiled")
@pytest.mark.parametrize("table_n", [40, 14336], ids=["32x256", "32x512"])
def test_a_tokens_row_is_the_same_bits_at_1_and_8_tokens(table_n):
    """Decode's M = 1 and a verify's M = 8 under each of the table's tilings for 1-8 tokens (that
    of a ``table_n``-row weight, on a 40-row one): row 0 equal bit for bit."""
    x = rand(8, 1024, dtype=torch.bfloat16, seed=1, scale=2.0)
    weight = rand(40, 1024, dtype=torch.bfloat16, seed=2, scale=0.125)
    config = gemv._config(1, table_n, 1024)
    assert config == gemv._config(8, table_n, 1024)
    one, eight = gk.gemv(x[:1], weight, None, config), gk.gemv(x, weight, None, config)
    assert torch.equal(one[0], eight[0])


def test_cublas_without_workspace_unless_the_user_set_one(monkeypatch):
    """The engine's cuBLAS setting: no workspace (no split-K) by default; a CUBLAS_WORKSPACE_CONFIG
    the user set stays, and the answer says whether cuBLAS then runs without a workspace."""
    for name in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE"):
        monkeypatch.setenv(name, "")  # NOTE: records the variable, so that teardown restores it
        monkeypatch.delenv(name)
    assert gemv.cublas_without_workspace() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":0:0"
    assert os.environ["CUBLASLT_WORKSPACE_SIZE"] == "0"  # PyTorch's cuBLASLt share of it: none either
    assert gemv.cublas_without_workspace()  # again: kept
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert not gemv.cublas_without_workspace() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


@pytest.mark.parametrize("m", [33, 48, 64])
def test_dispatch_wide_weights_to_64_tokens(kernel_on_cpu, m):
    """33..WIDE_MAX_TOKENS tokens: swap-AB tiles of 64 tokens for weights of N >= WIDE_N rows;
    narrower weights and more tokens go to F.linear."""
    dt = torch.bfloat16
    x = rand(m, 64, dtype=dt, seed=m)
    for n in (gemv.WIDE_N, 28672):
        gemv.linear(x, rand(n, 64, dtype=dt, seed=n, scale=0.125))
    assert kernel_on_cpu == [gemv._config(64, gemv.WIDE_N, 64), gemv._config(64, 28672, 64)]
    assert all(c.swap_ab and c.block_m_for(m) == 64 for c in kernel_on_cpu)
    narrow = rand(gemv.WIDE_N - 8, 64, dtype=dt, seed=1)
    assert torch.equal(gemv.linear(x, narrow), F.linear(x, narrow))
    wide = rand(gemv.WIDE_N, 64, dtype=dt, seed=2)
    many = rand(gemv.WIDE_MAX_TOKENS + 1, 64, dtype=dt, seed=3)
    assert torch.equal(gemv.linear(many, wide), F.linear(many, wide))
    assert len(kernel_on_cpu) == 2


def test_dispatch_falls_back_to_f_linear(kernel_on_cpu):
    """fp32, too many tokens, autograd, cublas_only(), K not a multiple of 8: no kernel."""
    dt = torch.bfloat16
    w = rand(16, 64, dtype=dt, seed=1)
    cases = [
        (rand(2, 64, seed=2), w.float()),
        (rand(gemv.MAX_TOKENS + 1, 64, dtype=dt, seed=3), w),
        (rand(2, 64, dtype=dt, seed=4).requires_grad_(), w),
        (rand(2, 60, dtype=dt, seed=5), w[:, :60].contiguous()),
    ]
    for x, weight in cases:
        assert torch.equal(gemv.linear(x, weight), F.linear(x, weight))
    with gemv.cublas_only():
        x = rand(2, 64, dtype=dt, seed=6)
        assert torch.equal(gemv.linear(x, w), F.linear(x, w))
    assert kernel_on_cpu == []


def test_dispatch_reads_the_fp8_copy(monkeypatch):
    """A weight with an FP8 copy: up to FP8_MAX_TOKENS tokens the kernel gets the copy and its
    scales where the table applies (on CPU the W8A16 reference); past it W8A8 (on CPU its
    reference; fp32 logits are its result widened); autograd differentiates the 16-bit weight."""
    dt = torch.bfloat16
    w = gemv.attach_fp8_copy_(rand(48, 64, dtype=dt, seed=1, scale=0.125))
    q, scale = w.fp8_copy
    x = rand(5, 64, dtype=dt, seed=2)
    many = rand(gemv.FP8_MAX_TOKENS + 1, 64, dtype=dt, seed=3)
    assert torch.equal(gemv.linear(x, w), gemv.linear_fp8_ref(x, q, scale))  # CPU
    assert torch.equal(gemv.linear(many, w), gemv.linear_w8a8_ref(many, q, scale))
    wide = gemv.attach_fp8_copy_(rand(gemv.WIDE_N, 64, dtype=dt, seed=5, scale=0.125))
    assert torch.equal(gemv.linear(many, wide), gemv.linear_w8a8_ref(many, *wide.fp8_copy))
    assert torch.equal(gemv.linear(many, wide, out_dtype=torch.float32), gemv.linear(many, wide).float())
    if not _INTERPRETED:
        return
    monkeypatch.setattr(gemv, "_applies", lambda device: True)
    launches = []
    monkeypatch.setattr(gk, "gemv", lambda x, w, b, config, scale=None, out_dtype=None:
                        launches.append((w, scale, config)) or x)
    gemv.linear(x, w)
    assert len(launches) == 1 and launches[0][0] is q and launches[0][1] is scale
    assert launches[0][2] == gemv._fp8_config(8, 48, 64)  # the FP8 table: 5 tokens -> bucket 8
    assert torch.equal(gemv.linear(many, wide), gemv.linear_w8a8_ref(many, *wide.fp8_copy))  # W8A8 (CPU: its reference)
    assert len(launches) == 1
    trained = w.clone().requires_grad_()
    trained.fp8_copy = w.fp8_copy
    assert torch.equal(gemv.linear(x, trained), F.linear(x, trained))  # autograd: F.linear on the weight itself
    assert len(launches) == 1


def test_cpu_keeps_reference_numerics():
    x, w = rand(2, 64, dtype=torch.bfloat16), rand(16, 64, dtype=torch.bfloat16)
    assert gemv.plan(x, w, None) is None
    assert torch.equal(gemv.linear(x, w), F.linear(x, w))


def test_pdl_only_on_hopper_and_switchable():
    assert launch.pdl_kwargs(torch.device("cpu")) == {"PDL": False}
    with launch.programmatic_launch(False):
        assert launch.pdl_kwargs(torch.device("cpu")) == {"PDL": False}
    if torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
        hopper = torch.cuda.get_device_capability(dev)[0] >= 9
        assert launch.pdl_kwargs(dev)["PDL"] == hopper
        with launch.programmatic_launch(False):
            assert launch.pdl_kwargs(dev) == {"PDL": False}


def test_pdl_off_for_a_process_by_environment():
    """SPECDEC_PDL=0 switches PDL off at import (a process started with it, as tensor-parallel ranks
    inherit it); without it PDL is left to the GPU."""
    import subprocess
    import sys

    if os.environ.get(launch.PDL_ENV) != "0":  # this process: left to the GPU
        assert launch._forced is None
    code = "from specdec.models.ops import launch; print(launch._forced)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, launch.PDL_ENV: "0"}, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-500:]


# ============================================================================= GPU, real shapes
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096), "draft_qkv": (6144, 8192), "draft_lm_head": (32000, 4096)}
DRAFT_SHAPES = {**SHAPES, "draft_fc": (4096, 12288)}  # an EAGLE-3 head's GEMMs (FP8 copies)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 13, 16, 32, 40, 64])
def test_gpu_kernel_matches_ref_llama8b_shapes(shape, m):
    n, k = SHAPES[shape]
    dt = torch.bfloat16
    x = rand(m, k, dtype=dt, device="cuda", seed=m)
    weight = torch.randn(n, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).mul_(k**-0.5).to(dt)
    bias = rand(n, dtype=dt, device="cuda", seed=3) if m == 3 else None
    config = gemv._config(gemv._bucket(m), n, k) or C(32, 256, 4, 4, True)
    out = torch.full((m, n), float("nan"), dtype=dt, device="cuda")
    out.copy_(gk.gemv(x, weight, bias, config))
    check_gemm(out, x, weight, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32, 64, 65])
def test_gpu_fp32_logits_equal_the_widened_result(m):
    """linear(..., out_dtype=float32) at the lm_head: the kernel's store widens exactly what
    F.linear's path would round to (past 64 tokens it is F.linear(...).float() itself)."""
    n, k = SHAPES["lm_head"]
    x = rand(m, k, dtype=torch.bfloat16, device="cuda", seed=m)
    weight = torch.randn(n, k, device="cuda", generator=torch.Generator("cuda").manual_seed(1)).mul_(k**-0.5)
    weight = weight.to(torch.bfloat16)
    logits = gemv.linear(x, weight, out_dtype=torch.float32)
    assert logits.dtype == torch.float32 and torch.equal(logits, gemv.linear(x, weight).float())


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["qkv", "o", "gate_up", "down", "lm_head"])
def test_gpu_a_tokens_row_is_the_same_bits_at_every_m(shape, monkeypatch):
    """The default path (the Triton kernel up to its table's bound, cuBLAS past it, without a
    workspace as the engine runs it): rows 0-7 at each M equal the same rows one at a time (a decode
    step at bs 1) bit for bit. With cuBLAS's workspace, o at 33-48 rows and down at 33-288 split K and
    differ (benchmarks/results/2026-12-01-h200-linear-rows)."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    assert gemv.cublas_without_workspace()  # in this process, after earlier tests' cuBLAS calls
    n, k = SHAPES[shape]
    x = rand(512, k, dtype=torch.bfloat16, device="cuda", seed=5)
    weight = torch.randn(n, k, device="cuda", generator=torch.Generator("cuda").manual_seed(6)).mul_(k**-0.5)
    weight = weight.to(torch.bfloat16)
    one_at_a_time = torch.cat([gemv.linear(x[i:i + 1], weight) for i in range(8)])  # [8, N]
    for m in (2, 8, 16, 32, 33, 48, 64, 65, 128, 288, 512):
        rows = gemv.linear(x[:m], weight)[:8]
        differing = (rows != one_at_a_time[:rows.shape[0]]).any(dim=1).nonzero().flatten().tolist()
        assert not differing, f"{shape} at M = {m}: rows {differing} differ from M = 1"


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["qkv", "o", "gate_up", "down", "draft_qkv", "draft_lm_head", "draft_fc"])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 17, 32, 64, 256])
def test_gpu_fp8_weight_matches_ref(shape, m):
    """Up to FP8_MAX_TOKENS: W8A16 within check_gemm's bound. Past it W8A8 (the Triton GEMM or
    ``torch._scaled_mm``, by the table): the product of the reference's quantized operands within bf16 rounding
    and fp32 sums (each token's output within 4e-3 of it, relative: bf16 rounding alone gives up to
    1.7e-3, a one-ulp scale mismatch gave 1.5e-2, a wrong index or scale O(1)), fp32 logits that
    result widened."""
    n, k = DRAFT_SHAPES[shape]
    dt = torch.bfloat16
    x = rand(m, k, dtype=dt, device="cuda", seed=m)
    x[0] *= 30.0  # rows of very different scales
    weight = torch.randn(n, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).mul_(k**-0.5).to(dt)
    gemv.attach_fp8_copy_(weight)
    q, scale = weight.fp8_copy
    w_rounded = q.double() * scale.double()[:, None]
    out = torch.full((m, n), float("nan"), dtype=dt, device="cuda")
    out.copy_(gemv.linear(x, weight))
    if m <= gemv.FP8_MAX_TOKENS:
        check_gemm(out, x, w_rounded, None)
        return
    xq, x_scale = gemv.quantize_rows_fp8_ref(x)
    ref = F.linear(xq.double() * x_scale.double()[:, None], w_rounded)
    assert torch.isfinite(out).all()
    err = (out.double() - ref).norm(dim=1) / ref.norm(dim=1)  # per token
    assert err.max() < 4e-3, f"relative error {err.max().item():.3g}"
    assert torch.equal(gemv.linear(x, weight, out_dtype=torch.float32), out.float())


@pytest.mark.gpu
@pytest.mark.parametrize("k", [4096, 8192, 12288, 14336])
@pytest.mark.parametrize("m", [17, 64, 256])
@pytest.mark.parametrize("rows", ["normal", "outliers"])
def test_gpu_quantize_rows_fp8_is_exact(m, k, rows):
    """The W8A8 activations: the compiled kernel's e4m3 values and scales bit for bit the
    reference's; "outliers": a zero row, a row scaled by 1e3 and one whose outlier leaves the
    others in e4m3's subnormal range."""
    x = rand(m, k, dtype=torch.bfloat16, device="cuda", seed=m + k, scale=2.0)
    if rows == "outliers":
        x[0] *= 1e3
        x[1] = 0.0
        x[2, 7] = -5e4
    q, scale = gk.quantize_rows_fp8(x)
    q_ref, scale_ref = gemv.quantize_rows_fp8_ref(x)
    assert torch.equal(scale, scale_ref), f"scales differ in rows {(scale != scale_ref).nonzero().flatten().tolist()}"
    differ = (q.view(torch.uint8) != q_ref.view(torch.uint8)).nonzero()
    assert len(differ) == 0, (f"{len(differ)} values differ, e.g. x / scale = "
                              f"{[(x[i, j].float() / scale[i]).item() for i, j in differ[:4].tolist()]}: kernel "
                              f"{[q[i, j].float().item() for i, j in differ[:4].tolist()]}, reference "
                              f"{[q_ref[i, j].float().item() for i, j in differ[:4].tolist()]}")


@pytest.mark.gpu
def test_gpu_graph_replay_and_pdl_are_exact():
    """One layer's ops (norm, GEMMs, RoPE, SiLU) captured with PDL on and off, replayed on new
    inputs: bit-identical to each other and to eager launches."""
    dt, m = torch.bfloat16, 2
    x, res = rand(m, 4096, dtype=dt, device="cuda", seed=1), rand(m, 4096, dtype=dt, device="cuda", seed=2)
    nw = rand(4096, dtype=dt, device="cuda", seed=4)
    w_qkv = rand(6144, 4096, dtype=dt, device="cuda", seed=5, scale=1 / 64)
    w_gate_up = rand(28672, 4096, dtype=dt, device="cuda", seed=6, scale=1 / 64)
    w_down = rand(4096, 14336, dtype=dt, device="cuda", seed=7, scale=1 / 120)
    positions = torch.tensor([5, 1000], device="cuda")
    inv_freq = (1.0 / 500000.0 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))

    def step() -> list[torch.Tensor]:
        h, stream = ops.add_rms_norm(x, res, nw, 1e-5)
        qkv = gemv.linear(h, w_qkv)
        ops.apply_rope_(qkv[:, :4096], qkv[:, 4096:5120], positions, inv_freq)
        h2, stream2 = ops.add_rms_norm(qkv[:, :4096], stream, nw, 1e-5)
        out = gemv.linear(ops.silu_and_mul(gemv.linear(h2, w_gate_up)), w_down)
        return [qkv, stream2, out]

    graphs = []
    for pdl in (True, False):
        with launch.programmatic_launch(pdl):
            for _ in range(2):
                step()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = step()
            graphs.append((graph, outs))
    for i, buf in enumerate((x, res)):
        buf.copy_(rand(*buf.shape, dtype=dt, device="cuda", seed=10 + i))
    replayed = []
    for graph, outs in graphs:
        graph.replay()
        replayed.append([o.clone() for o in outs])
    eager = step()
    for a, b, c in zip(*replayed, eager):
        assert torch.equal(a, c) and torch.equal(b, c)


@pytest.mark.gpu
def test_gpu_model_new_path_equals_old_within_bf16():
    """Two 8B-shaped layers (32000-token vocab): prefill of 20 tokens, then 4 decode steps; logits
    with the Triton path vs ``cublas_only()`` differ like two bf16 GEMM summation orders do."""
    from specdec.models.llama import LlamaConfig, LlamaForCausalLM
    from ..builders import StandaloneRunner

    cfg = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                      num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if p.dim() == 1 else torch.randn_like(p) * p.shape[1] ** -0.5)
    ids = torch.randint(0, cfg.vocab_size, (24,), generator=torch.Generator().manual_seed(1)).tolist()

    def decode() -> list[torch.Tensor]:
        runner = StandaloneRunner(model, 64)
        outs = [runner.forward(ids[:20]).next_token_logits]
        return outs + [runner.forward([t]).next_token_logits for t in ids[20:]]

    with torch.inference_mode():
        new = decode()
        with gemv.cublas_only(), launch.programmatic_launch(False):
            old = decode()
    for a, b in zip(new, old):
        assert ((a - b).norm() / b.norm()).item() < 2e-2
    assert sum(int(a[-1].argmax() == b[-1].argmax()) for a, b in zip(new, old)) >= len(new) - 1
