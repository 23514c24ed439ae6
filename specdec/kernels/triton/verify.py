"""Triton ``verify_tree_greedy`` and ``tree_speculative_sampling_target_only``.

One program per request walks its tree with scalar code, like sgl_kernel (one thread per request).
Every loop is bounded: at most num_spec - 1 accepted nodes, at most N - 1 children per node, and
each link is range-checked before it is followed, so a malformed tree stops the walk with an error
code (``error_flag[b] = code + 16 * node``, ``_WALK_ERRORS``) instead of hanging.

The final (bonus) draw follows ``specdec.kernels.residual.residual_draw_ref`` (a fixed fp32 summation order) token
for token; ``_residual_draw`` below is its two-pass lane-parallel form.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from specdec.kernels.triton._common import error_flag_for, raise_on_cpu
from specdec.kernels.residual import LANES, residual_draw_ref  # noqa: F401  (re-exported)

_UNROLL = 8

_WALK_ERRORS = {
    1: "has retrive_next_token outside [-1, N)",
    2: "has retrive_next_sibling outside [-1, N)",
    3: "has a sibling cycle",
    4: "has retrive_index outside [0, bs*N)",
}
_TOKEN_ERROR = 5


@triton.jit
def _walk_step_children(
    candidates_ptr, next_sibling_ptr, row, n, child, err,
    target_tok, coin, q_row_ptr, d_row_ptr, vocab, th_single, th_acc, SAMPLING: tl.constexpr,
):
    """Scan the children of one node from ``child``; returns (accepted child or -1, last child, err)."""
    found = child * 0 - 1
    acc = tl.zeros([], tl.float32)
    for _ in range(n - 1):  # a node has at most N - 1 children
        active = (child != -1) & (found == -1) & (err == 0)
        c = tl.where(active, child, 0)
        tok = tl.load(candidates_ptr + row + c, mask=active, other=-1)
        if SAMPLING:
            tok_bad = active & ((tok < 0) | (tok >= vocab))
            err = tl.where(tok_bad, 5 + 16 * c.to(tl.int32), err)  # 5 = _TOKEN_ERROR
            ok = active & ~tok_bad
            q_tok = tl.load(q_row_ptr + tok, mask=ok, other=0.0)
            acc = tl.where(ok, acc + q_tok, acc)
            accept = ok & ((coin <= tl.math.div_rn(acc, th_acc)) | (q_tok >= th_single))
            reject = ok & ~accept
            tl.store(d_row_ptr + tok, q_tok, mask=reject)
        else:
            accept = active & (tok == target_tok)
            reject = active & (tok != target_tok)
        found = tl.where(accept, child, found)
        nxt = tl.load(next_sibling_ptr + row + c, mask=reject, other=-1)
        bad = reject & ((nxt < -1) | (nxt >= n))
        err = tl.where(bad, 2 + 16 * c.to(tl.int32), err)
        child = tl.where(reject, tl.where(bad, -1, nxt), child)
    return found, child, err


@triton.jit
def _walk_kernel(
    predicts_ptr, accept_index_ptr, accept_num_ptr, candidates_ptr, rindex_ptr, next_token_ptr,
    next_sibling_ptr, target_predict_ptr, coins_ptr, final_coins_ptr, target_probs_ptr, draft_probs_ptr,
    error_ptr, bs, n, num_spec, vocab, th_single, th_acc,
    SAMPLING: tl.constexpr, LANES: tl.constexpr, UNROLL: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row = b * n
    total = bs * n
    g = tl.load(rindex_ptr + row)
    err = tl.where((g < 0) | (g >= total), 4, 0)
    last = tl.where(err == 0, g, 0)  # global index of the current node
    node = row * 0  # local index of the current node
    num_accepted = tl.zeros([], tl.int32)
    tl.store(accept_index_ptr + b * num_spec, last.to(tl.int32), mask=err == 0)
    done = err != 0
    for _ in range(1, num_spec):
        step = ~done
        child = tl.load(next_token_ptr + row + node, mask=step, other=-1)
        bad = step & ((child < -1) | (child >= n))
        err = tl.where(bad, 1 + 16 * node.to(tl.int32), err)
        child = tl.where(bad, -1, child)
        target_tok = -1
        coin = 0.0
        if SAMPLING:
            coin = tl.load(coins_ptr + row + node)
        else:
            target_tok = tl.load(target_predict_ptr + last, mask=step, other=-1)
        found, child, err = _walk_step_children(
            candidates_ptr, next_sibling_ptr, row, n, child, err, target_tok, coin,
            target_probs_ptr + (row + node) * vocab, draft_probs_ptr + (row + node) * vocab, vocab,
            th_single, th_acc, SAMPLING,
        )
        cyc = step & (found == -1) & (child != -1) & (err == 0)
        err = tl.where(cyc, 3 + 16 * node.to(tl.int32), err)
        accept = step & (found != -1) & (err == 0)
        if SAMPLING:
            tok = tl.load(candidates_ptr + row + tl.where(accept, found, 0), mask=accept, other=0)
        else:
            tok = target_tok
        tl.store(predicts_ptr + last, tok.to(tl.int32), mask=accept)
        g = tl.load(rindex_ptr + row + tl.where(accept, found, 0), mask=accept, other=0)
        g_bad = accept & ((g < 0) | (g >= total))
        err = tl.where(g_bad, 4 + 16 * found.to(tl.int32), err)
        accept = accept & ~g_bad
        num_accepted += accept.to(tl.int32)
        tl.store(accept_index_ptr + b * num_spec + num_accepted, g.to(tl.int32), mask=accept)
        last = tl.where(accept, g, last)
        node = tl.where(accept, found, node)
        done = done | ~accept
    tl.store(accept_num_ptr + b, num_accepted)
    tl.store(error_ptr + b, err)
    if SAMPLING:
        tl.debug_barrier()  # the rejected tokens' draft_probs writes above are read below
        bonus = _residual_draw(
            target_probs_ptr + (row + node) * vocab, draft_probs_ptr + (row + node) * vocab, vocab,
            tl.load(final_coins_ptr + b), tl.where(num_accepted < num_spec - 1, vocab, 0), LANES, UNROLL,
        )
    else:
        bonus = tl.load(target_predict_ptr + last)
    tl.store(predicts_ptr + last, bonus.to(tl.int32), mask=err == 0)


@triton.jit
def _residual_draw(q_ptr, p_ptr, vocab, coin, p_len, LANES: tl.constexpr, UNROLL: tl.constexpr):
    """``residual_draw_ref`` for one row, p = 0 past p_len (0 after a full path, else vocab): two
    passes over the vocab, lanes in parallel."""
    lane = tl.arange(0, LANES)
    seg = tl.cdiv(vocab, LANES)
    inner = tl.zeros([LANES], tl.float32)
    for c0 in range(0, seg, UNROLL):
        for u in tl.static_range(UNROLL):
            tok = lane * seg + c0 + u
            m = ((lane * 0 + c0 + u) < seg) & (tok < vocab)
            q = tl.load(q_ptr + tok, mask=m, other=0.0)
            p = tl.load(p_ptr + tok, mask=m & (tok < p_len), other=0.0)
            inner = inner + tl.maximum(q - p, 0.0)
    # Exclusive prefix of the lane totals, sequentially (one-hot sums are exact).
    offsets = tl.zeros([LANES], tl.float32)
    run = tl.zeros([], tl.float32)
    for k in range(LANES):
        offsets = tl.where(lane == k, run, offsets)
        run = run + tl.sum(tl.where(lane == k, inner, 0.0))
    threshold = coin * run
    inner = tl.zeros([LANES], tl.float32)
    first = tl.full([LANES], 2147483647, tl.int32)
    for c0 in range(0, seg, UNROLL):
        for u in tl.static_range(UNROLL):
            tok = lane * seg + c0 + u
            m = ((lane * 0 + c0 + u) < seg) & (tok < vocab)
            q = tl.load(q_ptr + tok, mask=m, other=0.0)
            p = tl.load(p_ptr + tok, mask=m & (tok < p_len), other=0.0)
            r = tl.maximum(q - p, 0.0)
            inner = inner + r
            hit = m & (r > 0) & (offsets + inner > threshold) & (first == 2147483647)
            first = tl.where(hit, tok.to(tl.int32), first)
    token = tl.min(first)
    return tl.where(token == 2147483647, vocab - 1, token)


def _launch(predicts, accept_index, accept_num, candidates, rindex, next_token, next_sibling, target_predict,
            coins, final_coins, target_probs, draft_probs, error_flag, vocab, th_single, th_acc, sampling):
    bs, n = candidates.shape
    if bs == 0:
        return
    _walk_kernel[(bs,)](
        predicts, accept_index, accept_num, candidates, rindex, next_token, next_sibling, target_predict,
        coins, final_coins, target_probs, draft_probs, error_flag, bs, n, accept_index.shape[1], vocab,
        th_single, th_acc, SAMPLING=sampling, LANES=LANES, UNROLL=_UNROLL, num_warps=4,
    )


@torch.library.custom_op(
    "specdec::verify_tree_greedy", mutates_args=("predicts", "accept_index", "accept_token_num", "error_flag")
)
def _verify_greedy_op(
    predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor, candidates: torch.Tensor,
    retrive_index: torch.Tensor, retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor, error_flag: torch.Tensor,
) -> None:
    unused = target_predict  # the sampling-only pointers are never dereferenced
    _launch(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
            retrive_next_sibling, target_predict, unused, unused, unused, unused, error_flag, 1, 1.0, 1.0, False)


@_verify_greedy_op.register_fake
def _(*args) -> None:
    return None


@torch.library.custom_op(
    "specdec::tree_speculative_sampling_target_only",
    mutates_args=("predicts", "accept_index", "accept_token_num", "draft_probs", "error_flag"),
)
def _sampling_op(
    predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor, candidates: torch.Tensor,
    retrive_index: torch.Tensor, retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor, uniform_samples_for_final_sampling: torch.Tensor, target_probs: torch.Tensor,
    draft_probs: torch.Tensor, error_flag: torch.Tensor, threshold_single: float, threshold_acc: float,
) -> None:
    _launch(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
            retrive_next_sibling, candidates, uniform_samples, uniform_samples_for_final_sampling, target_probs,
            draft_probs, error_flag, target_probs.shape[2], threshold_single, threshold_acc, True)


@_sampling_op.register_fake
def _(*args) -> None:
    return None


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
    torch.ops.specdec.verify_tree_greedy(
        predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
        retrive_next_sibling, target_predict, flag,
    )
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
    torch.ops.specdec.tree_speculative_sampling_target_only(
        predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
        retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
        flag, th_single, th_acc,
    )
    raise_on_cpu(flag, _describe(candidates, target_probs.shape[2]))


IMPLS = {
    "verify_tree_greedy": verify_tree_greedy,
    "tree_speculative_sampling_target_only": tree_speculative_sampling_target_only,
}
