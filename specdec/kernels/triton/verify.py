"""Triton ``verify_tree_greedy`` and ``tree_speculative_sampling_target_only``.

The walk: one program per request, like sgl_kernel (one thread per request). Per step it collects
the current node's children in link order (a short chain of cached loads), then gathers their
tokens (and, sampling, their target probs) in one vector load each, so a step costs one memory
round trip however many children there are. Every loop is bounded: at most num_spec - 1 accepted
nodes, at most N - 1 children per node, and each link is range-checked before it is followed, so a
malformed tree stops the walk with an error code (``error_flag[b] = code + 16 * node``,
``_WALK_ERRORS``) instead of hanging. A bad link or token only counts where the ref reads it.

The bonus draw (sampling) is ``specdec.kernels.residual.residual_draw_ref``: integer weights, so
any summation order is exact, and the vocab can be split over many programs. Two launches:

    walk   [bs]               per request -> scratch[b, 0:4]: the [bs * N, vocab] row of its last
                              node (-1 on error), whether p applies, the bonus's predicts index, and
                              a zeroed ticket counter
    draw   [vocab/BLOCK, bs]  program (j, b): weight sums of block j of row b (residual and fallback)
                              -> scratch[b, 4 + j], [4 + nb + j]; then it takes a ticket, and the
                              row's last program picks the token: block weights -> threshold ->
                              the block holding it (cumsum over blocks) -> the token (cumsum inside)

Memory: each request's q and p rows are read once (the floor: 2 * vocab * 4 bytes per request) and
one BLOCK of each again by the picker, 1.6% more at vocab 128256; the sums stream at copy bandwidth
(thousands of programs of 16 KB in flight; 128-bit loads when vocab % 16 == 0). The fixed cost is the
walk (a few dependent memory round trips per accepted node) and the picker's tail (two more), a
few µs in all: at vocab 128256 on an H100 (floor 22 µs at bs 64, 89 µs at bs 256) that predicts
about 1.2x-1.3x the floor in device time at bs 64 and 1.1x at bs 256, plus the graph or eager
launch latency on top (5-10 µs), which dominates at small bs.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from specdec.kernels.residual import COIN_BITS, FIXED_POINT_BITS
from specdec.kernels.triton._common import custom_op, error_flag_for, next_pow2, raise_on_cpu

DRAW_BLOCK = 2048  # tokens per program of the draw's block sums (16 KB of q and p): a tuning knob
_W_SCALE = tl.constexpr(float(2**FIXED_POINT_BITS))
_COIN_SCALE = tl.constexpr(float(2**COIN_BITS))
_COIN_BITS = tl.constexpr(COIN_BITS)
_COIN_MASK = tl.constexpr(2**COIN_BITS - 1)

_WALK_ERRORS = {
    1: "has retrive_next_token outside [-1, N)",
    2: "has retrive_next_sibling outside [-1, N)",
    3: "has a sibling cycle",
    4: "has retrive_index outside [0, bs*N)",
}
_TOKEN_ERROR = 5


@triton.jit
def _scan_children(
    candidates_ptr, next_sibling_ptr, row, n, node, child, target_tok, coin, q_row_ptr, d_row_ptr, vocab,
    th_single, th_acc, SAMPLING: tl.constexpr, NP: tl.constexpr,
):
    """The ref's scan of ``node``'s children (``child``, then its siblings); returns (accepted child
    or -1, its token, error code). Sampling writes the rejected children's draft_probs."""
    lane = tl.arange(0, NP)
    chain = tl.zeros([NP], tl.int64)  # the children in link order, lanes [0, m)
    m = tl.zeros([], tl.int32)
    link_err = tl.zeros([], tl.int32)  # raised only if all m children are rejected
    c = child
    while (c != -1) & (m < n - 1):  # a node has at most N - 1 children
        chain = tl.where(lane == m, c, chain)
        m += 1
        nxt = tl.load(next_sibling_ptr + row + c)
        bad = (nxt < -1) | (nxt >= n)
        link_err = tl.where(bad, 2 + 16 * c.to(tl.int32), 0)
        c = tl.where(bad, -1, nxt)
    link_err = tl.where(c != -1, 3 + 16 * node.to(tl.int32), link_err)  # more links after N - 1 children
    valid = lane < m
    toks = tl.load(candidates_ptr + row + chain, mask=valid, other=-1)
    if SAMPLING:
        tok_ok = (toks >= 0) & (toks < vocab)
        q = tl.load(q_row_ptr + toks, mask=valid & tok_ok, other=0.0)
        acc = tl.zeros([NP], tl.float32)
        run = tl.zeros([], tl.float32)
        for i in range(m):  # NOTE: the ref's order: a sequential fp32 sum (one-hot tl.sum is exact)
            run = run + tl.sum(tl.where(lane == i, q, 0.0), 0)
            acc = tl.where(lane == i, run, acc)
        hit = valid & tok_ok & ((coin <= tl.math.div_rn(acc, th_acc)) | (q >= th_single))
        first_bad = tl.min(tl.where(valid & ~tok_ok, lane, NP), 0)
    else:
        hit = valid & (toks == target_tok)
        first_bad = tl.full([], NP, tl.int32)
    first_hit = tl.min(tl.where(hit, lane, NP), 0)
    if SAMPLING:
        tl.store(d_row_ptr + toks, q, mask=valid & (lane < tl.minimum(first_hit, first_bad)))  # rejected
    found = tl.where(first_hit < first_bad, tl.sum(tl.where(lane == first_hit, chain, 0), 0), -1)
    tok = tl.sum(tl.where(lane == first_hit, toks, 0), 0)
    bad_node = tl.sum(tl.where(lane == first_bad, chain, 0), 0).to(tl.int32)
    err = tl.where(first_bad < first_hit, 5 + 16 * bad_node, tl.where(first_hit == NP, link_err, 0))
    return found, tok, err


