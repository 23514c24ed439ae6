"""``decode_attention_rows``: a verify tree's nodes as decode steps, bit for bit.

Each node (query row) attends over its own KV list (its request's prefix, its ancestors by depth,
itself) with the arithmetic of ``decode.py``'s kernel planned as the decode batch of ``plan_seqs``
sequences: the same split count, tiles, warps, split ranges (a row's own length over the splits) and
online-softmax steps. A node on the accepted path then gives what the decode step of its token gives.

Two grids run that arithmetic:

* per node (``decode.py``'s kernel over a table of lists): every node reads its whole prefix, so a
  tree of n nodes reads its request's KV n times;
* **node groups** (``nodes_per_seq`` given, global layers): a program holds nodes of one request in
  a query tile (``BLOCK_H`` rows: ``BLOCK_H // GROUP`` nodes of GROUP heads each, where the decode
  kernel pads its GROUP heads), and a tree larger than one tile in two such tiles (``PAIR``), so
  each prefix tile is loaded once for up to twice that many nodes and multiplied once per query tile;
  rows of a matrix product do not interact, so each row's scores and output are the decode step's.
  The tile is the decode plan's (16 rows for GQA up to 16), except under the streaming plan (large
  batches), where it holds up to NODE_TILE_ROWS rows: an 8-node tree under GQA 4 in one tile, so
  each prefix tile is multiplied once (a larger tree takes more programs, not a second tile). There
  both kernels take the softmax's row sums as products (``online_softmax_step``'s ROW_SUMS_BY_DOT: a
  reduction's order follows the tile's height, a product's does not). The tiles past the request's
  prefix hold each node's own ancestors: there the program loads the tile from one node's list and
  multiplies it for the rows, in either
  query tile, of that node and of its ancestors (their lists are prefixes of it, and a row's entries
  past its own length lie outside its range), so once for a chain and at most once a leaf of the
  program's nodes for a tree, and keeps those rows. A row folds exactly the tiles of its own split range
  (the ranges start on tile boundaries, so every node's tiles line up); a tile outside a row's
  range leaves the row's softmax state unchanged bit for bit (``online_softmax_step`` with nothing
  visible).

    request with prefix 300 (tiles of 128), 8 nodes, GROUP 4 (4 nodes a 16-row tile: PAIR), 2 splits:
    split 0 of every node: positions 0..255 (chunk 256: ceil(ceil(30x / 2) / 128) * 128), each tile
      loaded once, multiplied by both query tiles
    split 1: positions 256..300+depth: tile 256..383 crosses the prefix's end -> one load for a
      chain (its last node's list, multiplied by both query tiles), one a leaf for a tree

Sliding windows start each row's range at its own ``length - window``, off the tile grid, so local
layers take the per-node grid.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.attention.triton_kernels.common import (
    LOG2E,
    dot_precision,
    fold_tile,
    head_dim_block,
    load_kv_tile,
    query_tile,
    split_chunk,
    store_rows,
    tile_dtype,
)
from specdec.attention.triton_kernels.decode import (
    check_qkv,
    decode_attention_ref,
    decode_plan,
    launch_decode_grid,
)
from specdec.attention.triton_kernels.merge import merge_partials, split_buffers
from specdec.kernels.common import check_tensor

NODE_TILE_ROWS = 32  # a node group's query tile under the streaming plan: (node, head) rows


@triton.jit
def _query_group(Q, K, row_lens, first, end, kv_head, split, offs_h, offs_d, d_valid, stride_qs, stride_qh,
                 GROUP: tl.constexpr, NODES: tl.constexpr, BLOCK_N: tl.constexpr):
    """The query tile of the node group whose first row is ``first`` (``end``: past the request's
    last row) and each tile row's query row, query head, whether it is real, list length and [lo, hi)
    in this split, as the decode kernel cuts its own length."""
    row = first + offs_h // GROUP  # [BLOCK_H]
    valid = (offs_h < NODES * GROUP) & (row < end)
    head = kv_head * GROUP + offs_h % GROUP
    q = tl.load(Q + row.to(tl.int64)[:, None] * stride_qs + head[:, None] * stride_qh + offs_d[None, :],
                mask=valid[:, None] & d_valid[None, :], other=0.0)
    kv_len = tl.load(row_lens + row, mask=valid, other=0)
    chunk = split_chunk(kv_len, tl.num_programs(2), BLOCK_N)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    return query_tile(q, K), row, head, valid, kv_len, lo, hi


@triton.jit
def _busy_span(lo, hi):
    """[first, last) position any row of the tile folds in this split (empty: [2^30, 0))."""
    busy = lo < hi
    return tl.min(tl.where(busy, lo, 1 << 30), 0), tl.max(tl.where(busy, hi, 0), 0)


@triton.jit
def _store_group(acc, m_i, l_i, O, LSE, row, head, valid, split, offs_d, d_valid, stride_os, stride_oh,
                 stride_osplit, stride_ls, stride_lh, DIRECT: tl.constexpr):
    """``store_rows`` for a node group's tile rows."""
    o_ptrs = O + row.to(tl.int64)[:, None] * stride_os + head[:, None] * stride_oh + split * stride_osplit \
        + offs_d[None, :]
    lse_ptrs = LSE + row.to(tl.int64) * stride_ls + head * stride_lh + split
    store_rows(acc, m_i, l_i, o_ptrs, lse_ptrs, valid[:, None] & d_valid[None, :], valid, DIRECT)


