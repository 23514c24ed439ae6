"""Triton version of ``specdec.kernels.ngram_match.ngram_match``.

Grid ``(bs, splits)``: program (b, s) walks the candidate end positions p < L - 1 of request b's history
in [s * span, (s + 1) * span), in blocks of BLOCK; for each p it counts how many of the tokens ending
there equal the suffix's, from the last one back (at most MAX_N, each a gather through ``req_to_token``
and ``slot_tokens``), and keeps the best key n * 2^32 + p over the p whose count n reaches MIN_N (the
longest match, then the latest). The draft is then the k tokens after that p (past the history's end the
repeat it found, continued), written after the root.
Every access is masked to its row; a request whose row or length is out of range drafts nothing
(``error_flag`` on CPU, as the reference raises).

A request's programs merge their keys in ``merge`` (row 0: each request's best key so far, -1 when
idle; row 1: how many of its programs are done, 0 when idle): each takes the maximum of its key into
row 0, then counts itself into row 1 (acquire-release), and the last to arrive reads the merged key,
writes the chain and leaves both entries idle again for the next launch. A maximum does not depend on
the order the programs arrive in, so the chain does not either. With one split (a table of at most
``span`` positions) the program writes its chain directly.

NOTE: a program's scan is span / BLOCK rounds of two dependent gathers per n-gram token (most masked
off: few candidates survive the first). One program a request (before the split, measured only at 1-2 k
tokens on an H200) grew with the context; split, no program scans more than ``span`` positions up to
MAX_SPLITS programs a request (``benchmarks/bench_kernels.py``: ``ngram_match`` split and in one program).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.common import ngram_merge_buffer
from specdec.kernels.triton._common import custom_op, error_flag_for, next_pow2, raise_on_cpu

_ERRORS = {1: "req_pool_indices: request {b} has a row outside req_to_token",
           2: "seq_lens: request {b} has a length outside its row"}
_BLOCK = 256
SPAN = 1024  # candidate ends one program scans (a multiple of _BLOCK), unless the table needs more splits
MAX_SPLITS = 64  # programs a request at most: past SPAN * MAX_SPLITS positions each program scans more


def split_span(ctx: int, span: int | None = None) -> tuple[int, int]:
    """(span, splits) for a table of ``ctx`` positions: ``span`` (default SPAN, raised so that at most
    MAX_SPLITS programs cover the table), rounded up to whole blocks."""
    span = max(SPAN, -(-ctx // MAX_SPLITS)) if span is None else span
    if span < 1:
        raise ValueError(f"ngram_match: span must be >= 1, got {span}")
    span = -(-span // _BLOCK) * _BLOCK
    return span, max(-(-ctx // span), 1)


@triton.jit
def _history(slot_tokens, table, pos, seq_len, root, mask):
    """The history's tokens at ``pos`` (the root at seq_len, else the id in the position's KV slot)."""
    in_kv = mask & (pos < seq_len)
    slot = tl.load(table + pos, mask=in_kv, other=0).to(tl.int64)
    tok = tl.load(slot_tokens + slot, mask=in_kv, other=0).to(tl.int64)
    return tl.where(pos == seq_len, root, tok)


@triton.jit
def _best_key(slot_tokens, table, seq_len, root, first, last, MIN_N: tl.constexpr, MAX_N: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK: tl.constexpr):
    """The best key n * 2^32 + p over candidate ends p in [first, last) (-1: none)."""
    # the suffix's tokens, last first: suffix[j] = history[L - 1 - j] = history[seq_len - j]
    offs_j = tl.arange(0, BLOCK_N)
    suffix = _history(slot_tokens, table, seq_len - offs_j, seq_len, root, (offs_j < MAX_N) & (offs_j <= seq_len))
    best = tl.full([], -1, tl.int64)
    for start in range(first, last, BLOCK):
        p = start + tl.arange(0, BLOCK).to(tl.int64)
        alive = p < last
        count = tl.zeros([BLOCK], tl.int64)
        for j in tl.static_range(MAX_N):
            want = tl.sum(tl.where(offs_j == j, suffix, 0))  # history[seq_len - j]
            alive = alive & (p - j >= 0)
            alive = alive & (_history(slot_tokens, table, p - j, seq_len, root, alive) == want)
            count += alive.to(tl.int64)
        key = tl.where(count >= MIN_N, count * 4294967296 + p, -1)
        best = tl.maximum(best, tl.max(key))
    return best


@triton.jit
def _write_chain(slot_tokens, table, seq_len, root, best, chains, draft_lens, b, K, BLOCK_K: tl.constexpr):
    """Request b's chain: its root, the K tokens after the match ``best`` ends (none where -1; past the
    history's end its repeat continued), the root past the draft."""
    end = best % 4294967296  # the match's last position, where best >= 0
    n_draft = tl.where(best >= 0, K, 0)
    offs_k = tl.arange(0, BLOCK_K)  # chain entry 1 + j holds draft token j
    in_draft = offs_k < n_draft
    period = seq_len - end  # d = L - 1 - end >= 1: draft token j is history[end + 1 + j % d]
    draft = _history(slot_tokens, table, end + 1 + offs_k % period, seq_len, root, in_draft)
    chain = chains + b.to(tl.int64) * (K + 1)
    tl.store(chain, root)
    tl.store(chain + 1 + offs_k, tl.where(in_draft, draft, root), mask=offs_k < K)
    tl.store(draft_lens + b, n_draft)


