"""Prompt lookup on the device (``ngram_match``): each request's draft chain, from the tokens its KV holds.

A request's history is its committed tokens: ``slot_tokens[req_to_token[row, i]]`` for the ``seq_len``
positions in KV, then its root (the last committed token, not in KV yet), L = seq_len + 1 tokens in
all. The draft follows the longest latest match of the history's suffix, as the host's lookup
(``specdec.ngram.lookup.propose_ngram``) finds it: the longest n in [min_n, max_n] whose last n tokens
occur earlier, ending at p < L - 1, and among those the latest p (``latest_longest_match``); the
draft is history[p + 1 : p + 1 + k] (k = ``chains``' width - 1), past the history's end the repeat of period
L - 1 - p continued (``propose_ngram(..., repeat=True)``: in a run of one token the latest match ends one
token before the end). Each request's chain is its root, then its draft; a row without a match holds its
root throughout (a valid token: the target verifies every node) and drafts nothing.

Reading the history from the KV slots keeps it right by construction: every forward of the n-gram
worker writes each new token's id at its KV slot (``slot_tokens``), and a cached prefix shares the
slots, and so the ids, of the request that wrote it. So the host need not read a step before drafting
the next one: the lookup runs on the device after the unread step (``specdec.ngram.worker``).
"""

from __future__ import annotations

import numpy as np
import torch

from specdec.kernels.common import INDEX_DTYPES, check_rows, check_tensor, ngram_merge_buffer, table_row
from specdec.kernels.dispatch import select_impl

__all__ = ["latest_longest_match", "ngram_merge_buffer", "ngram_match", "ngram_match_ref"]


def ngram_match(
    slot_tokens: torch.Tensor,  # [num_slots] int32 / int64: the token id each KV slot holds
    req_to_token: torch.Tensor,  # [max_reqs, max_context] KV slot of each request position
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs] tokens in KV (the root is not)
    roots: torch.Tensor,  # [bs] each request's last committed token
    chains: torch.Tensor,  # [bs, k + 1] int64, written: each request's root, draft, then its root again
    draft_lens: torch.Tensor,  # [bs] int32 / int64, written: tokens drafted (0: no match)
    *,
    min_n: int,
    max_n: int,
    span: int | None = None,
    merge: torch.Tensor | None = None,
) -> None:
    """Each request's draft chain after the longest latest match of its history's suffix (module docstring).

    ``span`` and ``merge`` shape the kernel's work and not its result: the history positions one program
    scans (default: 1,024, more past 64 programs a request) and the [2, >= bs] int64 state in which a
    request's programs merge their matches (``ngram_merge_buffer``; kept across steps by the caller, fresh per
    call when None)."""
    bs, device = check_rows(req_to_token, req_pool_indices, {"seq_lens": seq_lens})
    check_tensor("slot_tokens", slot_tokens, dtype=INDEX_DTYPES, dim=1, device=device)
    check_tensor("roots", roots, dtype=INDEX_DTYPES, shape=(bs,), device=device)
    check_tensor("chains", chains, dtype=torch.int64, dim=2, device=device)
    check_tensor("draft_lens", draft_lens, dtype=INDEX_DTYPES, shape=(bs,), device=device)
    if chains.shape[0] != bs or chains.shape[1] < 1 or not chains.is_contiguous():
        raise ValueError(f"chains: expected a contiguous [{bs}, k + 1] tensor, got {tuple(chains.shape)}")
    if not 1 <= min_n <= max_n:
        raise ValueError(f"ngram_match: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
    impl = select_impl("ngram_match", ngram_match_ref, device)
    impl(slot_tokens, req_to_token, req_pool_indices, seq_lens, roots, chains, draft_lens, min_n=min_n, max_n=max_n,
         span=span, merge=merge)


def ngram_match_ref(slot_tokens, req_to_token, req_pool_indices, seq_lens, roots, chains, draft_lens, *,
                    min_n: int, max_n: int, span: int | None = None, merge: torch.Tensor | None = None) -> None:
    """Specification of ``ngram_match``: each request's history gathered, then ``latest_longest_match``
    (``span`` and ``merge`` only shape the kernel's work)."""
    k = chains.shape[1] - 1
    for b, (row, seq_len, root) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), roots.tolist())):
        table = table_row(req_to_token, row, b)
        if not 0 <= seq_len <= table.shape[0]:
            raise ValueError(f"seq_lens: request {b} has {seq_len} tokens, its row holds {table.shape[0]}")
        history = np.append(slot_tokens[table[:seq_len].long()].cpu().numpy().astype(np.int64), root)
        end = latest_longest_match(history, min_n=min_n, max_n=max_n)
        # [k] the tokens after the match, over and over past the history's end (np.resize cuts or repeats)
        draft = np.resize(history[end + 1:], k) if end >= 0 else history[:0]
        chains[b] = root
        chains[b, 1: 1 + len(draft)] = torch.from_numpy(draft)
        draft_lens[b] = len(draft)


def latest_longest_match(history: np.ndarray, *, min_n: int, max_n: int) -> int:
    """The end p < L - 1 of the longest latest match of ``history``'s suffix of min_n .. max_n tokens
    (-1: none), as the kernel finds it: each p's run of tokens equal to the suffix's, counted back from p
    and from L - 1 up to max_n, then the largest (run, p)."""
    length = history.shape[0]
    ends = np.arange(length - 1)  # [L - 1] candidate ends p
    alive = np.ones(length - 1, dtype=bool)
    run = np.zeros(length - 1, dtype=np.int64)
    for j in range(max_n):
        alive &= ends - j >= 0
        alive &= history[np.maximum(ends - j, 0)] == history[length - 1 - j] if length - 1 - j >= 0 else False
        run += alive
    key = np.where(run >= min_n, run * length + ends, -1)
    return int(key.max() % length) if key.size and key.max() >= 0 else -1
