"""``store_kv``: write new tokens' K and V into one layer's cache slots with one kernel.

Two ``index_put`` kernels a layer become one: program ``i`` copies token ``i``'s K row and V row
(``num_kv_heads * head_dim`` values each, contiguous within the row) to slot ``loc[i]``. The
sources may be strided views (K and V are column ranges of the fused q/k/v projection's output).
Into an FP8 cache (``specdec.attention.kv_dtype``) on a GPU the kernel itself saturates and rounds
the rows as ``cast_kv`` does, so the cast costs no kernel of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.attention.kv_dtype import cast_kv, is_fp8
from specdec.attention.triton_kernels.common import check_device
from specdec.kernels.common import check_tensor


@triton.jit
def _store_kv_kernel(
    K_cache, V_cache, loc, K, V,
    stride_cache, stride_k, stride_v,
    ROW: tl.constexpr, BLOCK: tl.constexpr, SATURATE: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc + i).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    valid = offs < ROW
    k = tl.load(K + i * stride_k + offs, mask=valid)
    v = tl.load(V + i * stride_v + offs, mask=valid)
    if K_cache.dtype.element_ty.is_fp8() and not K.dtype.element_ty.is_fp8():
        k = tl.clamp(k.to(tl.float32), -SATURATE, SATURATE).to(K_cache.dtype.element_ty, fp_downcast_rounding="rtne")
        v = tl.clamp(v.to(tl.float32), -SATURATE, SATURATE).to(V_cache.dtype.element_ty, fp_downcast_rounding="rtne")
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
    """k_cache[loc] = k and v_cache[loc] = v (cast to the cache dtype: ``cast_kv``)."""
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
    # NOTE: a cast, when needed, is torch's (round to nearest even; the interpreter's truncates, and
    # flushes FP8 subnormals), except into an FP8 cache on a GPU, where the kernel rounds to nearest even
    in_kernel = is_fp8(k_cache.dtype) and device.type == "cuda"
    dtype = k.dtype if in_kernel else k_cache.dtype
    k2, v2 = (_rows(name, cast_kv(x, dtype), n, row) for name, x in (("k", k), ("v", v)))
    _store_kv_kernel[(n,)](
        k_cache, v_cache, loc, k2, v2,
        k_cache.stride(0), k2.stride(0), v2.stride(0),
        ROW=row, BLOCK=triton.next_power_of_2(row),
        SATURATE=torch.finfo(k_cache.dtype).max if is_fp8(k_cache.dtype) else 0.0,
    )


def store_kv_ref(k_cache, v_cache, loc, k, v) -> None:
    """Specification of ``store_kv``: two indexed writes."""
    n = loc.shape[0]
    k_cache[loc.long()] = cast_kv(k.reshape(n, *k_cache.shape[1:]), k_cache.dtype)
    v_cache[loc.long()] = cast_kv(v.reshape(n, *v_cache.shape[1:]), v_cache.dtype)
