"""``store_kv``: write new tokens' K and V into one layer's cache slots with one kernel.

Two ``index_put`` kernels a layer become one: program ``i`` copies token ``i``'s K row and V row
(``num_kv_heads * head_dim`` values each, contiguous within the row) to slot ``loc[i]``. The
sources may be strided views (K and V are column ranges of the fused q/k/v projection's output).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.attention.triton_kernels.common import check_device
from specdec.kernels.common import check_tensor


@triton.jit
def _store_kv_kernel(
    K_cache, V_cache, loc, K, V,
    stride_cache, stride_k, stride_v,
    ROW: tl.constexpr, BLOCK: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc + i).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < ROW
    k = tl.load(K + i * stride_k + offs, mask=valid)
    v = tl.load(V + i * stride_v + offs, mask=valid)
    tl.store(K_cache + slot * stride_cache + offs, k, mask=valid)
    tl.store(V_cache + slot * stride_cache + offs, v, mask=valid)


def _rows(name: str, x: torch.Tensor, n: int, row: int) -> torch.Tensor:
    """``x`` as [n, row] with unit stride inside a row (a view when x has one, else a copy)."""
    if x.numel() != n * row:
        raise ValueError(f"{name}: expected {n} tokens of {row} values, got shape {tuple(x.shape)}")
    flat = x.reshape(n, row)
    return flat if flat.stride(1) == 1 else flat.contiguous()


def store_kv(
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim] (written)
    v_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim] (written)
    loc: torch.Tensor,  # [n] int slots
    k: torch.Tensor,  # [n, num_kv_heads, head_dim] or [n, num_kv_heads * head_dim]
    v: torch.Tensor,  # like k
) -> None:
    """k_cache[loc] = k and v_cache[loc] = v (cast to the cache dtype)."""
    device = k_cache.device
    check_device(device)
    check_tensor("k_cache", k_cache, dim=3, device=device)
    check_tensor("v_cache", v_cache, dtype=k_cache.dtype, shape=k_cache.shape, device=device)
    if not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError("k_cache / v_cache: expected contiguous [num_slots, num_kv_heads, head_dim]")
    check_tensor("loc", loc, dim=1, device=device)
    n, row = loc.shape[0], k_cache.shape[1] * k_cache.shape[2]
    if n == 0:
        return
    # NOTE: a cast, when needed, is torch's (round to nearest even; the interpreter's truncates)
    k2, v2 = (_rows(name, x.to(k_cache.dtype), n, row) for name, x in (("k", k), ("v", v)))
    _store_kv_kernel[(n,)](
        k_cache, v_cache, loc, k2, v2,
        k_cache.stride(0), k2.stride(0), v2.stride(0),
        ROW=row, BLOCK=triton.next_power_of_2(row),
    )


def store_kv_ref(k_cache, v_cache, loc, k, v) -> None:
    """Specification of ``store_kv``: two indexed writes."""
    n = loc.shape[0]
    k_cache[loc.long()] = k.reshape(n, *k_cache.shape[1:]).to(k_cache.dtype)
    v_cache[loc.long()] = v.reshape(n, *v_cache.shape[1:]).to(v_cache.dtype)
