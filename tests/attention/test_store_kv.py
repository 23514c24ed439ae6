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
