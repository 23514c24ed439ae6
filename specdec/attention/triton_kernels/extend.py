"""``extend_attention``: several query rows per sequence over its listed KV slots.

A sequence with q query rows and kv entries has a prefix of ``p = kv - q`` entries that every row
sees (cached tokens), then the q new tokens' own entries, visible causally (row i sees new entries
0..i) or per an explicit mask (TARGET_VERIFY trees). The two parts run as two loops of one
program: the prefix loop needs no mask at all, and only the prefix is split across programs
(split-KV) when the grid alone would leave SMs idle. The host plans the split count from a bound
on the prefixes (the longest, or the captured bound under CUDA graphs); each sequence cuts its own
prefix into that many chunks of whole tiles (``split_chunk``), so a short prefix under a long bound
still spreads over every split. A prefix of one chunk's length or less is one pass over its entries
(the new block right after the prefix). A longer prefix's new block runs after its last chunk, or,
at small batch (``plan_extend_splits``), in a split of its own (``NEW_SPLIT``, the last one), off
the prefix chunks' critical path.

A plan that follows the batch gives a row other bits in another batch. The target's prefill of a fresh
prompt, or of a long chunk over a cached prefix (``triton_backend``), takes ``one_plan`` instead: the
largest query tile, one split, the new tokens in the prefix's tile width, whatever else the batch holds,
so a prompt's rows (over the same cached prefix) get the same bits alone or beside any others (``skip``:
sequences whose rows another kernel computes).

Grid ``(num_seqs, num_kv_heads, m_blocks * num_splits)``. The tile's rows are (query row, query
head) pairs of one KV head, row-major by query row, so each K/V tile is read once per KV head:

    group = 2 (query heads 2k, 2k+1 share KV head k), q = 3, BLOCK_M = 4
    m_block 0 rows: (row 0, head 2k) (row 0, head 2k+1) (row 1, head 2k) (row 1, head 2k+1)
    m_block 1 rows: (row 2, head 2k) (row 2, head 2k+1) -- --

Mask form (``HAS_MASK``): the new tokens' own ``[q, q]`` block per sequence, row-major, starting
at ``mask_indptr[s]`` (TARGET_VERIFY's QLEN_ONLY tree mask as it is); the prefix is visible to
every row (without a window), so it needs no mask.

Sliding windows (``WINDOWED``, a local layer's ``window``): a row sees an entry only if the entry's
position is > the row's - window. With a prefix of P entries, prefix entry e is at position e; a
causal row i and new entry j at P + i and P + j; under a mask (a tree) node i, row and new entry
alike, at ``positions[i]`` (P plus its depth). An m-block's rows see no entry before their least
position - window + 1 (``win_lo``), so the range its splits cut is ``[win_lo, P)`` (``window_span``:
a local layer's prefix splits are sized by its window) and a causal block's new-token loop starts
there too; the tiles left are masked per row. Example, window 3, P = 4, causal rows 0..2, one m-block:
    entries:  p0 p1 p2 p3 n0 n1 n2      (positions 0..6; rows at 4, 5, 6)
    row 0:     .  .  1  1  1  .  .      win_lo = 4 - 3 + 1 = 2: p0 and p1 are not read
    row 1:     .  .  .  1  1  1  .
    row 2:     .  .  .  .  1  1  1
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.attention.triton_kernels.common import (
    attend_tile,
    head_dim_block,
    is_streaming_grid,
    LOG2E,
    dot_precision,
    query_tile,
    tile_dtype,
    extend_block_m,
    launch_config,
    max_block_m,
    plan_extend_splits,
    split_chunk,
    store_rows,
    window_arg,
    window_span,
)
from specdec.attention.triton_kernels.decode import _check_inputs
from specdec.attention.triton_kernels.merge import merge_partials, split_buffers
from specdec.kernels.common import check_tensor


# new-token blocks of up to this many entries run in tiles of this width (tl.dot's least)
NARROW_NEW_BLOCK = 16


def new_block_n(max_q_len: int, block_n: int) -> int:
    """KV entries per tile of the new tokens' block: NARROW_NEW_BLOCK where that covers it, else the
    prefix's ``block_n``. Measured on an H100 (benchmarks/results/2026-11-26-h100-attention-tiles): a
    chain's 4 new entries in a 128-entry tile cost almost a ninth prefix tile at context 1 k (its
    verify at bs 64 109.1 -> 104.7 µs a layer; 5x4x8's verify at bs 64 17.32 -> 16.77 ms a step),
    while a 64-node tree lost in 64-entry tiles (6x8x64 at bs 1, ctx 1 k: verify 6.92 -> 7.12 ms)."""
    return min(block_n, NARROW_NEW_BLOCK) if max_q_len <= NARROW_NEW_BLOCK else block_n


@triton.jit
def _rows_window(POSITIONS, token, row, row_valid, prefix_len, kv_len, window, HAS_MASK: tl.constexpr):
    """(each row's position, the first entry any of them sees) of a windowed m-block's rows."""
    if HAS_MASK:  # a tree node sits at the prefix plus its depth: given
        q_pos = tl.load(POSITIONS + token, mask=row_valid, other=0).to(tl.int32)
    else:
        q_pos = prefix_len + row
    # (kv_len: past every row's position, so padding rows do not lower the minimum)
    return q_pos, tl.maximum(tl.min(tl.where(row_valid, q_pos, kv_len), 0) - window + 1, 0)


@triton.jit(do_not_specialize=["window"])
def _extend_kernel(
    Q, K, V, O, LSE, qo_indptr, kv_indptr, kv_indices, MASK, mask_indptr, POSITIONS, SKIP,
    sm_scale_log2, num_splits, window,
    stride_qt, stride_qh,
    stride_ks, stride_kh, stride_vs, stride_vh,
    stride_ot, stride_oh, stride_osplit,
    stride_lt, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_NEW: tl.constexpr,
    HAS_MASK: tl.constexpr, DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr, NEW_SPLIT: tl.constexpr,
    WINDOWED: tl.constexpr, HAS_SKIP: tl.constexpr,
):
    seq = tl.program_id(0)
    if HAS_SKIP:  # computed elsewhere (``extend_attention``'s ``skip``)
        if tl.load(SKIP + seq) != 0:
            return
    kv_head = tl.program_id(1)
    m_block = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits
    q_start = tl.load(qo_indptr + seq)
    q_len = tl.load(qo_indptr + seq + 1) - q_start
    if m_block * BLOCK_M >= q_len * GROUP:
        return
    kv_start = tl.load(kv_indptr + seq)
    kv_len = tl.load(kv_indptr + seq + 1) - kv_start

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row = offs_m // GROUP  # [BLOCK_M] query row within the sequence
    head = kv_head * GROUP + offs_m % GROUP  # [BLOCK_M] query head
    row_valid = row < q_len
    d_valid = offs_d < HEAD_DIM
    q_mask = row_valid[:, None] & d_valid[None, :]
    token = (q_start + row).to(tl.int64)  # [BLOCK_M] packed query row
    q = tl.load(Q + token[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)
    q = query_tile(q, K)

    prefix_len = kv_len - q_len
    # the rows' positions and the first entry any of them sees (module docstring); a global layer's
    # rows see the whole prefix
    if WINDOWED:
        q_pos, win_lo = _rows_window(POSITIONS, token, row, row_valid, prefix_len, kv_len, window, HAS_MASK)
    else:
        win_lo = 0
    # this block's chunk of the prefix range it reads (at least a tile: the new block's split is found by it)
    span = tl.maximum(prefix_len - win_lo, 0)
    prefix_splits = num_splits - 1 if NEW_SPLIT else num_splits
    chunk_len = tl.maximum(split_chunk(span, prefix_splits, BLOCK_N), BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # prefix: every row sees every entry of this split's chunk (within its window)
    lo = win_lo + split * chunk_len
    hi = tl.minimum(lo + chunk_len, prefix_len)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_valid = offs_n < hi
        visible = n_valid[None, :]
        if WINDOWED:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        slot = tl.load(kv_indices + kv_start + offs_n, mask=n_valid, other=0).to(tl.int64)
        m_i, l_i, acc = attend_tile(q, K, V, slot, n_valid, visible, kv_head, stride_ks, stride_kh,
                                    stride_vs, stride_vh, offs_d, d_valid, sm_scale_log2, m_i, l_i, acc,
                                    DOT_PRECISION, False)

    # new tokens: causal or masked. A prefix range of one chunk: the split holding it runs them right
    # after it (one pass). A longer one: with NEW_SPLIT the last split runs them alone (its chunk lies
    # past every prefix, so the loop above ran no tile), else the split holding the prefix's end.
    if NEW_SPLIT and span > chunk_len:
        runs_new = split == num_splits - 1
    else:
        runs_new = split == tl.maximum(span - 1, 0) // chunk_len
    if runs_new:
        new_lo = prefix_len
        if HAS_MASK:
            hi = kv_len
            mask_start = tl.load(mask_indptr + seq)
        else:
            last_row = tl.minimum((m_block * BLOCK_M + BLOCK_M - 1) // GROUP, q_len - 1)
            hi = prefix_len + last_row + 1
            if WINDOWED:  # causal: an entry's index is its position
                new_lo = tl.maximum(new_lo, win_lo)
        for start in range(new_lo, hi, BLOCK_NEW):
            offs_n = start + tl.arange(0, BLOCK_NEW)
            n_valid = offs_n < hi
            slot = tl.load(kv_indices + kv_start + offs_n, mask=n_valid, other=0).to(tl.int64)
            if HAS_MASK:
                bits = tl.load(MASK + mask_start + row[:, None].to(tl.int64) * q_len + (offs_n[None, :] - prefix_len),
                               mask=row_valid[:, None] & n_valid[None, :], other=0)
                visible = bits != 0
            else:
                visible = (offs_n[None, :] - prefix_len) <= row[:, None]
            if WINDOWED:
                if HAS_MASK:  # new entry j is node j, at its own given position
                    kv_pos = tl.load(POSITIONS + q_start + offs_n - prefix_len, mask=n_valid, other=0)
                else:
                    kv_pos = offs_n
                visible = visible & (kv_pos[None, :].to(tl.int32) > q_pos[:, None] - window)
            m_i, l_i, acc = attend_tile(q, K, V, slot, n_valid, visible & n_valid[None, :], kv_head, stride_ks,
                                        stride_kh, stride_vs, stride_vh, offs_d, d_valid, sm_scale_log2, m_i, l_i,
                                        acc, DOT_PRECISION, False)

    o_ptrs = O + token[:, None] * stride_ot + head[:, None] * stride_oh + split * stride_osplit + offs_d[None, :]
    lse_ptrs = LSE + token * stride_lt + head * stride_lh + split
    store_rows(acc, m_i, l_i, o_ptrs, lse_ptrs, q_mask, row_valid, DIRECT)


def extend_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    qo_indptr: torch.Tensor,  # [num_seqs + 1] int32
    kv_indptr: torch.Tensor,  # [num_seqs + 1] int32
    kv_indices: torch.Tensor,  # [total_kv] int32 KV slots: prefix, then the new tokens' own
    mask: torch.Tensor | None,  # [sum_s q_s * q_s] uint8 row-major [q_s, q_s] new-token blocks; None = causal
    mask_indptr: torch.Tensor | None,  # [num_seqs + 1] int64; None when mask is None
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim] (written)
    *,
    sm_scale: float,
    max_q_len: int,
    max_prefix_len: int,
    num_splits: int | None = None,
    new_split: bool | None = None,
    window: int | None = None,
    positions: torch.Tensor | None = None,  # [num_tokens] int position of each query row
    one_plan: bool = False,
    skip: torch.Tensor | None = None,  # [num_seqs] int8: nonzero, the sequence's rows are left as they are
) -> None:
    """Attention of each sequence's query rows over its prefix and (causal / masked) new tokens,
    with a sliding ``window`` only over entries at positions > the row's - window (module docstring).

    ``max_q_len`` and ``max_prefix_len`` are host ints (no sync) that size the grid and the split
    plan; ``num_splits`` forces a split count of the prefix; ``new_split`` whether the new tokens'
    block of a sequence whose prefix spans several chunks runs in a split of its own (None: the
    planner decides, ``plan_extend_splits``). ``positions`` is read only under a window with a mask
    (a tree node's position is the prefix plus its depth; a causal row's is the prefix plus its index).

    ``one_plan``: the same launch whatever else the batch holds (the largest query tile, one KV split,
    the new tokens in the prefix's tiles), so a row's bits depend on its own sequence alone: a prompt
    prefilled alone or beside any others, over the same cached prefix, gets the same result. The
    target's prefill runs so (``triton_backend``); ``num_splits`` and ``new_split`` must then be None.
    ``skip`` (with ``one_plan`` only) leaves some sequences' rows to another kernel.
    """
    if one_plan and (num_splits is not None or new_split is not None):
        raise ValueError("extend_attention: one_plan fixes the split plan; num_splits and new_split must be None")
    if skip is not None and not one_plan:
        raise ValueError("extend_attention: skip needs one_plan (a split plan's merge would write every row)")
    _check_inputs(q, k_buffer, v_buffer, kv_indptr, kv_indices, out)
    num_tokens, hq, d = q.shape
    hkv = k_buffer.shape[1]
    num_seqs = kv_indptr.shape[0] - 1
    check_tensor("qo_indptr", qo_indptr, dtype=torch.int32, shape=(num_seqs + 1,), device=q.device)
    if (mask is None) != (mask_indptr is None):
        raise ValueError("mask and mask_indptr: give both or neither")
    if skip is not None:
        check_tensor("skip", skip, dtype=torch.int8, shape=(num_seqs,), device=q.device)
    if mask is not None:
        check_tensor("mask", mask, dtype=torch.uint8, dim=1, device=q.device)
        check_tensor("mask_indptr", mask_indptr, dtype=torch.int64, shape=(num_seqs + 1,), device=q.device)
    windowed = window is not None
    if windowed and mask is not None:
        if positions is None:
            raise ValueError("extend_attention: a window under a mask needs the rows' positions")
        check_tensor("positions", positions, dtype=(torch.int32, torch.int64), shape=(num_tokens,), device=q.device)
    if num_seqs == 0 or num_tokens == 0:
        return
    group = hq // hkv
    tiles = tile_dtype(q.dtype, k_buffer.dtype)
    span = window_span(max_prefix_len, window)
    # NOTE: tl.dot needs >= 16 rows; a verify tile (N nodes x group heads) is often smaller than the cap
    if one_plan:
        block_m, num_splits, new_split = max_block_m(q.device), 1, False
    else:
        block_m = extend_block_m(q.device, rows=max_q_len * group, num_seqs=num_seqs, num_kv_heads=hkv,
                                 max_prefix_len=span)
    cfg = launch_config(q.device, block_m=block_m, head_dim=d, elem_size=tiles.itemsize)
    m_blocks = triton.cdiv(max_q_len * group, block_m)
    splits, _, new_split = plan_extend_splits(num_seqs * hkv * m_blocks, span, max_q_len * group,
                                              device=q.device, tile=cfg.block_n, block_m=block_m,
                                              num_splits=num_splits, new_split=new_split)
    splits += int(new_split)
    if not one_plan and is_streaming_grid(q.device, num_seqs * hkv * m_blocks, splits, block_m=block_m):
        cfg = launch_config(q.device, block_m=block_m, head_dim=d, elem_size=tiles.itemsize, streaming=True)
    direct = splits == 1
    partial, lse = split_buffers(out, splits)
    has_mask = mask is not None
    _extend_kernel[(num_seqs, hkv, m_blocks * splits)](
        q, k_buffer, v_buffer, partial, lse, qo_indptr, kv_indptr, kv_indices,
        mask if has_mask else kv_indices, mask_indptr if has_mask else kv_indptr,
        positions if windowed and has_mask else qo_indptr, skip if skip is not None else qo_indptr,
        sm_scale * LOG2E, splits, window_arg(window),
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1),
        GROUP=group, HEAD_DIM=d, BLOCK_D=head_dim_block(d), BLOCK_M=block_m, BLOCK_N=cfg.block_n,
        BLOCK_NEW=cfg.block_n if one_plan else new_block_n(max_q_len, cfg.block_n),
        HAS_MASK=has_mask, DIRECT=direct, DOT_PRECISION=dot_precision(tiles, q.device), NEW_SPLIT=new_split,
        WINDOWED=windowed, HAS_SKIP=skip is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if not direct:
        merge_partials(partial, lse, out)


def extend_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    out: torch.Tensor,
    *,
    sm_scale: float,
    max_q_len: int,
    max_prefix_len: int,
    num_splits: int | None = None,
    new_split: bool | None = None,
    window: int | None = None,
    positions: torch.Tensor | None = None,
    one_plan: bool = False,
    skip: torch.Tensor | None = None,
) -> None:
    """Specification of ``extend_attention``, one sequence at a time in fp32.

    Row i of a sequence (q rows, kv entries, prefix p = kv - q) sees entries 0..p-1 and new entry
    j iff ``j <= i`` (mask None) or ``mask[i, j]`` of the sequence's [q, q] block; with a ``window``
    only those at positions > its own - window, where prefix entry e is at position e, and row i and
    new entry j at p + i and p + j (mask None) or at the given ``positions`` of rows i and j. The
    plan arguments do not change the result; a sequence ``skip`` marks keeps its rows in ``out``.
    """
    group = q.shape[1] // k_buffer.shape[1]
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    skipped = skip.tolist() if skip is not None else [0] * (len(qo) - 1)
    mp = mask_indptr.tolist() if mask_indptr is not None else None
    for s in range(len(qo) - 1):
        if skipped[s]:
            continue
        n, kv = qo[s + 1] - qo[s], kvp[s + 1] - kvp[s]
        p = kv - n
        slots = kv_indices[kvp[s] : kvp[s + 1]].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [kv, num_heads, d]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        visible = torch.ones(n, kv, dtype=torch.bool, device=q.device)
        if mp is None:
            visible[:, p:] = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        else:
            visible[:, p:] = mask[mp[s] : mp[s + 1]].view(n, n) != 0
        if window is not None:
            own = positions[qo[s] : qo[s + 1]].long() if mp is not None else p + torch.arange(n, device=q.device)
            kv_pos = torch.cat([torch.arange(p, device=q.device), own])  # [kv]
            visible &= kv_pos[None, :] > own[:, None] - window
        scores = torch.einsum("qhd,khd->hqk", q[qo[s] : qo[s + 1]].float(), k) * sm_scale
        scores = scores.masked_fill(~visible, float("-inf"))
        out[qo[s] : qo[s + 1]] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v).to(out.dtype)