@triton.jit
def _ngram_match_kernel(slot_tokens, req_to_token, rows_ptr, lens_ptr, roots_ptr, chains, draft_lens, error_ptr,
                        merge, merge_stride, max_reqs, ctx, K, span, MIN_N: tl.constexpr, MAX_N: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
    b = tl.program_id(0)
    split = tl.program_id(1)
    row = tl.load(rows_ptr + b).to(tl.int64)
    seq_len = tl.load(lens_ptr + b).to(tl.int64)
    root = tl.load(roots_ptr + b).to(tl.int64)
    err = tl.where((row < 0) | (row >= max_reqs), 1, tl.where((seq_len < 0) | (seq_len > ctx), 2, 0))
    seq_len = tl.where(err == 0, seq_len, 0)  # a bad row drafts nothing
    table = req_to_token + tl.where(err == 0, row, 0) * ctx
    first = split.to(tl.int64) * span
    best = _best_key(slot_tokens, table, seq_len, root, first, tl.minimum(first + span, seq_len), MIN_N, MAX_N,
                     BLOCK_N, BLOCK)  # candidate ends p < L - 1 = seq_len
    if SPLIT:
        tl.atomic_max(merge + b, best, sem="relaxed")
        arrived = tl.atomic_add(merge + merge_stride + b, 1, sem="acq_rel")
        if arrived == tl.num_programs(1) - 1:  # the request's last program: every key is in
            best = tl.atomic_xchg(merge + b, -1, sem="acquire")
            tl.store(merge + merge_stride + b, 0)
            tl.store(error_ptr + b, err)
            _write_chain(slot_tokens, table, seq_len, root, best, chains, draft_lens, b, K, BLOCK_K)
    else:
        tl.store(error_ptr + b, err)
        _write_chain(slot_tokens, table, seq_len, root, best, chains, draft_lens, b, K, BLOCK_K)


@custom_op("ngram_match", ("chains", "draft_lens", "merge", "error_flag"))
def _ngram_match_op(slot_tokens: torch.Tensor, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                    seq_lens: torch.Tensor, roots: torch.Tensor, chains: torch.Tensor, draft_lens: torch.Tensor,
                    min_n: int, max_n: int, span: int, splits: int, merge: torch.Tensor,
                    error_flag: torch.Tensor) -> None:
    bs, k = chains.shape[0], chains.shape[1] - 1
    if bs:
        _ngram_match_kernel[(bs, splits)](
            slot_tokens, req_to_token, req_pool_indices, seq_lens, roots, chains, draft_lens, error_flag,
            merge, merge.stride(0), req_to_token.shape[0], req_to_token.shape[1], k, span, MIN_N=min_n, MAX_N=max_n,
            BLOCK_N=next_pow2(max_n), BLOCK=_BLOCK, BLOCK_K=next_pow2(k), SPLIT=splits > 1)


def ngram_match(slot_tokens, req_to_token, req_pool_indices, seq_lens, roots, chains, draft_lens, *, min_n: int,
                max_n: int, span: int | None = None, merge: torch.Tensor | None = None,
                error_flag: torch.Tensor | None = None) -> None:
    bs, device = chains.shape[0], req_to_token.device
    span, splits = split_span(req_to_token.shape[1], span)
    if merge is None:  # (one split never reads it)
        merge = ngram_merge_buffer(bs, device) if splits > 1 else chains.new_empty(2, 1)
    elif merge.dtype != torch.int64 or merge.dim() != 2 or merge.shape[0] != 2 or merge.shape[1] < bs \
            or merge.stride(1) != 1 or merge.device != device:
        raise ValueError(f"merge: expected a [2, >= {bs}] int64 tensor on {device} (ngram_merge_buffer), got "
                         f"{merge.dtype} {tuple(merge.shape)} on {merge.device}")
    flag = error_flag_for(bs, device, error_flag)
    _ngram_match_op(slot_tokens, req_to_token, req_pool_indices, seq_lens, roots, chains, draft_lens, min_n, max_n,
                    span, splits, merge, flag)
    raise_on_cpu(flag, lambda b, code: "ngram_match: " + _ERRORS[code].format(b=b))


IMPLS = {"ngram_match": ngram_match}
