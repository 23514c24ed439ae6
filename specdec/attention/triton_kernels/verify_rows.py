"""``decode_attention_rows``: a verify tree's nodes as decode steps, bit for bit.

Each node (query row) attends over its own KV list (its request's prefix, its ancestors by depth,
itself) with the arithmetic of ``decode.py``'s kernel planned as the decode batch of ``plan_seqs``
sequences: the same split count, tiles, warps, split ranges (a row's own length over the splits) and
online-softmax steps. A node on the accepted path then gives what the decode step of its token gives.

The decode kernel folds a list's last DECODE_TAIL entries as one tile of their own (the tail), after
the tiles its splits cut from the entries before them (the body; ``decode_ranges``). Two grids run
that arithmetic:

* per node (``decode.py``'s kernel over a table of lists): every node reads its whole prefix, so a
  tree of n nodes reads its request's KV n times;
* **node groups** (``nodes_per_seq`` given, at most DECODE_TAIL, global layers): a program holds nodes
  of one request in a query tile (``BLOCK_H`` rows: ``BLOCK_H // GROUP`` nodes of GROUP heads each,
  where the decode kernel pads its GROUP heads), and a tree larger than one tile in two such tiles
  (``PAIR``). A node's depth is below DECODE_TAIL, so its body lies inside its request's prefix,
  which every node lists alike: each body tile is loaded once, from the first node's list, and
  multiplied once a query tile; rows of a matrix product do not interact, and a row sees exactly its
  own body's range (per-row masks), so each row's scores and output are the decode step's. The
  tails follow as tiles of the decode plan's width (16-bit tiles on a GPU; fp32 and the interpreter
  take one node's a tile) holding the nodes' tails side by side (node j's in columns
  ``j * DECODE_TAIL ..``), a row seeing its own node's columns alone: its scores are its
  own columns' products, and the products with the others' columns (zero weights) add exact zeros
  to its sums, which both kernels take as products (``online_softmax_step``'s ROW_SUMS_BY_DOT), so
  the row keeps the bits of the decode kernel's one tail tile. The query tile is the decode plan's
  (16 rows for GQA up to 16), except under the streaming plan (large batches), where it holds up to
  NODE_TILE_ROWS rows: an 8-node tree under GQA 4 in one tile, so each body tile is multiplied once
  (a larger tree takes more programs, not a second tile); there both kernels take every fold's row
  sums as products (a reduction's order follows the tile's height, a product's does not).

    request with prefix 300 (tiles of 128, tail 16), 8 nodes of depth 0-4 (lists 301-305), GROUP 4
    (4 nodes a 16-row tile: PAIR), 2 splits:
    node of list 303: body 0..286 (split 0: 0..255, chunk 256), tail 287..302 in split 1
    split 0 of every node: tiles 0..127, 128..255, each loaded once, multiplied by both query tiles
    split 1: tile 256..383 of the first node's list (each row masked to its own body's end), then one
      tile of the 8 nodes' tails (128 columns), multiplied by both query tiles

Sliding windows start each row's range at its own ``length - window``, off the tile grid, so local
layers take the per-node grid, and so do trees of more than DECODE_TAIL nodes (a node's body could
pass the prefix).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.attention.triton_kernels.common import (
    DECODE_TAIL,
    LOG2E,
    decode_ranges,
    dot_precision,
    fold_tile,
    head_dim_block,
    load_kv_tile,
    query_tile,
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
                 GROUP: tl.constexpr, NODES: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr):
    """The query tile of the node group whose first row is ``first`` (``end``: past the request's
    last row) and each tile row's query row, query head, whether it is real, its body's [lo, hi) in
    this split and whether it folds its tail here, as the decode kernel cuts its own length."""
    row = first + offs_h // GROUP  # [BLOCK_H]
    valid = (offs_h < NODES * GROUP) & (row < end)
    head = kv_head * GROUP + offs_h % GROUP
    q = tl.load(Q + row.to(tl.int64)[:, None] * stride_qs + head[:, None] * stride_qh + offs_d[None, :],
                mask=valid[:, None] & d_valid[None, :], other=0.0)
    kv_len = tl.load(row_lens + row, mask=valid, other=0)
    lo, hi, _, folds_tail = decode_ranges(kv_len, 0, split, tl.num_programs(2), BLOCK_N, TAIL)
    return query_tile(q, K), row, head, valid, lo, hi, valid & folds_tail


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
def _node_group_kernel(
    Q, K, V, O, LSE, kv_table, row_lens, kv_row_stride, nodes_per_seq, sm_scale_log2,
    stride_qs, stride_qh,
    stride_ks, stride_kh, stride_vs, stride_vh,
    stride_os, stride_oh, stride_osplit,
    stride_ls, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr, TAIL_N: tl.constexpr,
    NODES: tl.constexpr, PAIR: tl.constexpr, SPAN: tl.constexpr, DIRECT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ROW_SUMS_BY_DOT: tl.constexpr,
):
    # a program: NODES nodes of one request (a second NODES in a second query tile under PAIR): SPAN nodes
    programs = tl.cdiv(nodes_per_seq, SPAN)
    seq = tl.program_id(0) // programs
    first = seq * nodes_per_seq + (tl.program_id(0) % programs) * SPAN  # this program's first row
    end = (seq + 1) * nodes_per_seq  # past the request's last row
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM

    q0, row0, head0, valid0, lo0, hi0, tail0 = _query_group(Q, K, row_lens, first, end, kv_head, split, offs_h,
                                                            offs_d, d_valid, stride_qs, stride_qh, GROUP, NODES,
                                                            BLOCK_N, TAIL)
    t_lo, t_hi = _busy_span(lo0, hi0)
    tails = tl.max(tail0.to(tl.int32), 0)
    m0 = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l0 = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    if PAIR:
        q1, row1, head1, valid1, lo1, hi1, tail1 = _query_group(Q, K, row_lens, first + NODES, end, kv_head, split,
                                                                offs_h, offs_d, d_valid, stride_qs, stride_qh, GROUP,
                                                                NODES, BLOCK_N, TAIL)
        lo1_any, hi1_any = _busy_span(lo1, hi1)
        t_lo = tl.minimum(t_lo, lo1_any)
        t_hi = tl.maximum(t_hi, hi1_any)
        tails = tl.maximum(tails, tl.max(tail1.to(tl.int32), 0))
        m1 = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l1 = tl.zeros([BLOCK_H], tl.float32)
        acc1 = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)

    # the bodies: a node's lies inside the request's prefix (its depth is below TAIL), which every node lists
    # alike, so one load of each tile from the first node's list serves every row, one product a query tile
    shared_row = kv_table + first.to(tl.int64) * kv_row_stride
    for start in range(t_lo, t_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_valid = offs_n < t_hi
        slot = tl.load(shared_row + offs_n, mask=n_valid, other=0).to(tl.int64)
        k, v = load_kv_tile(K, V, slot, n_valid, kv_head, stride_ks, stride_kh, stride_vs, stride_vh, offs_d,
                            d_valid)
        visible0 = (offs_n[None, :] >= lo0[:, None]) & (offs_n[None, :] < hi0[:, None])
        m0, l0, acc0 = fold_tile(q0, k, v, visible0, sm_scale_log2, m0, l0, acc0, DOT_PRECISION, ROW_SUMS_BY_DOT)
        if PAIR:
            visible1 = (offs_n[None, :] >= lo1[:, None]) & (offs_n[None, :] < hi1[:, None])
            m1, l1, acc1 = fold_tile(q1, k, v, visible1, sm_scale_log2, m1, l1, acc1, DOT_PRECISION, ROW_SUMS_BY_DOT)
    # the tails: the span's nodes' last TAIL entries side by side (node j's in columns j*TAIL ..), TAIL_N
    # columns a tile, a row seeing its own node's alone; unpipelined: the body loop's buffers fill the shared
    # memory the decode plan sized for one loop
    if tails > 0:
        for c in tl.range(0, SPAN * TAIL, TAIL_N, num_stages=1):
            offs_c = c + tl.arange(0, TAIL_N)
            node = offs_c // TAIL  # [TAIL_N] within the span
            node_len = tl.load(row_lens + first + node, mask=(node < SPAN) & (first + node < end), other=0)
            pos = tl.maximum(node_len - TAIL, 0) + offs_c % TAIL
            n_valid = pos < node_len
            slot = tl.load(kv_table + (first + node).to(tl.int64) * kv_row_stride + pos, mask=n_valid, other=0)
            k, v = load_kv_tile(K, V, slot.to(tl.int64), n_valid, kv_head, stride_ks, stride_kh, stride_vs,
                                stride_vh, offs_d, d_valid)
            visible0 = tail0[:, None] & (node[None, :] == (row0 - first)[:, None]) & n_valid[None, :]
            m0, l0, acc0 = fold_tile(q0, k, v, visible0, sm_scale_log2, m0, l0, acc0, DOT_PRECISION, True)
            if PAIR:
                visible1 = tail1[:, None] & (node[None, :] == (row1 - first)[:, None]) & n_valid[None, :]
                m1, l1, acc1 = fold_tile(q1, k, v, visible1, sm_scale_log2, m1, l1, acc1, DOT_PRECISION, True)

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
) -> None:
    """Each query row as a decode step over its own list, planned (split count, tiles) as the decode
    batch of ``plan_seqs`` sequences whose longest is ``max_kv_len``: a verify node of a tree and the
    decode step of the same token in a batch of as many requests run the same arithmetic, bit for bit
    (with a ``window`` too: a row's list is its positions 0..its own, so it sees its last ``window``).

    ``nodes_per_seq``: the rows are requests' trees of ``nodes_per_seq`` nodes each, request-major (a
    node's list: its request's prefix, its ancestors, itself); global layers then run node groups for
    trees of up to DECODE_TAIL nodes (module docstring). The result does not depend on the grid."""
    check_qkv(q, k_buffer, v_buffer, out)
    check_tensor("kv_table", kv_table, dtype=torch.int32, dim=2, device=q.device)
    check_tensor("row_lens", row_lens, dtype=torch.int32, shape=(q.shape[0],), device=q.device)
    if kv_table.shape[0] != q.shape[0] or kv_table.stride(1) != 1:
        raise ValueError(f"kv_table: expected {q.shape[0]} rows with unit last stride, got {tuple(kv_table.shape)}")
    if nodes_per_seq is not None and (nodes_per_seq < 1 or q.shape[0] % nodes_per_seq):
        raise ValueError(f"nodes_per_seq={nodes_per_seq}: expected a divisor of the {q.shape[0]} rows")
    if nodes_per_seq is not None and nodes_per_seq <= DECODE_TAIL and window is None:
        _launch_node_groups(q, k_buffer, v_buffer, kv_table, row_lens, out, nodes_per_seq,
                            sm_scale=sm_scale, max_kv_len=max_kv_len, plan_seqs=plan_seqs, num_splits=num_splits)
        return
    # NOTE: kv_indptr is not read under ROW_TABLE (row_lens stands in)
    launch_decode_grid(q, k_buffer, v_buffer, row_lens, kv_table, row_lens, kv_table.stride(0), out,
                       sm_scale=sm_scale, max_kv_len=max_kv_len, plan_seqs=plan_seqs, num_splits=num_splits,
                       row_table=True, window=window)


def _launch_node_groups(q, k_buffer, v_buffer, kv_table, row_lens, out, nodes_per_seq, *, sm_scale, max_kv_len,
                        plan_seqs, num_splits) -> None:
    """Grid (request x node group, KV head, split) under the decode batch's plan."""
    num_rows, hq, d = q.shape
    hkv = k_buffer.shape[1]
    num_seqs = num_rows // nodes_per_seq
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
    precision = dot_precision(tile_dtype(q.dtype, k_buffer.dtype), q.device)
    # the nodes' tails side by side in tiles of up to the plan's width; for fp32 tiles one node's a tile: there the
    # FMA units' products over 128 columns took other bits than the decode kernel's over its 16 (H200, triton 3.6;
    # benchmarks/results/2026-12-02-h200-decode-tail)
    tail_tile = DECODE_TAIL
    if precision == "native":
        tail_tile = min(plan.block_n, triton.next_power_of_2(span * DECODE_TAIL))
    direct = plan.splits == 1
    partial, lse = split_buffers(out, plan.splits)
    _node_group_kernel[(num_seqs * triton.cdiv(nodes_per_seq, span), hkv, plan.splits)](
        q, k_buffer, v_buffer, partial, lse, kv_table, row_lens, kv_table.stride(0), nodes_per_seq,
        sm_scale * LOG2E,
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1),
        GROUP=group, HEAD_DIM=d, BLOCK_D=head_dim_block(d), BLOCK_H=block_h, BLOCK_N=plan.block_n,
        TAIL=DECODE_TAIL, TAIL_N=tail_tile, NODES=nodes, PAIR=pair, SPAN=span, DIRECT=direct,
        DOT_PRECISION=precision, ROW_SUMS_BY_DOT=plan.streaming,
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
) -> None:
    """Specification of ``decode_attention_rows``: ``decode_attention_ref`` over the rows' lists (the
    plan arguments, ``nodes_per_seq`` included, do not change the result)."""
    lens = row_lens.tolist()
    indices = torch.cat([kv_table[r, :n] for r, n in enumerate(lens)]) if lens else kv_table.new_zeros(0)
    indptr = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    decode_attention_ref(q, k_buffer, v_buffer, indptr, indices, out, sm_scale=sm_scale, max_kv_len=max_kv_len,
                         window=window)