# NOTE: no value specialization of the sizes: triton 3.6 crashes (TritonGPUCoalesce) compiling the
# variant where num_spec or n equals 1 (a root-only walk), which the random-tree tests produce.
@triton.jit(do_not_specialize=["n", "num_spec", "vocab"])
def _walk_kernel(
    predicts_ptr, accept_index_ptr, accept_num_ptr, candidates_ptr, rindex_ptr, next_token_ptr,
    next_sibling_ptr, target_predict_ptr, coins_ptr, target_probs_ptr, draft_probs_ptr, scratch_ptr,
    error_ptr, n, num_spec, vocab, scratch_stride, th_single, th_acc,
    SAMPLING: tl.constexpr, NP: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row = b * n
    total = tl.num_programs(0).to(tl.int64) * n
    g = tl.load(rindex_ptr + row)
    err = tl.where((g < 0) | (g >= total), 4, 0)
    last = tl.where(err == 0, g, 0)  # global index of the current node
    node = row * 0  # local index of the current node
    num_accepted = tl.zeros([], tl.int32)
    tl.store(accept_index_ptr + b * num_spec, last.to(tl.int32), mask=err == 0)
    go = (err == 0) & (num_spec > 1)
    while go:
        child = tl.load(next_token_ptr + row + node)
        bad = (child < -1) | (child >= n)
        if SAMPLING:
            coin = tl.load(coins_ptr + row + node)
            target_tok = -1
        else:
            coin = 0.0
            target_tok = tl.load(target_predict_ptr + last)
        found, tok, err = _scan_children(
            candidates_ptr, next_sibling_ptr, row, n, node, tl.where(bad, -1, child), target_tok, coin,
            target_probs_ptr + (row + node) * vocab, draft_probs_ptr + (row + node) * vocab, vocab,
            th_single, th_acc, SAMPLING, NP,
        )
        err = tl.where(bad, 1 + 16 * node.to(tl.int32), err)
        accept = found != -1
        tl.store(predicts_ptr + last, tok.to(tl.int32), mask=accept)
        g = tl.load(rindex_ptr + row + tl.where(accept, found, 0), mask=accept, other=0)
        g_bad = accept & ((g < 0) | (g >= total))
        err = tl.where(g_bad, 4 + 16 * found.to(tl.int32), err)
        accept = accept & ~g_bad
        num_accepted += accept.to(tl.int32)
        tl.store(accept_index_ptr + b * num_spec + num_accepted, g.to(tl.int32), mask=accept)
        last = tl.where(accept, g, last)
        node = tl.where(accept, found, node)
        go = accept & (num_accepted < num_spec - 1)
    tl.store(accept_num_ptr + b, num_accepted)
    tl.store(error_ptr + b, err)
    if SAMPLING:  # the draw kernels take it from here
        state = scratch_ptr + b * scratch_stride
        tl.store(state, tl.where(err == 0, row + node, -1))  # row of q and p in [bs * N, vocab]
        tl.store(state + 1, (num_accepted < num_spec - 1).to(tl.int64))  # p applies (not a full path)
        tl.store(state + 2, last)  # predicts index of the bonus
        tl.store(state + 3, 0)  # the draw's ticket counter
    else:
        bonus = tl.load(target_predict_ptr + last)
        tl.store(predicts_ptr + last, bonus.to(tl.int32), mask=err == 0)


@triton.jit
def _weights(d):
    """``residual_weights``: floor(min(d, 1) * 2**40) where d > 0, else 0 (int64)."""
    return tl.where(d > 0, (tl.minimum(d, 1.0) * _W_SCALE).to(tl.int64), 0)


@triton.jit
def _draw_kernel(
    out_ptr, q_ptr, p_ptr, coins_ptr, scratch_ptr, vocab, nb, scratch_stride,
    BLOCK: tl.constexpr, NBP: tl.constexpr,
):
    """Program (j, b): the weight sums of block j of request b's row; the row's last program to
    finish (by ticket) picks the token."""
    blk = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    state = scratch_ptr + b * scratch_stride
    row = tl.load(state)
    use_p = tl.load(state + 1) != 0
    q_len = tl.where(row >= 0, vocab, 0)  # NOTE: lengths, not scalar & vector masks (the interpreter)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    base = tl.maximum(row, 0) * vocab
    q = tl.load(q_ptr + base + offs, mask=offs < q_len, other=0.0)
    p = tl.load(p_ptr + base + offs, mask=offs < tl.where(use_p, q_len, 0), other=0.0)
    tl.store(state + 4 + blk, tl.sum(_weights(q - p), 0))
    tl.store(state + 4 + nb + blk, tl.sum(_weights(q), 0))
    # NOTE: acq_rel: this program's sums (stored by the thread that takes the ticket) are visible to
    # the program that takes the last ticket, which reads them from L2 (.cg) after its own acquire.
    ticket = tl.atomic_add(state + 3, 1, sem="acq_rel")
    if ticket == nb - 1:
        _pick(out_ptr, q_ptr, p_ptr, tl.load(coins_ptr + b), state, row, use_p, vocab, nb, BLOCK, NBP)


@triton.jit
def _pick(out_ptr, q_ptr, p_ptr, coin, state, row, use_p, vocab, nb, BLOCK: tl.constexpr, NBP: tl.constexpr):
    """The token: total and threshold from the block sums, the block whose cumulative weight first
    exceeds the threshold, then the token inside that block (``residual_draw_ref`` exactly)."""
    k = tl.arange(0, NBP)
    sums_r = tl.load(state + 4 + k, mask=k < nb, other=0, cache_modifier=".cg")
    sums_q = tl.load(state + 4 + nb + k, mask=k < nb, other=0, cache_modifier=".cg")
    use_r = tl.sum(sums_r, 0) > 0  # else the fallback: weights of q alone
    w = tl.where(use_r, sums_r, sums_q)  # [NBP] block weights
    total = tl.sum(w, 0)
    coin = tl.minimum(tl.maximum(coin, 0.0), 1.0)
    u24 = tl.minimum((coin * _COIN_SCALE).to(tl.int64), _COIN_MASK)
    t = (total >> _COIN_BITS) * u24 + (((total & _COIN_MASK) * u24) >> _COIN_BITS)  # coin_threshold
    cum = tl.cumsum(w, 0)
    blk = tl.min(tl.where(cum > t, k, NBP), 0)  # the block holding the first prefix above t
    start = tl.sum(tl.where(k == blk, cum - w, 0), 0)  # weight before that block
    q_len = tl.where((row >= 0) & (total > 0), vocab, 0)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    base = tl.maximum(row, 0) * vocab
    q = tl.load(q_ptr + base + offs, mask=offs < q_len, other=0.0)
    p = tl.load(p_ptr + base + offs, mask=offs < tl.where(use_p & use_r, q_len, 0), other=0.0)
    prefix = start + tl.cumsum(_weights(q - p), 0)
    token = tl.min(tl.where((offs < q_len) & (prefix > t), offs, vocab - 1), 0)
    token = tl.where(total > 0, token, vocab - 1)
    tl.store(out_ptr + tl.load(state + 2), token.to(out_ptr.dtype.element_ty), mask=row >= 0)


@functools.lru_cache(maxsize=None)
def _draw_shape(vocab: int) -> tuple[int, int, int]:
    """(BLOCK, number of blocks, that number rounded up to a power of two) for a vocab size."""
    block = min(DRAW_BLOCK, next_pow2(vocab))
    nb = -(-vocab // block)
    return block, nb, next_pow2(nb)


def _scratch(bs: int, vocab: int, device: torch.device) -> torch.Tensor:
    """[bs, 4 + 2 * nb] int64 per request: q/p row (-1: skip), p applies, bonus index, ticket, then
    the block sums of the residual weights and of the fallback's (q alone)."""
    if bs > 65535:
        raise ValueError(f"the bonus draw supports at most 65535 requests, got {bs}")  # grid dim 1
    return torch.empty(bs, 4 + 2 * _draw_shape(vocab)[1], dtype=torch.int64, device=device)


def _launch_draw(out, q, p, coins, scratch, vocab) -> None:
    """The bonus draw of every request whose state (row, p applies, bonus index, ticket 0) is in
    ``scratch``; writes ``out[bonus index]``."""
    block, nb, nbp = _draw_shape(vocab)
    _draw_kernel[(nb, scratch.shape[0])](out, q, p, coins, scratch, vocab, nb, scratch.shape[1], BLOCK=block,
                                         NBP=nbp, num_warps=4)


def residual_draw(q: torch.Tensor, p: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """Triton ``residual_draw_ref`` over [bs, V] fp32 rows (contiguous, same device); [bs] int64."""
    bs, vocab = q.shape
    out = torch.full((bs,), -1, dtype=torch.int64, device=q.device)
    if bs:
        scratch = _scratch(bs, vocab, q.device)
        rows = torch.arange(bs, device=q.device)
        scratch[:, 0], scratch[:, 1], scratch[:, 2], scratch[:, 3] = rows, 1, rows, 0
        _launch_draw(out, q, p, coins, scratch, vocab)
    return out


@custom_op("verify_tree_greedy", ("predicts", "accept_index", "accept_token_num", "error_flag"))
def _verify_greedy_op(
    predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor, candidates: torch.Tensor,
    retrive_index: torch.Tensor, retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor, error_flag: torch.Tensor,
) -> None:
    bs, n = candidates.shape
    if bs == 0:
        return
    unused = target_predict  # the sampling-only pointers are never dereferenced
    _walk_kernel[(bs,)](
        predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
        retrive_next_sibling, target_predict, unused, unused, unused, unused, error_flag, n,
        accept_index.shape[1], 1, 0, 1.0, 1.0, SAMPLING=False, NP=next_pow2(n), num_warps=1,
    )


@custom_op(
    "tree_speculative_sampling_target_only",
    ("predicts", "accept_index", "accept_token_num", "draft_probs", "error_flag"),
)
def _sampling_op(
    predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor, candidates: torch.Tensor,
    retrive_index: torch.Tensor, retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor, uniform_samples_for_final_sampling: torch.Tensor, target_probs: torch.Tensor,
    draft_probs: torch.Tensor, error_flag: torch.Tensor, threshold_single: float, threshold_acc: float,
) -> None:
    bs, n = candidates.shape
    if bs == 0:
        return
    vocab = target_probs.shape[2]
    scratch = _scratch(bs, vocab, candidates.device)
    _walk_kernel[(bs,)](
        predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
        retrive_next_sibling, candidates, uniform_samples, target_probs, draft_probs, scratch, error_flag, n,
        accept_index.shape[1], vocab, scratch.shape[1], threshold_single, threshold_acc,
        SAMPLING=True, NP=next_pow2(n), num_warps=1,
    )
    _launch_draw(predicts, target_probs, draft_probs, uniform_samples_for_final_sampling, scratch, vocab)


def _describe(candidates: torch.Tensor, vocab: int):
    def describe(b: int, code: int) -> str:
        node, kind = code >> 4, code & 15
        if kind == _TOKEN_ERROR:
            tok = int(candidates[b, node])
            return f"candidates: request {b} node {node} has token {tok} outside [0, {vocab})"
        return f"invalid draft tree: request {b} node {node} {_WALK_ERRORS[kind]}"
    return describe


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    *,
    error_flag: torch.Tensor | None = None,  # [bs] int32, 0 = request's links are well formed
) -> None:
    """Triton ``verify_tree_greedy`` (inputs validated by the public op)."""
    flag = error_flag_for(candidates.shape[0], candidates.device, error_flag)
    _verify_greedy_op(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                      retrive_next_sibling, target_predict, flag)
    raise_on_cpu(flag, _describe(candidates, 0))


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
    *,
    error_flag: torch.Tensor | None = None,  # [bs] int32
) -> None:
    """Triton ``tree_speculative_sampling_target_only``; always deterministic (see residual_draw_ref)."""
    flag = error_flag_for(candidates.shape[0], candidates.device, error_flag)
    # NOTE: fp32 like the ref, including its 1e-9 floor on threshold_acc.
    th_single = float(np.float32(threshold_single))
    th_acc = float(np.float32(max(threshold_acc, 1e-9)))
    _sampling_op(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                 retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
                 flag, th_single, th_acc)
    raise_on_cpu(flag, _describe(candidates, target_probs.shape[2]))


IMPLS = {
    "verify_tree_greedy": verify_tree_greedy,
    "tree_speculative_sampling_target_only": tree_speculative_sampling_target_only,
}
