"""Prompt lookup: the tokens that followed the latest earlier occurrence of the request's last n tokens.

Glossary: history = a request's tokens so far (prompt + output), L = len(history); a *match* of
length n ends at position p < L - 1 when history[p - n + 1 : p + 1] == history[L - n : L]; the
*draft* is up to k tokens history[p + 1 : p + 1 + k]. The longest n in [min_n, max_n] that matches
wins; among its matches, the latest (the most recent context repeats most). Worked example
(min_n 1, max_n 3, k 3)::

    position:  0  1  2  3  4  5  6  7  8
    history:   5  9  7  2  5  9  7  8  5  9
                                          ^ L = 10, suffix ... 8 5 9
    n = 3: "8 5 9" never occurs before        -> no match
    n = 2: "5 9" ends at p = 1 and p = 5      -> the latest, p = 5
    draft:  history[6 : 9] = 7 8 5

A match close to the end leaves fewer than k tokens after it: in a repeat of period d < k (a run
of one token, d = 1) the latest match ends d tokens before the end. With ``repeat`` the draft
continues the repeat it found: past the history's end it reads its own tokens d back (the copy
overlaps itself), k tokens in all::

    history:   4  7  7  7  7        the longest n is 3: "7 7 7" ends at p = 3, d = L - 1 - p = 1
    draft:     7                    (cut at the history's end)
    repeat:    7  7  7              (k = 3)

Drafts are only proposals: the target verifies every token, so any draft is lossless; a better
draft only commits more tokens a step.
"""

from __future__ import annotations

import numpy as np


def propose_ngram(history: np.ndarray, *, min_n: int, max_n: int, k: int, repeat: bool = False) -> np.ndarray:
    """The draft after the longest latest match of the history's suffix ([<= k] of history's dtype; with
    ``repeat``, [k] wherever a match exists: the repeat continued past the history's end)."""
    _check(min_n, max_n, k)
    length = history.shape[0]
    if length < min_n + 1 or k == 0:
        return history[:0]
    end = latest_longest_match_end(history, min_n=min_n, max_n=max_n)
    if end < 0:
        return history[:0]
    return continuation(history, end, k, repeat=repeat)


def continuation(history: np.ndarray, end: int, k: int, *, repeat: bool) -> np.ndarray:
    """The k tokens after a match ending at ``end`` < L - 1 ([<= k]: cut at the history's end; with
    ``repeat``, [k]: the d = L - 1 - end tokens after it over and over, the repeat continued)."""
    after = history[end + 1:]  # [d], d >= 1: the match ends before the last token
    return np.resize(after, k) if repeat else after[:k]  # resize: [k], after cut or over and over


def latest_longest_match_end(history: np.ndarray, *, min_n: int, max_n: int) -> int:
    """The end position p < L - 1 of the latest match of the longest matching n in [min_n, max_n]; -1: none.

    A match of n tokens ending at p is also a match of its last n - 1 tokens ending at p, so the n that
    match are 1 .. n*: n* is found by bisection, each probe one ``bytes.rfind`` of the suffix's bytes
    over the history's (C speed, the latest occurrence first; an occurrence that straddles two tokens is
    skipped). It runs on the host before every NGRAM decode step (the policy's reach), where the numpy
    narrowing of candidate positions it replaced cost 40 us a call against 3-5 us (300-2,000 tokens, CPU).
    """
    length, size = history.shape[0], history.itemsize
    data = np.ascontiguousarray(history).tobytes()
    limit = (length - 1) * size  # every match lies within history[:L - 1]

    def latest(n: int) -> int:  # byte offset of the latest token-aligned occurrence of the last n tokens, or -1
        pattern, stop = data[(length - n) * size:], limit
        while True:
            at = data.rfind(pattern, 0, stop)
            if at < 0 or at % size == 0:
                return at
            stop = at + len(pattern) - 1  # straddles two tokens: look before it

    low, high = min_n, min(max_n, length - 1)
    if high < low:
        return -1
    at = latest(low)
    if at < 0:
        return -1
    while low < high:  # invariant: n = low matches (latest at ``at``), every n > high does not
        mid = (low + high + 1) // 2
        found = latest(mid)
        if found >= 0:
            low, at = mid, found
        else:
            high = mid - 1
    return at // size + low - 1


def propose_ngram_ref(history: np.ndarray, *, min_n: int, max_n: int, k: int, repeat: bool = False) -> np.ndarray:
    """The specification: every n from max_n down, every end position from the latest back; with
    ``repeat``, draft token j is history[p + 1 + j] where that exists, else draft token j - d."""
    _check(min_n, max_n, k)
    tokens, length = history.tolist(), history.shape[0]
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n:]
        for p in range(length - 2, n - 2, -1):
            if tokens[p - n + 1: p + 1] == suffix:
                if not repeat:
                    return history[p + 1: p + 1 + k]
                draft: list[int] = []
                for j in range(k):
                    draft.append(tokens[p + 1 + j] if p + 1 + j < length else draft[j - (length - 1 - p)])
                return np.array(draft, dtype=history.dtype)
    return history[:0]


def _check(min_n: int, max_n: int, k: int) -> None:
    if not 1 <= min_n <= max_n:
        raise ValueError(f"n-gram window: expected 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
    if k < 0:
        raise ValueError(f"n-gram draft length: expected k >= 0, got {k}")


class NgramLookup:
    """Chain drafts for a batch of requests, from each one's history rows.

    ``propose`` takes the layout serving engines keep on the host (vLLM's persistent batch):
    ``token_ids`` [max_reqs, max_len] with each row's first ``num_tokens[i]`` tokens valid. ``repeat``:
    drafts continue a short repeat past the history's end (``propose_ngram``).
    """

    def __init__(self, *, min_n: int = 1, max_n: int = 4, k: int = 4, max_len: int | None = None,
                 repeat: bool = False) -> None:
        _check(min_n, max_n, k)
        self.min_n, self.max_n, self.k, self.max_len, self.repeat = min_n, max_n, k, max_len, repeat

    def propose(self, token_ids: np.ndarray, num_tokens: np.ndarray, rows: list[int] | None = None,
                k: int | None = None) -> list[list[int]]:
        """One draft (a list of up to ``k`` token ids, maybe empty) per row of ``rows`` (default: all)."""
        k = self.k if k is None else k
        drafts = []
        for i in range(token_ids.shape[0]) if rows is None else rows:
            n = int(num_tokens[i])
            room = k if self.max_len is None else min(k, self.max_len - n)  # never past the context length
            draft = propose_ngram(token_ids[i, :n], min_n=self.min_n, max_n=self.max_n, k=max(room, 0),
                                  repeat=self.repeat)
            drafts.append(draft.tolist())
        return drafts
