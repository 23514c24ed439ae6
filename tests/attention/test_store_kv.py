"""store_kv: one kernel writes a layer's new K and V rows into their slots, as two indexed writes do."""

import pytest
import torch

from ..triton_env import import_kernels

kernels = import_kernels("specdec.attention.triton_kernels.store_kv")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _case(n, hkv, d, cache_dtype, src_dtype, seed, slots=50):
    gen = torch.Generator().manual_seed(seed)
    loc = torch.randperm(slots, generator=gen)[:n].to(DEVICE)
    # K and V as column ranges of one fused projection output, like the model hands them over
    fused = torch.randn(n, (4 + 2) * hkv * d, generator=gen).to(DEVICE, src_dtype)
    k, v = fused[:, 4 * hkv * d : 5 * hkv * d], fused[:, 5 * hkv * d :]
    caches = [torch.randn(slots, hkv, d, generator=gen).to(DEVICE, cache_dtype) for _ in range(2)]
    return loc, k, v, caches


@pytest.mark.parametrize("n, hkv, d", [(1, 2, 16), (7, 2, 24), (33, 3, 8)])
@pytest.mark.parametrize("cache_dtype, src_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                    (torch.bfloat16, torch.float32)], ids=str)
def test_store_kv_matches_reference(n, hkv, d, cache_dtype, src_dtype):
    loc, k, v, (kc, vc) = _case(n, hkv, d, cache_dtype, src_dtype, seed=n * d)
    kr, vr = kc.clone(), vc.clone()
    kernels.store_kv(kc, vc, loc, k, v)
    kernels.store_kv_ref(kr, vr, loc, k, v)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)


def test_store_kv_takes_3d_views_and_rejects_wrong_sizes():
    loc, k, v, (kc, vc) = _case(5, 2, 16, torch.float32, torch.float32, seed=1)
    kr, vr = kc.clone(), vc.clone()
    kernels.store_kv(kc, vc, loc, k.view(5, 2, 16), v.view(5, 2, 16))
    kernels.store_kv_ref(kr, vr, loc, k, v)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    with pytest.raises(ValueError, match="k: expected 5 tokens"):
        kernels.store_kv(kc, vc, loc, k[:4], v)
    kernels.store_kv(kc, vc, loc[:0], k[:0], v[:0])  # nothing to write
    assert torch.equal(kc, kr)


@pytest.mark.parametrize("n, hkv, d", [(1, 2, 16), (7, 2, 24), (33, 8, 128)])
@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_store_kv_into_fp8_saturates_and_rounds_like_the_reference(n, hkv, d, src_dtype):
    """Values from 1e-5 (subnormal in e4m3, or flushed to zero) to 1e4 (past 448: saturated), both
    signs: the stored bytes equal the reference's (``cast_kv``). On a GPU the kernel casts in
    registers, elsewhere torch casts first, so this pins the kernel's rounding to torch's."""
    loc, k, v, _ = _case(n, hkv, d, torch.float32, torch.float32, seed=n + d)
    gen = torch.Generator().manual_seed(d)
    scale = (10 ** (9 * torch.rand(n, hkv * d, generator=gen) - 5)).to(DEVICE)  # [n, hkv * d]
    k, v = (k * scale).to(src_dtype), (v * scale.flip(1)).to(src_dtype)
    kc, vc = (torch.randn(50, hkv, d, device=DEVICE).to(torch.float8_e4m3fn) for _ in range(2))
    kr, vr = kc.clone(), vc.clone()
    kernels.store_kv(kc, vc, loc, k, v)
    kernels.store_kv_ref(kr, vr, loc, k, v)
    assert torch.equal(kc.view(torch.uint8), kr.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), vr.view(torch.uint8))
    stored = kr[loc].float().abs()
    assert stored.max() == 448.0 and bool(((stored > 0) & (stored < 2**-6)).any())  # saturated and subnormal