@triton.jit
def _tail_takes(kv_table, kv_row_stride, lens, offs_j, first, row, kv_len, sees, SPAN: tl.constexpr):
    """[BLOCK_H] the node of the span (0..SPAN-1 from ``first``; ``lens`` [SPAN_P2] their list lengths) whose
    list serves each tile row in a tile past the request's prefix: the span's last node that lists the row's
    own slot at the row's last position (a slot is one token's, a list a path from the root), so the row and
    its ancestors read a list their own lists are prefixes of (its entries past a row's length lie outside
    the row's [lo, hi): they add exactly nothing to it); -1 for rows that see nothing here. Nodes come after
    their parents, so the node taken is a leaf: a chain takes one list, a tree at most one a leaf."""
    # NOTE: one gather of every span node's entry at each row's last position ([BLOCK_H, SPAN_P2]), not a
    # load a node: the loads are independent, and in a loop their latencies added up in every program's tail
    own = tl.load(kv_table + row.to(tl.int64) * kv_row_stride + kv_len - 1, mask=sees, other=-1)  # [BLOCK_H]
    holds = sees[:, None] & (offs_j < SPAN)[None, :] & (kv_len[:, None] <= lens[None, :])
    at = tl.load(kv_table + (first + offs_j).to(tl.int64)[None, :] * kv_row_stride + (kv_len - 1)[:, None],
                 mask=holds, other=-2)
    return tl.max(tl.where(holds & (at == own[:, None]), offs_j[None, :], -1), 1)


@triton.jit
def _fold_rows(q, k, v, visible, mine, sm_scale_log2, m_i, l_i, acc, DOT_PRECISION: tl.constexpr,
               ROW_SUMS_BY_DOT: tl.constexpr):
    """``fold_tile`` for the tile rows in ``mine`` [BLOCK_H]; the others keep their state."""
    m_j, l_j, acc_j = fold_tile(q, k, v, visible, sm_scale_log2, m_i, l_i, acc, DOT_PRECISION, ROW_SUMS_BY_DOT)
    return tl.where(mine, m_j, m_i), tl.where(mine, l_j, l_i), tl.where(mine[:, None], acc_j, acc)


