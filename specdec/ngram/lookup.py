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

Drafts are only proposals: the target verifies every token, so any draft is lossless; a better
draft only commits more tokens a step.
"""

from __future__ import annotations

import numpy as np


def propose_ngram(history: np.ndarray, *, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The draft after the longest latest match of the history's suffix ([<= k] of history's dtype).

    Vectorised: the positions holding the last token are found once, then narrowed one earlier
    token at a time (each step keeps the candidates whose match is still as long), so a call costs
    O(L + matches x max_n), not O(L x max_n).
    """
    _check(min_n, max_n, k)
    length = history.shape[0]
    if length < min_n + 1 or k == 0:
        return history[:0]
    # [c] positions p < L - 1 where a match of length 1 ends
    candidates = np.flatnonzero(history[:-1] == history[-1])
    best_end, n = -1, 1
    while candidates.size and n <= max_n:
        if n >= min_n:
            best_end = int(candidates[-1])  # the latest match of length n
        if n == max_n:
            break
        # extend each candidate by one earlier token: it needs p - n >= 0 and history[p - n] == history[L - 1 - n]
        keep = candidates[candidates - n >= 0]
        candidates = keep[history[keep - n] == history[length - 1 - n]]
        n += 1
    if best_end < 0:
        return history[:0]
    return history[best_end + 1: best_end + 1 + k]


def propose_ngram_ref(history: np.ndarray, *, min_n: int, max_n: int, k: int) -> np.ndarray:
    """The specification: every n from max_n down, every end position from the latest back."""
    _check(min_n, max_n, k)
    tokens, length = history.tolist(), history.shape[0]
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n:]
        for p in range(length - 2, n - 2, -1):
            if tokens[p - n + 1: p + 1] == suffix:
                return history[p + 1: p + 1 + k]
    return history[:0]


def _check(min_n: int, max_n: int, k: int) -> None:
    if not 1 <= min_n <= max_n:
        raise ValueError(f"n-gram window: expected 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
    if k < 0:
        raise ValueError(f"n-gram draft length: expected k >= 0, got {k}")


class NgramLookup:
    """Chain drafts for a batch of requests, from each one's history rows.

    ``propose`` takes the layout serving engines keep on the host (vLLM's persistent batch):
    ``token_ids`` [max_reqs, max_len] with each row's first ``num_tokens[i]`` tokens valid.
    """

    def __init__(self, *, min_n: int = 1, max_n: int = 4, k: int = 4, max_len: int | None = None) -> None:
        _check(min_n, max_n, k)
        self.min_n, self.max_n, self.k, self.max_len = min_n, max_n, k, max_len

    def propose(self, token_ids: np.ndarray, num_tokens: np.ndarray, rows: list[int] | None = None,
                k: int | None = None) -> list[list[int]]:
        """One draft (a list of up to ``k`` token ids, maybe empty) per row of ``rows`` (default: all)."""
        k = self.k if k is None else k
        drafts = []
        for i in range(token_ids.shape[0]) if rows is None else rows:
            n = int(num_tokens[i])
            room = k if self.max_len is None else min(k, self.max_len - n)  # never past the context length
            draft = propose_ngram(token_ids[i, :n], min_n=self.min_n, max_n=self.max_n, k=max(room, 0))
            drafts.append(draft.tolist())
        return drafts
