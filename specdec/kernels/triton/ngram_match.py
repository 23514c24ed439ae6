"""Triton version of ``specdec.kernels.ngram_match.ngram_match``.

Grid ``(bs,)``: program b walks its history's candidate end positions p < L - 1 in blocks of BLOCK;
for each p it counts how many of the tokens ending there equal the suffix's, from the last one back
(at most MAX_N, each a gather through ``req_to_token`` and ``slot_tokens``), and keeps the best key
n * 2^32 + p over the p whose count n reaches MIN_N (the longest match, then the latest). The draft is
then the tokens after that p, written after the root. Every access is masked to its row; a request
whose row or length is out of range drafts nothing (``error_flag`` on CPU, as the reference raises).

NOTE: one program walks a request's whole history, L / BLOCK blocks of two dependent gathers (most
later rounds are masked off: few candidates survive the first token), so its time grows with the
context; measured only at 1-2 k tokens (SmolLM2 on an H200). Longer contexts would want the ends split
over several programs and their keys merged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton._common import custom_op, error_flag_for, next_pow2, raise_on_cpu

_ERRORS = {1: "req_pool_indices: request {b} has a row outside req_to_token",
           2: "seq_lens: request {b} has a length outside its row"}
_BLOCK = 256


@triton.jit
def _history(slot_tokens, table, pos, seq_len, root, mask):
    """The history's tokens at ``pos`` (the root at seq_len, else the id in the position's KV slot)."""
    in_kv = mask & (pos < seq_len)
    slot = tl.load(table + pos, mask=in_kv, other=0).to(tl.int64)
    tok = tl.load(slot_tokens + slot, mask=in_kv, other=0).to(tl.int64)
    return tl.where(pos == seq_len, root, tok)


@triton.jit
def _ngram_match_kernel(slot_tokens, req_to_token, rows_ptr, lens_ptr, roots_ptr, chains, draft_lens, error_ptr,
                        max_reqs, ctx, K, MIN_N: tl.constexpr, MAX_N: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(rows_ptr + b).to(tl.int64)
    seq_len = tl.load(lens_ptr + b).to(tl.int64)
    root = tl.load(roots_ptr + b).to(tl.int64)
    err = tl.where((row < 0) | (row >= max_reqs), 1, tl.where((seq_len < 0) | (seq_len > ctx), 2, 0))
    tl.store(error_ptr + b, err)
    seq_len = tl.where(err == 0, seq_len, 0)  # a bad row drafts nothing
    table = req_to_token + tl.where(err == 0, row, 0) * ctx
    # the suffix's tokens, last first: suffix[j] = history[L - 1 - j] = history[seq_len - j]
    offs_j = tl.arange(0, BLOCK_N)
    suffix = _history(slot_tokens, table, seq_len - offs_j, seq_len, root, (offs_j < MAX_N) & (offs_j <= seq_len))
    best = tl.full([], -1, tl.int64)
    for start in range(0, seq_len, BLOCK):  # candidate ends p < L - 1 = seq_len
        p = start + tl.arange(0, BLOCK).to(tl.int64)
        alive = p < seq_len
        count = tl.zeros([BLOCK], tl.int64)
        for j in tl.static_range(MAX_N):
            want = tl.sum(tl.where(offs_j == j, suffix, 0))  # history[seq_len - j]
            alive = alive & (p - j >= 0)
            alive = alive & (_history(slot_tokens, table, p - j, seq_len, root, alive) == want)
            count += alive.to(tl.int64)
        key = tl.where(count >= MIN_N, count * 4294967296 + p, -1)
        best = tl.maximum(best, tl.max(key))
    end = best % 4294967296  # the match's last position, where best >= 0
    n_draft = tl.where(best >= 0, tl.minimum(K, seq_len - end), 0)
    offs_k = tl.arange(0, BLOCK_K)  # chain entry 1 + j holds draft token j
    in_draft = offs_k < n_draft
    draft = _history(slot_tokens, table, end + 1 + offs_k, seq_len, root, in_draft)
    chain = chains + b.to(tl.int64) * (K + 1)
    tl.store(chain, root)
    tl.store(chain + 1 + offs_k, tl.where(in_draft, draft, root), mask=offs_k < K)
    tl.store(draft_lens + b, n_draft)


@custom_op("ngram_match", ("chains", "draft_lens", "error_flag"))
def _ngram_match_op(slot_tokens: torch.Tensor, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                    seq_lens: torch.Tensor, roots: torch.Tensor, chains: torch.Tensor, draft_lens: torch.Tensor,
                    min_n: int, max_n: int, error_flag: torch.Tensor) -> None:
    bs, k = chains.shape[0], chains.shape[1] - 1
    if bs:
        _ngram_match_kernel[(bs,)](
            slot_tokens, req_to_token, req_pool_indices, seq_lens, roots, chains, draft_lens, error_flag,
            req_to_token.shape[0], req_to_token.shape[1], k, MIN_N=min_n, MAX_N=max_n,
            BLOCK_N=next_pow2(max_n), BLOCK=_BLOCK, BLOCK_K=next_pow2(k))


def ngram_match(slot_tokens, req_to_token, req_pool_indices, seq_lens, roots, chains, draft_lens, *, min_n: int,
                max_n: int, error_flag: torch.Tensor | None = None) -> None:
    flag = error_flag_for(chains.shape[0], req_to_token.device, error_flag)
    _ngram_match_op(slot_tokens, req_to_token, req_pool_indices, seq_lens, roots, chains, draft_lens, min_n, max_n,
                    flag)
    raise_on_cpu(flag, lambda b, code: "ngram_match: " + _ERRORS[code].format(b=b))


IMPLS = {"ngram_match": ngram_match}