@triton.jit
def _node_group_kernel(
    Q, K, V, O, LSE, kv_table, row_lens, prefix_lens, kv_row_stride, nodes_per_seq, sm_scale_log2,
    stride_qs, stride_qh,
    stride_ks, stride_kh, stride_vs, stride_vh,
    stride_os, stride_oh, stride_osplit,
    stride_ls, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NODES: tl.constexpr, PAIR: tl.constexpr,
    SPAN: tl.constexpr, SPAN_P2: tl.constexpr, DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ROW_SUMS_BY_DOT: tl.constexpr,
):
    # a program: NODES nodes of one request (a second NODES in a second query tile under PAIR): SPAN nodes
    # (SPAN_P2: the power of two from there)
    programs = tl.cdiv(nodes_per_seq, SPAN)
    seq = tl.program_id(0) // programs
    first = seq * nodes_per_seq + (tl.program_id(0) % programs) * SPAN  # this program's first row
    end = (seq + 1) * nodes_per_seq  # past the request's last row
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM

    q0, row0, head0, valid0, len0, lo0, hi0 = _query_group(Q, K, row_lens, first, end, kv_head, split, offs_h,
                                                           offs_d, d_valid, stride_qs, stride_qh, GROUP, NODES,
                                                           BLOCK_N)
    t_lo, t_hi = _busy_span(lo0, hi0)
    m0 = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l0 = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    if PAIR:
        q1, row1, head1, valid1, len1, lo1, hi1 = _query_group(Q, K, row_lens, first + NODES, end, kv_head, split,
                                                               offs_h, offs_d, d_valid, stride_qs, stride_qh, GROUP,
                                                               NODES, BLOCK_N)
        lo1_any, hi1_any = _busy_span(lo1, hi1)
        t_lo = tl.minimum(t_lo, lo1_any)
        t_hi = tl.maximum(t_hi, hi1_any)
        m1 = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l1 = tl.zeros([BLOCK_H], tl.float32)
        acc1 = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)

    prefix = tl.load(prefix_lens + seq).to(tl.int32)  # entries every node of the request lists alike
    offs_j = tl.arange(0, SPAN_P2)
    node_ok = (offs_j < SPAN) & (first + offs_j < end)
    lens = tl.load(row_lens + first + offs_j, mask=node_ok, other=0)  # [SPAN_P2] the span's list lengths
    shared_row = kv_table + first.to(tl.int64) * kv_row_stride
    # NOTE: two loops, not one with a branch: a branch in the loop keeps Triton from pipelining its loads
    # (the 8B verify of a 4-node chain at bs 32 took 13 % longer than the extend kernel with one)
    shared_end = tl.minimum(prefix // BLOCK_N * BLOCK_N, t_hi)  # tiles wholly inside the prefix end here
    for start in range(t_lo, shared_end, BLOCK_N):  # one load for every node, one product a query tile
        offs_n = start + tl.arange(0, BLOCK_N)
        slot = tl.load(shared_row + offs_n).to(tl.int64)
        k, v = load_kv_tile(K, V, slot, offs_n < t_hi, kv_head, stride_ks, stride_kh, stride_vs, stride_vh, offs_d,
                            d_valid)
        visible0 = (offs_n[None, :] >= lo0[:, None]) & (offs_n[None, :] < hi0[:, None])
        m0, l0, acc0 = fold_tile(q0, k, v, visible0, sm_scale_log2, m0, l0, acc0, DOT_PRECISION, ROW_SUMS_BY_DOT)
        if PAIR:
            visible1 = (offs_n[None, :] >= lo1[:, None]) & (offs_n[None, :] < hi1[:, None])
            m1, l1, acc1 = fold_tile(q1, k, v, visible1, sm_scale_log2, m1, l1, acc1, DOT_PRECISION, ROW_SUMS_BY_DOT)
    # each node's ancestors: the tiles past the prefix (one or two, unpipelined: the prefix loop's buffers
    # fill the shared memory the decode plan sized for one loop), each list one load for both query tiles
    for start in tl.range(tl.maximum(t_lo, shared_end), t_hi, BLOCK_N, num_stages=1):
        offs_n = start + tl.arange(0, BLOCK_N)
        # every span node's slots in this tile ([SPAN_P2, BLOCK_N], a few KB), loaded at once: a node's
        # K/V load below then waits for one load, not two in series
        span_slots = tl.load(kv_table + (first + offs_j).to(tl.int64)[:, None] * kv_row_stride + offs_n[None, :],
                             mask=node_ok[:, None] & (offs_n[None, :] < lens[:, None]), other=0)
        visible0 = (offs_n[None, :] >= lo0[:, None]) & (offs_n[None, :] < hi0[:, None])
        take0 = _tail_takes(kv_table, kv_row_stride, lens, offs_j, first, row0, len0,
                            tl.max(visible0.to(tl.int32), 1) > 0, SPAN)
        if PAIR:
            visible1 = (offs_n[None, :] >= lo1[:, None]) & (offs_n[None, :] < hi1[:, None])
            take1 = _tail_takes(kv_table, kv_row_stride, lens, offs_j, first, row1, len1,
                                tl.max(visible1.to(tl.int32), 1) > 0, SPAN)
        # NOTE: a loop, not unrolled (static_range): unrolled, one 8B layer's 8-node trees took 41 against 37 µs
        # at bs 8 and 133 against 116 at bs 64 on an H200, and it builds 4x longer. A loop over the served lists
        # alone, without the branch (Triton then pipelines its loads), was slower still: 46 and 152 µs
        # (benchmarks/results/2026-12-01-h200-node-group-tail)
        for j in tl.range(0, SPAN, num_stages=1):
            mine0 = take0 == j  # [BLOCK_H]
            used0 = tl.max(mine0.to(tl.int32), 0)
            used = used0
            if PAIR:
                mine1 = take1 == j
                used1 = tl.max(mine1.to(tl.int32), 0)
                used = tl.maximum(used0, used1)
            if used > 0:
                n_valid = offs_n < tl.sum(tl.where(offs_j == j, lens, 0), 0)
                slot = tl.sum(tl.where((offs_j == j)[:, None], span_slots, 0), 0)  # [BLOCK_N] node j's
                k, v = load_kv_tile(K, V, slot.to(tl.int64), n_valid, kv_head, stride_ks, stride_kh, stride_vs,
                                    stride_vh, offs_d, d_valid)
                if used0 > 0:
                    m0, l0, acc0 = _fold_rows(q0, k, v, visible0, mine0, sm_scale_log2, m0, l0, acc0, DOT_PRECISION,
                                              ROW_SUMS_BY_DOT)
                if PAIR:
                    if used1 > 0:
                        m1, l1, acc1 = _fold_rows(q1, k, v, visible1, mine1, sm_scale_log2, m1, l1, acc1,
                                                  DOT_PRECISION, ROW_SUMS_BY_DOT)

    _store_group(acc0, m0, l0, O, LSE, row0, head0, valid0, split, offs_d, d_valid, stride_os, stride_oh,
                 stride_osplit, stride_ls, stride_lh, DIRECT)
    if PAIR:
        _store_group(acc1, m1, l1, O, LSE, row1, head1, valid1, split, offs_d, d_valid, stride_os, stride_oh,
                     stride_osplit, stride_ls, stride_lh, DIRECT)


def decode_attention_rows(
    q: torch.Tensor,  # [num_rows, num_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    kv_table: torch.Tensor,  # [num_rows, stride] int32 KV slots of row r in position order
    row_lens: torch.Tensor,  # [num_rows] int32 entries of row r's list
    out: torch.Tensor,  # [num_rows, num_heads, head_dim] (written)
    *,
    sm_scale: float,
    max_kv_len: int,
    plan_seqs: int,
    num_splits: int | None = None,
    window: int | None = None,
    nodes_per_seq: int | None = None,
    prefix_lens: torch.Tensor | None = None,  # [num_rows / nodes_per_seq] entries every node lists alike
) -> None:
    """Each query row as a decode step over its own list, planned (split count, tiles) as the decode
    batch of ``plan_seqs`` sequences whose longest is ``max_kv_len``: a verify node of a tree and the
    decode step of the same token in a batch of as many requests run the same arithmetic, bit for bit
    (with a ``window`` too: a row's list is its positions 0..its own, so it sees its last ``window``).

    ``nodes_per_seq`` and ``prefix_lens``: the rows are requests' trees of ``nodes_per_seq`` nodes
    each, request-major, whose lists share their first ``prefix_lens[s]`` entries; global layers
    then run node groups (module docstring). The result does not depend on the grid."""
    check_qkv(q, k_buffer, v_buffer, out)
    check_tensor("kv_table", kv_table, dtype=torch.int32, dim=2, device=q.device)
    check_tensor("row_lens", row_lens, dtype=torch.int32, shape=(q.shape[0],), device=q.device)
    if kv_table.shape[0] != q.shape[0] or kv_table.stride(1) != 1:
        raise ValueError(f"kv_table: expected {q.shape[0]} rows with unit last stride, got {tuple(kv_table.shape)}")
    if (nodes_per_seq is None) != (prefix_lens is None):
        raise ValueError("nodes_per_seq and prefix_lens go together")
    if nodes_per_seq is not None and window is None:
        _launch_node_groups(q, k_buffer, v_buffer, kv_table, row_lens, prefix_lens, out, nodes_per_seq,
                            sm_scale=sm_scale, max_kv_len=max_kv_len, plan_seqs=plan_seqs, num_splits=num_splits)
        return
    # NOTE: kv_indptr is not read under ROW_TABLE (row_lens stands in)
    launch_decode_grid(q, k_buffer, v_buffer, row_lens, kv_table, row_lens, kv_table.stride(0), out,
                       sm_scale=sm_scale, max_kv_len=max_kv_len, plan_seqs=plan_seqs, num_splits=num_splits,
                       row_table=True, window=window)


def _launch_node_groups(q, k_buffer, v_buffer, kv_table, row_lens, prefix_lens, out, nodes_per_seq, *, sm_scale,
                        max_kv_len, plan_seqs, num_splits) -> None:
    """Grid (request x node group, KV head, split) under the decode batch's plan."""
    num_rows, hq, d = q.shape
    hkv = k_buffer.shape[1]
    if nodes_per_seq < 1 or num_rows % nodes_per_seq:
        raise ValueError(f"nodes_per_seq={nodes_per_seq}: expected a divisor of the {num_rows} rows")
    num_seqs = num_rows // nodes_per_seq
    check_tensor("prefix_lens", prefix_lens, dim=1, shape=(num_seqs,), device=q.device)
    if num_rows == 0:
        return
    plan = decode_plan(q, k_buffer, max_kv_len=max_kv_len, plan_seqs=plan_seqs, num_splits=num_splits, window=None)
    group = hq // hkv
    # under the streaming plan a query tile of up to NODE_TILE_ROWS rows, so a tree of 8 nodes under GQA 4 folds
    # each prefix tile once (a row's bits do not depend on the tile's height: the row sums are products,
    # ``online_softmax_step``). One 8B layer's 8-node trees at bs 64 on an H200: 120.5 -> 110.3 µs in the engine;
    # the other plans keep the decode tile, where 32 rows cost 2-5 % at bs 8
    # (benchmarks/results/2026-12-01-h200-node-group-tail)
    block_h = plan.block_h
    if plan.streaming:
        block_h = max(block_h, min(NODE_TILE_ROWS, triton.next_power_of_2(nodes_per_seq * group)))
    nodes = max(1, block_h // group)  # nodes a query tile holds
    # a program of two query tiles (its prefix tiles loaded once for both), but not of two widened streaming
    # tiles: at the plan's 2 warps their accumulators spill. One 8B layer's 12-node chains at bs 64 on an H200:
    # 276 -> 149 µs, random 12-node trees 312 -> 175 (benchmarks/results/2026-12-01-h200-ngram-agreement)
    pair = nodes_per_seq > nodes and block_h == plan.block_h
    span = nodes * (2 if pair else 1)  # a program's nodes
    direct = plan.splits == 1
    partial, lse = split_buffers(out, plan.splits)
    _node_group_kernel[(num_seqs * triton.cdiv(nodes_per_seq, span), hkv, plan.splits)](
        q, k_buffer, v_buffer, partial, lse, kv_table, row_lens, prefix_lens, kv_table.stride(0), nodes_per_seq,
        sm_scale * LOG2E,
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1),
        GROUP=group, HEAD_DIM=d, BLOCK_D=head_dim_block(d), BLOCK_H=block_h, BLOCK_N=plan.block_n,
        NODES=nodes, PAIR=pair, SPAN=span, SPAN_P2=triton.next_power_of_2(span), DIRECT=direct,
        DOT_PRECISION=dot_precision(tile_dtype(q.dtype, k_buffer.dtype), q.device), ROW_SUMS_BY_DOT=plan.streaming,
        num_warps=plan.num_warps, num_stages=plan.num_stages,
    )
    if not direct:
        merge_partials(partial, lse, out)


def decode_attention_rows_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_table: torch.Tensor,
    row_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    sm_scale: float,
    max_kv_len: int,
    plan_seqs: int,
    num_splits: int | None = None,
    window: int | None = None,
    nodes_per_seq: int | None = None,
    prefix_lens: torch.Tensor | None = None,
) -> None:
    """Specification of ``decode_attention_rows``: ``decode_attention_ref`` over the rows' lists (the
    plan arguments, ``nodes_per_seq`` and ``prefix_lens`` included, do not change the result)."""
    lens = row_lens.tolist()
    indices = torch.cat([kv_table[r, :n] for r, n in enumerate(lens)]) if lens else kv_table.new_zeros(0)
    indptr = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    decode_attention_ref(q, k_buffer, v_buffer, indptr, indices, out, sm_scale=sm_scale, max_kv_len=max_kv_len,
                         window=window)
