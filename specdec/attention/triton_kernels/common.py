"""Pieces shared by the decode and extend kernels: the online-softmax step, the split-KV plan,
tile sizes, the sliding-window argument, and whether Triton can run on a device.

Scores are kept in log2 units (``q·k * sm_scale * log2(e)``) so the kernels use ``exp2``; the
log-sum-exp a split writes is in the same units, and ``merge.py`` combines with ``exp2`` too.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specdec.attention.kv_dtype import is_fp8

LOG2E = 1.4426950408889634

# a split of the KV list is at least this many entries on a GPU (one 128-entry tile): measured on
# an H100 (benchmarks/bench_attention_splits.py, Llama-3-8B heads), bs 1 decode and verify at
# context 1k-4k are fastest with 8-16 one-tile-or-two splits
MIN_SPLIT_LEN = 128
# split while the grid has fewer programs than this many per SM: at 2 (before), bs 16 verify at
# context 1k ran 27% slower split in three than unsplit (63.8 vs 50.2 µs a layer)
PROGRAMS_PER_SM = 1.5


@triton.jit
def mma(a, b, acc, DOT_PRECISION: tl.constexpr):
    """``a @ b (+ acc)`` in fp32; "upcast" multiplies in fp32 (the interpreter's bf16 dot is wrong)."""
    if DOT_PRECISION == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif DOT_PRECISION == "ieee":
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def online_softmax_step(qk, v, m_i, l_i, acc, DOT_PRECISION: tl.constexpr, ROW_SUMS_BY_DOT: tl.constexpr):
    """Fold one KV tile into the running (max, sum, acc) of each query row.

    qk [M, N] fp32 log2-scaled scores, -inf where not visible; v [N, D]. A row that has seen
    nothing visible yet keeps m = -inf, l = 0, acc = 0 (``m_safe`` avoids -inf - -inf = nan).

    ``ROW_SUMS_BY_DOT``: each row's sum of the tile's weights is taken by the matrix unit, as the
    product of the weights (rounded to v's dtype, as the value product takes them) with a column of
    ones, instead of ``tl.sum``. A reduction's order follows how Triton lays the tile over its warps
    (along the keys for a 16-row tile, along the rows for a 32-row one), a product's K order does
    not: a row then gets the same bits in a query tile of any height (decode's 16 rows, node groups'
    32 under the streaming plan, where both take it).
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    # NOTE: p is cast to v's dtype where each product takes it; one cast hoisted above the branch reorders the
    # tl.sum path's instructions (its sm_90a PTX then differs from the kernels the GPU tests and A/Bs ran)
    if ROW_SUMS_BY_DOT:
        ones = tl.full([qk.shape[1], 16], 1.0, tl.float32).to(v.dtype)  # [N, 16]: the narrowest product Triton takes
        row_sums = tl.max(mma(p.to(v.dtype), ones, None, DOT_PRECISION), 1)  # 16 equal columns: exact
    else:
        row_sums = tl.sum(p, 1)
    l_i = l_i * alpha + row_sums
    acc = mma(p.to(v.dtype), v, acc * alpha[:, None], DOT_PRECISION)
    return m_new, l_i, acc


# the largest finite fp16: a 16-bit query over an FP8 cache is clamped to it before it narrows to fp16
FP16_MAX = tl.constexpr(65504.0)


@triton.jit
def query_tile(q, K):
    """The query tile ``q`` in the dtype tiles multiply in (``tile_dtype``): the cache's, except over
    an FP8 cache, whose K/V tiles widen on load (``attend_tile``) to fp16 under a 16-bit query and
    to fp32 under an fp32 query. e4m3 widens to fp16 exactly, and sm90 converts pairs of e4m3 to
    fp16 in one instruction but has none to bf16: the draft step's attention over an FP8 cache (8B
    head, bs 64, context 1 k, H100) took 82 µs widened to bf16, 67 to fp16. A bf16 query narrows to
    fp16 without rounding in fp16's normal range (fp16 has more mantissa bits); past its largest
    value it is clamped, under 6e-5 it keeps fewer bits."""
    if K.dtype.element_ty.is_fp8():
        if q.dtype == tl.float32:
            return q
        else:
            return tl.clamp(q.to(tl.float32), -FP16_MAX, FP16_MAX).to(tl.float16)
    else:
        return q.to(K.dtype.element_ty)


@triton.jit
def attend_tile(q, K, V, slot, n_valid, visible, kv_head, stride_ks, stride_kh, stride_vs, stride_vh, offs_d,
                d_valid, sm_scale_log2, m_i, l_i, acc, DOT_PRECISION: tl.constexpr, ROW_SUMS_BY_DOT: tl.constexpr):
    """Fold one tile of KV entries into each query row's running softmax.

    q [M, D] as ``query_tile`` gives it (K and V tiles are cast to its dtype: a no-op but over an
    FP8 cache); ``slot`` [N] int64 the entries' cache slots, ``n_valid`` [N] which are real,
    ``visible`` [M, N] which rows see which. NOTE: slot * stride overflows int32 past
    2^31 / (num_kv_heads * head_dim) slots, hence int64 slots.
    """
    k, v = load_kv_tile(K, V, slot, n_valid, kv_head, stride_ks, stride_kh, stride_vs, stride_vh, offs_d, d_valid)
    return fold_tile(q, k, v, visible, sm_scale_log2, m_i, l_i, acc, DOT_PRECISION, ROW_SUMS_BY_DOT)


@triton.jit
def load_kv_tile(K, V, slot, n_valid, kv_head, stride_ks, stride_kh, stride_vs, stride_vh, offs_d, d_valid):
    """A tile's keys [D, N] and values [N, D] in the cache's dtype (0 where not ``n_valid``)."""
    k = tl.load(K + slot[None, :] * stride_ks + kv_head * stride_kh + offs_d[:, None],
                mask=n_valid[None, :] & d_valid[:, None], other=0.0)
    v = tl.load(V + slot[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :],
                mask=n_valid[:, None] & d_valid[None, :], other=0.0)
    return k, v


@triton.jit
def fold_tile(q, k, v, visible, sm_scale_log2, m_i, l_i, acc, DOT_PRECISION: tl.constexpr,
              ROW_SUMS_BY_DOT: tl.constexpr):
    """``attend_tile``'s arithmetic over loaded tiles (``load_kv_tile``), cast to the query's dtype:
    several query tiles can share one load and each get what ``attend_tile`` gives it."""
    qk = mma(q, k.to(q.dtype), None, DOT_PRECISION) * sm_scale_log2  # [M, N]
    qk = tl.where(visible, qk, float("-inf"))
    return online_softmax_step(qk, v.to(q.dtype), m_i, l_i, acc, DOT_PRECISION, ROW_SUMS_BY_DOT)


@triton.jit
def store_rows(acc, m_i, l_i, o_ptrs, lse_ptrs, o_mask, row_mask, DIRECT: tl.constexpr):
    """Write normalised rows: straight to the output (DIRECT), or as a split's partial + lse."""
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    if DIRECT:
        tl.store(o_ptrs, out.to(o_ptrs.dtype.element_ty), mask=o_mask)
    else:
        tl.store(o_ptrs, out, mask=o_mask)
        tl.store(lse_ptrs, tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf")), mask=row_mask)


@triton.jit
def _probe():
    """Never launched: how ``@triton.jit`` built this package's kernels (interpreted or compiled)."""
    pass


def triton_can_run_on(device: torch.device) -> bool:
    """CUDA always; CPU tensors only when the kernels were built by the interpreter."""
    if device.type == "cuda":
        return True
    # NOTE: TRITON_INTERPRET is read when @triton.jit runs (module import), not at launch, and
    # every kernel module of this package imports this one, so they were all built alike.
    return type(_probe).__name__ == "InterpretedFunction"


def check_device(device: torch.device) -> None:
    if not triton_can_run_on(device):
        raise RuntimeError(
            f"the triton backend needs a CUDA device (or TRITON_INTERPRET=1); got tensors on {device}"
        )


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 6  # the interpreter: few programs are fastest, but keep some parallel shape
    return torch.cuda.get_device_properties(device).multi_processor_count


class LaunchConfig(NamedTuple):
    block_n: int  # KV entries per tile
    num_warps: int
    num_stages: int


# shared memory a config may plan for (an H100 SM has 228 KiB; leave room for the compiler)
SMEM_BUDGET = 180 * 1024


def launch_config(device: torch.device, *, block_m: int, head_dim: int, elem_size: int,
                  streaming: bool = False) -> LaunchConfig:
    """Tile and pipeline of a kernel whose tiles are [block_m, head_dim] queries x block_n KV entries.

    Measured on an H100 (bf16, Llama-3-8B heads, CUDA-graph replay): 128-entry KV tiles with 3
    pipeline stages beat 64 x 2 by 1.1-2x for decode and verify; 8 warps pay off from 128 rows.
    ``streaming`` (an unsplit decode grid of STREAM_PROGRAMS_PER_SM programs an SM or more): 64-entry
    tiles, 2 warps, 3 stages. Stages, then tile width, shrink until the K and V buffers fit
    SMEM_BUDGET (fp32, head_dim 256).
    NOTE: on CPU (the interpreter) tiles are small so tiny tests still loop over several tiles.
    """
    if device.type != "cuda":
        return LaunchConfig(block_n=16, num_warps=4, num_stages=1)
    d = triton.next_power_of_2(head_dim)
    block_n, stages = (64, 3) if streaming else (128, 3)
    while stages * 2 * block_n * d * elem_size + block_m * d * elem_size > SMEM_BUDGET:
        if stages > 2:
            stages -= 1
        elif block_n > 16:
            block_n //= 2
        else:
            break
    warps = 2 if streaming else 8 if block_m >= 128 else 4
    return LaunchConfig(block_n=block_n, num_warps=warps, num_stages=stages)


# a decode grid of this many programs an SM, unsplit, streams its KV through small tiles
# (``launch_config(streaming=True)``). Measured on an H100 (Llama-3-8B heads, bf16, one layer, CUDA-graph
# replay, µs; 128 x 2 stages x 4 warps -> 64 x 3 x 2): bs 64 at context 1 k 101.0 -> 97.4, bs 128
# 194.3 -> 187.7, bs 64 at 4 k 359.4 -> 359.2; bs 32 (1.9 programs an SM) 53.4 against 53.7, so it
# keeps the default (benchmarks/results/2026-11-26-h100-attention-tiles). On an H200, 64 x 3 at 4 warps
# (decode and node-group verify alike) made 8B steps 2-6 % longer at bs 64-128
# (benchmarks/results/2026-12-01-h200-verify-profile).
STREAM_PROGRAMS_PER_SM = 3


# a query tile of more (query row, head) rows than this never streams (``is_streaming_grid``). Measured
# on an H100 (Llama-3-8B heads, bf16, one layer, CUDA-graph replay, µs; 128 x 4 warps -> 64 x 2 warps):
# the chain's verify (4 nodes, 16 rows) at context 1 k, bs 64 100.3 -> 98.4, bs 128 195.2 -> 192.1; at
# 4 k, bs 64 368.0 -> 365.4; 5x4x8's (8 nodes, 32 rows) at bs 64 104.8 -> 101.8; bs 32 (two programs an
# SM) 52.6 -> 57.5, so it keeps the default (benchmarks/results/2026-11-26-h100-adaptive/0272f8e/verify-streaming/)
STREAMING_MAX_ROWS = 32


def is_streaming_grid(device: torch.device, num_ctas: int, num_splits: int, *, block_m: int | None = None) -> bool:
    """Whether an unsplit grid of ``num_ctas`` programs (of ``block_m``-row query tiles, at most
    STREAMING_MAX_ROWS; None: a decode grid) runs ``launch_config(streaming=True)``."""
    return (device.type == "cuda" and num_splits == 1 and (block_m is None or block_m <= STREAMING_MAX_ROWS)
            and num_ctas >= STREAM_PROGRAMS_PER_SM * _sm_count(device))


def widest_kv_tile(device: torch.device) -> int:
    """A multiple of every ``launch_config`` KV tile width (powers of two up to it) on ``device``."""
    return 128 if device.type == "cuda" else 16


def max_block_m(device: torch.device) -> int:
    """Most (query row, head) pairs per extend tile: 128 on a GPU, 32 in the interpreter."""
    return 128 if device.type == "cuda" else 32


# tree verify at bs 1-2 over a short prefix: 64-row tiles (see extend_block_m)
SMALL_GRID_BLOCK_M = 64
SMALL_GRID_MAX_PREFIX = 2048


def extend_block_m(device: torch.device, *, rows: int, num_seqs: int, num_kv_heads: int, max_prefix_len: int) -> int:
    """(query row, head) pairs per extend tile for sequences of up to ``rows`` such pairs per KV head.

    As many as fit (up to ``max_block_m``), except for a grid so small that even at
    SMALL_GRID_BLOCK_M rows a tile it fills at most a third of the SMs (``plan_extend_splits``
    then gives the new tokens a split of their own) over prefixes of at most
    SMALL_GRID_MAX_PREFIX entries: there two 64-row tiles a program beat one 128-row tile.
    Measured on an H100 (Llama-3-8B heads, bf16, one layer, CUDA-graph replay, µs; tree nodes x
    4 heads = rows): 32 nodes at bs 1, ctx 1 k, 19.1 -> 16.4; 48 nodes 21.5 -> 19.4; 64 nodes
    23.7 -> 21.5; 32 nodes at bs 2 22.9 -> 21.1. Not taken where it lost or tied: bs 4 (34.0 ->
    43.9: the grid no longer small), ctx 4 k (64 nodes at bs 1 36.8 -> 43.5: fewer, longer prefix
    splits) (benchmarks/results/2026-11-26-h100-wide-verify).
    """
    block_m = max(16, min(max_block_m(device), triton.next_power_of_2(max(1, rows))))
    if device.type != "cuda" or block_m <= SMALL_GRID_BLOCK_M or max_prefix_len > SMALL_GRID_MAX_PREFIX:
        return block_m
    small_ctas = num_seqs * num_kv_heads * triton.cdiv(rows, SMALL_GRID_BLOCK_M)
    return SMALL_GRID_BLOCK_M if 3 * small_ctas <= _sm_count(device) else block_m


def tile_dtype(q_dtype: torch.dtype, kv_dtype: torch.dtype) -> torch.dtype:
    """The dtype attention tiles multiply in (``query_tile``): the cache's, or over an FP8 cache fp16
    (fp32 under an fp32 query)."""
    if not is_fp8(kv_dtype):
        return kv_dtype
    return torch.float32 if q_dtype == torch.float32 else torch.float16


def dot_precision(dtype: torch.dtype, device: torch.device) -> str:
    """How ``mma`` multiplies tiles of ``dtype`` (``tile_dtype``); products are accumulated in fp32
    either way.

    NOTE: fp32 inputs would otherwise use TF32 on the GPU (~1e-3 relative error), and the
    interpreter (CPU) computes bf16 ``tl.dot`` wrongly (triton 3.9) and fp16 ones in fp16, so there
    16-bit tiles are upcast first: the products of 16-bit values are exact in fp32, so the result
    matches a 16-bit MMA accumulating in fp32.
    """
    if dtype == torch.float32:
        return "ieee"
    if dtype in (torch.bfloat16, torch.float16) and device.type != "cuda":
        return "upcast"
    return "native"


@triton.jit
def split_chunk(length, num_splits, TILE: tl.constexpr):
    """A sequence's chunk per split: ``length`` entries over ``num_splits`` splits, whole tiles."""
    return tl.cdiv(tl.cdiv(length, num_splits), TILE) * TILE


# a decode row folds its list's last DECODE_TAIL entries as one tile of their own, after the tiles its splits cut
# from the entries before them (``decode_ranges``). A verify node of depth < DECODE_TAIL (any node of a tree of
# up to DECODE_TAIL nodes) then has its ancestors and itself in that tile alone, and every tile before it inside
# its request's prefix, which the request's nodes read once for all (``verify_rows.py``'s node groups)
DECODE_TAIL = 16


@triton.jit
def decode_ranges(kv_len, win_lo, split, num_splits, BLOCK_N: tl.constexpr, TAIL: tl.constexpr):
    """A decode row's part in ``split`` of its entries [win_lo, kv_len): the body's [lo, hi) (the body,
    [win_lo, tail_lo), cut over the splits in whole tiles, ``split_chunk``), the tail's start ``tail_lo``
    (``kv_len - TAIL``, or ``win_lo``) and whether this split folds the tail after its body part (the last
    split with body entries; split 0 when there are none). Scalars, or [rows] vectors for rows of their own
    lengths."""
    tail_lo = tl.maximum(kv_len - TAIL, win_lo)
    body = tail_lo - win_lo
    chunk = split_chunk(body, num_splits, BLOCK_N)
    lo = win_lo + split * chunk
    hi = tl.minimum(lo + chunk, tail_lo)
    tail_split = tl.where(body > 0, tl.cdiv(body, tl.maximum(chunk, 1)) - 1, 0)
    return lo, hi, tail_lo, split == tail_split


def plan_num_splits(
    num_ctas: int, split_len: int, *, device: torch.device, tile: int, num_splits: int | None = None
) -> tuple[int, int]:
    """(num_splits, chunk_len): cut a KV range of up to ``split_len`` entries into chunks (the
    kernels then cut each sequence's own range into ``num_splits`` chunks, ``split_chunk``: for one of
    ``split_len`` entries that is ``chunk_len``).

    Without a forced ``num_splits``, split only while the grid (``num_ctas`` programs before
    splitting) has fewer than PROGRAMS_PER_SM programs per SM, and keep chunks >= MIN_SPLIT_LEN
    entries.
    ``chunk_len`` is a multiple of ``tile``; the returned count is what that chunk length needs.
    """
    if split_len <= 0:
        return 1, tile
    if num_splits is None:
        target = math.ceil(PROGRAMS_PER_SM * _sm_count(device))
        num_splits = 1
        if num_ctas < target:
            num_splits = min(math.ceil(target / max(num_ctas, 1)), max(1, split_len // MIN_SPLIT_LEN))
    chunk = math.ceil(math.ceil(split_len / max(num_splits, 1)) / tile) * tile
    return math.ceil(split_len / chunk), chunk


# the new-token block of an extend gets a split of its own only from this many (query row, head) rows:
# a tree of 16+ nodes under 4-way GQA. Chains (4 nodes, 16 rows) lost by it in whole H100 steps.
NEW_SPLIT_MIN_ROWS = 64


def plan_extend_splits(
    num_ctas: int, prefix_len: int, new_rows: int, *, device: torch.device, tile: int, block_m: int = 0,
    num_splits: int | None = None, new_split: bool | None = None,
) -> tuple[int, int, bool]:
    """(prefix splits, chunk_len, new_split) of an extend whose grid has ``num_ctas`` programs of
    ``block_m`` rows before splitting, whose prefixes are up to ``prefix_len`` entries and whose new
    blocks up to ``new_rows`` (query row, head) rows.

    ``new_split`` None decides: a grid of at most a third of the SMs with a block of at least
    NEW_SPLIT_MIN_ROWS rows (tree verify at small batch) runs the new block in a split of its own
    and cuts the prefix so that all its programs fit one wave; otherwise (or False) the new block
    runs after the prefix's last chunk, and the prefix is cut by ``plan_num_splits``, except for
    full tiles (``max_block_m`` rows), whose prefix is cut only as far as all the programs fit one
    wave: bs 8, 64 tree nodes (two 128-row tiles a KV head, 128 programs) took 76 µs a layer in
    two splits against 62 in one at context 512, 236 against 165 at 4 k.
    Measured on an H100 (Llama-3-8B heads, bf16; benchmarks/results/2026-11-26-h100-verify-attention),
    verify of 32 tree nodes inside the 8B decode step, µs a layer: 19.4 -> 16.6 at bs 1 and
    36.6 -> 25.1 at bs 4 (context 1 k). The chain's 4 nodes lost at bs 4 (12.9 -> 15.0: fewer,
    longer prefix chunks), hence the row threshold.
    """
    sms = _sm_count(device)
    if new_split is None:
        new_split = (num_splits is None and 3 * num_ctas <= sms and new_rows >= NEW_SPLIT_MIN_ROWS
                     and prefix_len >= 2 * MIN_SPLIT_LEN)
    if num_splits is None and (new_split or block_m >= max_block_m(device)):
        one_wave = sms // max(num_ctas, 1) - int(bool(new_split))
        num_splits = max(1, min(one_wave, prefix_len // MIN_SPLIT_LEN))
    splits, chunk = plan_num_splits(num_ctas, prefix_len, device=device, tile=tile, num_splits=num_splits)
    return splits, chunk, new_split and splits > 1


# the kernels' window argument of a layer without one: past any position, so ``position - window`` < 0
NO_WINDOW = 1 << 30


def window_arg(window: int | None) -> int:
    """A layer's sliding window as the kernels take it: keys a query sees, itself included (a key at
    position p is visible from position q iff ``p > q - window``); NO_WINDOW for a global layer.

    NOTE: the kernels declare it ``do_not_specialize``: Triton would otherwise compile a variant for
    a window of 1 and one for windows divisible by 16.
    """
    if window is None:
        return NO_WINDOW
    if not 1 <= window <= NO_WINDOW:
        raise ValueError(f"window={window}: expected 1..{NO_WINDOW} or None")
    return window


def window_span(length: int, window: int | None) -> int:
    """Entries of a range of ``length`` that one windowed query can see: what split plans are sized by
    (a local layer's long context is cut into as many splits as its window, not as the context)."""
    return length if window is None else min(length, window)


def head_dim_block(head_dim: int) -> int:
    """Tile width over the head dimension: a power of two, masked past ``head_dim``.

    NOTE: at least 16, since ``tl.dot`` needs K >= 16 on GPUs (head_dim 8 models like stories260K).
    """
    return max(16, triton.next_power_of_2(head_dim))
