"""Triton ``simulate_target_predict``: one program per request, its N nodes as one vector.

First every node's rank among its siblings: K rounds, each storing rank r at every node's r-th child
and hopping to the next sibling. Those stores scatter, so they go to the request's output row
(written again at the end), and barriers order them before the loads, the loads before the final
stores. Then per node: the position
hash (int64 arithmetic masked to 32 bits, so it equals the reference bit for bit), the drawn rank
(K compares against the cdf row of its depth and own rank, the request's own where the cdf
has a batch axis), then at most K - 1 sibling hops, each
a gather from the request's link row; the result is the drawn child's token or the argmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.position_hash import HASH_POSITION, HASH_ROUNDS, HASH_ROW, seed_term
from specdec.kernels.triton._common import custom_op, next_pow2

(_SHIFT1, _MULT1), (_SHIFT2, _MULT2) = HASH_ROUNDS


@triton.jit
def _simulate_kernel(cand_ptr, argmax_ptr, pos_ptr, seq_lens_ptr, next_token_ptr, next_sibling_ptr, cdf_ptr,
                     out_ptr, n, cdf_batch_stride, depths, parent_ranks, k, seed_key,
                     HASH_POSITION: tl.constexpr, HASH_ROW: tl.constexpr, SHIFT1: tl.constexpr,
                     MULT1: tl.constexpr, SHIFT2: tl.constexpr, MULT2: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    t = tl.arange(0, BLOCK_N)
    node = t < n
    row = b * n
    pos = tl.load(pos_ptr + row + t, mask=node, other=0)  # int64
    depth = tl.minimum(tl.maximum(pos - tl.load(seq_lens_ptr + b), 0), depths - 1)
    first_child = tl.load(next_token_ptr + row + t, mask=node, other=-1)
    tl.store(out_ptr + row + t, tl.zeros([BLOCK_N], dtype=tl.int64), mask=node)  # the root's rank: 0
    tl.debug_barrier()
    child = first_child
    for r in range(k):
        has = node & (child >= 0)
        tl.store(out_ptr + row + child, tl.full([BLOCK_N], r, tl.int64), mask=has)
        child = tl.load(next_sibling_ptr + row + tl.maximum(child, 0), mask=has, other=-1)
    tl.debug_barrier()
    own_rank = tl.minimum(tl.load(out_ptr + row + t, mask=node, other=0), parent_ranks - 1)
    cdf_row = cdf_ptr + b * cdf_batch_stride + (depth * parent_ranks + own_rank) * k
    x = (pos * HASH_POSITION + b * HASH_ROW + seed_key) & 0xFFFFFFFF
    x = ((x ^ (x >> SHIFT1)) * MULT1) & 0xFFFFFFFF
    x = ((x ^ (x >> SHIFT2)) * MULT2) & 0xFFFFFFFF
    x = x ^ (x >> 16)
    u = (x >> 8).to(tl.float32) / 16777216.0  # [BLOCK_N] in [0, 1)
    rank = tl.zeros([BLOCK_N], dtype=tl.int32)
    for r in range(k):
        rank += (tl.load(cdf_row + r, mask=node, other=2.0) <= u).to(tl.int32)
    child = first_child
    for r in range(k - 1):
        sibling = tl.load(next_sibling_ptr + row + tl.maximum(child, 0), mask=node, other=-1)
        child = tl.where((rank > r) & (child >= 0), sibling, child)
    drawn = (child >= 0) & (rank < k)
    token = tl.load(cand_ptr + row + tl.maximum(child, 0), mask=node, other=0)
    fallback = tl.load(argmax_ptr + row + t, mask=node, other=0)
    tl.debug_barrier()  # every rank read before the row is overwritten
    tl.store(out_ptr + row + t, tl.where(drawn, token, fallback), mask=node)


@custom_op("simulate_target_predict", ("target_predict",))
def _simulate_op(candidates: torch.Tensor, argmax: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor,
                 retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor, cdf: torch.Tensor,
                 target_predict: torch.Tensor, seed: int) -> None:
    bs, n = candidates.shape
    if bs and n:
        _simulate_kernel[(bs,)](
            candidates, argmax, positions, seq_lens, retrive_next_token, retrive_next_sibling, cdf, target_predict,
            n, cdf.stride(0) if cdf.dim() == 4 else 0, *cdf.shape[-3:], seed_term(seed),  # batch stride 0: shared
            HASH_POSITION=HASH_POSITION, HASH_ROW=HASH_ROW, SHIFT1=_SHIFT1, MULT1=_MULT1, SHIFT2=_SHIFT2, MULT2=_MULT2,
            BLOCK_N=next_pow2(n))


def simulate_target_predict(candidates, argmax, positions, seq_lens, retrive_next_token, retrive_next_sibling, cdf,
                            target_predict, *, seed: int) -> None:
    _simulate_op(candidates, argmax, positions, seq_lens, retrive_next_token, retrive_next_sibling, cdf,
                 target_predict, seed)


IMPLS = {"simulate_target_predict": simulate_target_predict}
