"""``draft_decode_attention``: one draft step of a tree, every branch of a request in one program.

A draft step has ``topk`` branches per request. Branch j of request b is query row ``b * topk + j``;
it sees the request's cached prefix, ``req_to_token[req_pool_indices[b], :prefix_lens[b]]``, then
its own ancestors in the draft tree, ``ancestors[b * topk + j, :depth]`` (itself last), nothing
else. The prefix is the same for every branch, so a program takes the (branch, query head) rows of
all the request's branches that share its KV head and reads each prefix tile once for all of them;
run as sequences of their own (the decode kernel over a per-branch slot list), the branches read it
``topk`` times. The ancestors, at most ``num_steps - 1`` a branch and different per branch, are
then folded in one entry a row at a time. The prefix is read from the request-to-token table
itself: a draft step needs no slot list.

Grid ``(bs, num_kv_heads, m_blocks * num_splits)``. Split s covers its chunk of the request's own
prefix (``split_chunk``: each request spreads its prefix over every split, however short); the split
holding the prefix's last entry (split 0 for an empty prefix) folds the ancestors too.

Rows of an m-block, topk = 2, group = 4 (query heads 4k..4k+3 share KV head k), BLOCK_M = 16:
    (branch 0, head 4k) .. (branch 0, head 4k+3) (branch 1, head 4k) .. (branch 1, head 4k+3) -- x 8

Sliding windows (``window``, a local layer's): every branch of a step is at the same depth, so at the
same position, ``prefix_len + depth - 1`` (ancestor t at ``prefix_len + t``): all of a request's rows
see the same entries, the prefix from ``prefix_len + depth - window`` on and the ancestors from
``depth - window`` on, and need no mask. The splits cut the prefix's windowed range, and the plan is
sized by ``min(bound, window)`` (``window_span``). Prefix 6, depth 2, window 4: the rows are at
position 7 and see prefix entries 4 and 5 and both ancestors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.attention.triton_kernels.common import (
    attend_tile,
    LOG2E,
    dot_precision,
    query_tile,
    tile_dtype,
    extend_block_m,
    head_dim_block,
    is_streaming_grid,
    launch_config,
    plan_num_splits,
    split_chunk,
    store_rows,
    window_arg,
    window_span,
)
from specdec.attention.triton_kernels.decode import check_qkv
from specdec.attention.triton_kernels.merge import merge_partials, split_buffers
from specdec.kernels.common import check_tensor


@triton.jit(do_not_specialize=["window"])
def _draft_decode_kernel(
    Q, K, V, O, LSE, req_to_token, req_pool_indices, prefix_lens, ANCESTORS,
    sm_scale_log2, depth, num_splits, window,
    stride_qt, stride_qh,
    stride_ks, stride_kh, stride_vs, stride_vh,
    stride_ot, stride_oh, stride_osplit,
    stride_lt, stride_lh,
    stride_table, stride_anc,
    TOPK: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    m_block = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits
    table_row = tl.load(req_pool_indices + req).to(tl.int64)
    prefix_len = tl.load(prefix_lens + req).to(tl.int32)
    # the rows are at position prefix_len + depth - 1: they see positions from prefix_len + depth - window
    win_lo = tl.minimum(tl.maximum(prefix_len + depth - window, 0), prefix_len)
    span = prefix_len - win_lo
    chunk_len = tl.maximum(split_chunk(span, num_splits, BLOCK_N), BLOCK_N)

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    branch = offs_m // GROUP  # [BLOCK_M]
    head = kv_head * GROUP + offs_m % GROUP  # [BLOCK_M] query head
    row_valid = branch < TOPK
    d_valid = offs_d < HEAD_DIM
    q_mask = row_valid[:, None] & d_valid[None, :]
    token = (req * TOPK + branch).to(tl.int64)  # [BLOCK_M] packed query row (one per branch)
    q = tl.load(Q + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)
    q = query_tile(q, K)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # the shared prefix: every row sees every entry of this split's chunk of the window
    lo = win_lo + split * chunk_len
    hi = tl.minimum(lo + chunk_len, prefix_len)
    table = req_to_token + table_row * stride_table
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_valid = offs_n < hi
        slot = tl.load(table + offs_n, mask=n_valid, other=0).to(tl.int64)
        m_i, l_i, acc = attend_tile(q, K, V, slot, n_valid, n_valid[None, :], kv_head, stride_ks, stride_kh,
                                    stride_vs, stride_vh, offs_d, d_valid, sm_scale_log2, m_i, l_i, acc,
                                    DOT_PRECISION, False)

    # each row's own ancestors (those in the window), one entry at a time, in the split holding the
    # prefix's end
    if split == tl.maximum(span - 1, 0) // chunk_len:
        qf = q.to(tl.float32)
        kv_mask = row_valid[:, None] & d_valid[None, :]
        for t in range(tl.maximum(depth - window, 0), depth):
            slot = tl.load(ANCESTORS + token * stride_anc + t, mask=row_valid, other=0).to(tl.int64)  # [BLOCK_M]
            k = tl.load(K + slot[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
            s = tl.sum(qf * k.to(tl.float32), 1) * sm_scale_log2  # [BLOCK_M]
            s = tl.where(row_valid, s, float("-inf"))
            m_new = tl.maximum(m_i, s)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe)
            v = tl.load(V + slot[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
            l_i = l_i * alpha + p
            acc = acc * alpha[:, None] + p[:, None] * v.to(tl.float32)
            m_i = m_new

    o_ptrs = O + token[:, None] * stride_ot + head[:, None] * stride_oh + split * stride_osplit + offs_d[None, :]
    lse_ptrs = LSE + token * stride_lt + head * stride_lh + split
    store_rows(acc, m_i, l_i, o_ptrs, lse_ptrs, q_mask, row_valid, DIRECT)


def draft_decode_attention(
    q: torch.Tensor,  # [bs * topk, num_heads, head_dim]: branch j of request b is row b * topk + j
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,  # [max_requests, max_context] int KV slot of each (table row, position)
    req_pool_indices: torch.Tensor,  # [bs] int table row of each request
    prefix_lens: torch.Tensor,  # [bs] int cached tokens of each request
    ancestors: torch.Tensor,  # [bs * topk, depth] int KV slots of each branch's ancestors, itself last
    out: torch.Tensor,  # [bs * topk, num_heads, head_dim] (written)
    *,
    sm_scale: float,
    max_prefix_len: int,
    num_splits: int | None = None,
    window: int | None = None,
) -> None:
    """Attention of each draft branch over its request's prefix and its own ancestors, with a sliding
    ``window`` over those at positions > its own - window (the branch at ``prefix + depth - 1``).

    ``max_prefix_len`` (a host int, no sync: the longest prefix, or a CUDA graph's bound) sizes the
    split plan; ``num_splits`` forces a split count. ``ancestors`` may be a column slice (any row
    stride, unit column stride).
    """
    bs = req_pool_indices.shape[0]
    num_rows, hq, d = q.shape
    check_qkv(q, k_buffer, v_buffer, out)
    check_tensor("req_pool_indices", req_pool_indices, dim=1, device=q.device)
    check_tensor("prefix_lens", prefix_lens, shape=(bs,), device=q.device)
    for name, t in (("req_to_token", req_to_token), ("ancestors", ancestors)):  # column slices are fine
        if t.dim() != 2 or t.device != q.device or t.is_floating_point() or (t.shape[1] > 1 and t.stride(1) != 1):
            raise ValueError(f"{name}: expected a 2-d integer tensor on {q.device} with unit column stride")
    if bs == 0 or num_rows == 0:
        return
    if num_rows % bs or ancestors.shape[0] != num_rows:
        raise ValueError(f"draft decode: {num_rows} query rows and {ancestors.shape[0]} ancestor rows are not "
                         f"topk each for {bs} requests")
    topk, hkv = num_rows // bs, k_buffer.shape[1]
    group = hq // hkv
    rows = topk * group  # (branch, query head) rows per KV head of a request
    tiles = tile_dtype(q.dtype, k_buffer.dtype)
    span = window_span(max_prefix_len, window)
    block_m = extend_block_m(q.device, rows=rows, num_seqs=bs, num_kv_heads=hkv, max_prefix_len=span)
    cfg = launch_config(q.device, block_m=block_m, head_dim=d, elem_size=tiles.itemsize)
    m_blocks = triton.cdiv(rows, block_m)
    splits, _ = plan_num_splits(bs * hkv * m_blocks, span, device=q.device, tile=cfg.block_n, num_splits=num_splits)
    # NOTE: as the verify's. Measured on an H100 with a copy of this kernel (8B head, context 1 k, bs 64,
    # 2 branches; 128 x 4 warps -> 64 x 2 warps): 103.4 -> 97.7 µs over a bf16 cache, 66.6 -> 61.5 over FP8
    if is_streaming_grid(q.device, bs * hkv * m_blocks, splits, block_m=block_m):
        cfg = launch_config(q.device, block_m=block_m, head_dim=d, elem_size=tiles.itemsize, streaming=True)
    direct = splits == 1
    partial, lse = split_buffers(out, splits)
    _draft_decode_kernel[(bs, hkv, m_blocks * splits)](
        q, k_buffer, v_buffer, partial, lse, req_to_token, req_pool_indices, prefix_lens, ancestors,
        sm_scale * LOG2E, ancestors.shape[1], splits, window_arg(window),
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1),
        req_to_token.stride(0), ancestors.stride(0),
        TOPK=topk, GROUP=group, HEAD_DIM=d, BLOCK_D=head_dim_block(d), BLOCK_M=block_m, BLOCK_N=cfg.block_n,
        DIRECT=direct, DOT_PRECISION=dot_precision(tiles, q.device),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if not direct:
        merge_partials(partial, lse, out)


def draft_decode_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    ancestors: torch.Tensor,
    out: torch.Tensor,
    *,
    sm_scale: float,
    max_prefix_len: int,
    num_splits: int | None = None,
    window: int | None = None,
) -> None:
    """Specification of ``draft_decode_attention``, one branch at a time in fp32: softmax(q k^T *
    sm_scale) v over the request's prefix slots followed by the branch's ancestor slots (entry e of
    that list at position e), with a ``window`` only the last ``window`` of them (the branch is the
    last). The plan arguments do not change the result."""
    bs = req_pool_indices.shape[0]
    topk = q.shape[0] // bs
    group = q.shape[1] // k_buffer.shape[1]
    for row in range(q.shape[0]):
        b = row // topk
        prefix = req_to_token[int(req_pool_indices[b]), : int(prefix_lens[b])].long()
        slots = torch.cat([prefix, ancestors[row].long()])
        if window is not None:
            slots = slots[max(0, slots.shape[0] - window) :]
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [kv, num_heads, d]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,khd->hk", q[row].float(), k) * sm_scale
        out[row] = torch.einsum("hk,khd->hd", torch.softmax(scores, dim=-1), v).to(out.dtype)
