"""What a lookup ahead of an unread step assumes about that step, per request row.

Under overlap scheduling the step in flight (t + 1) is unread when the next one (t + 2) looks up;
the host has every token of step t. A lookup ahead guesses what t + 1 commits: the path of first
children it drafted, accepted whole, then the bonus the latest match predicts (``batch.guess_next``),
and drafts the tree that follows. The path is worth appending only if t + 1
itself was drafted from the right tokens: where t + 1 ran ahead of t, from what it assumed t
commits. So each launch records what it assumed (``launched``), and the next lookup ahead checks it
against the tokens read since (``guessed_history``): a wrong guess is then not built upon (t + 1
is taken to commit its root alone), so one wrong guess spoils one step, not every step after it.

Worked example (one row, tokens read ... 5 9 when t + 1 launched ahead of t):

    t + 1 assumed t commits [7 2] (its path 7 and bonus 2) and drafted path [5 9]
    t read: ... 5 9 7 2     -> as assumed: the lookup for t + 2 runs on ... 5 9 7 2 5 9
    t read: ... 5 9 7 8     -> not: it runs on ... 5 9 7 8 (t + 1's drafts were built on 2, not 8)
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class GuessedHistory:
    history: np.ndarray  # [bs, >= max(lengths)] the tokens read, then the path of the step in flight
    lengths: np.ndarray  # [bs] tokens of each row's guessed history
    read: np.ndarray  # [bs] of them read (the rest: the step in flight's path)


class AheadGuess:
    def __init__(self, max_reqs: int, width: int) -> None:
        """``width``: the longest path a step drafts (the verify size less its root)."""
        self.path = np.zeros((max_reqs, width), dtype=np.int64)  # [max_reqs, width] last launch's first-child path
        self.path_len = np.zeros(max_reqs, dtype=np.int64)  # [max_reqs] (0: a plain step)
        self.basis = np.zeros(max_reqs, dtype=np.int64)  # [max_reqs] tokens read when it launched
        self.assumed = np.zeros((max_reqs, width + 1), dtype=np.int64)  # [max_reqs, width + 1] what it assumed next
        self.assumed_len = np.zeros(max_reqs, dtype=np.int64)  # [max_reqs] (0: nothing was in flight)

    def reset(self, rows) -> None:
        """Rows of new requests: nothing launched yet."""
        self.path_len[rows] = 0
        self.assumed_len[rows] = 0
        self.basis[rows] = 0

    def guessed_history(self, rows: np.ndarray, token_ids: np.ndarray, num_tokens: np.ndarray) -> GuessedHistory:
        """Each row's tokens read (``token_ids`` [max_reqs, max_len], ``num_tokens`` [max_reqs]), then the
        path of its step in flight where that step was drafted from what was then read (module docstring)."""
        read = num_tokens[rows]  # [bs]
        assumed_len = self.assumed_len[rows]
        right = (read == self.basis[rows] + assumed_len) & (read > 0)  # [bs]
        if assumed_len.any():
            j = np.arange(self.assumed.shape[1])
            where = np.minimum(self.basis[rows][:, None] + j, token_ids.shape[1] - 1)  # [bs, width + 1]
            differs = (token_ids[rows[:, None], where] != self.assumed[rows]) & (j < assumed_len[:, None])
            right &= ~differs.any(1)
        path_len = np.where(right, self.path_len[rows], 0)  # [bs]
        lengths = read + path_len
        history = np.zeros((len(rows), max(int(lengths.max(initial=0)), 1)), dtype=token_ids.dtype)
        longest = int(read.max(initial=0))
        history[:, :longest] = token_ids[rows, :longest]
        b, k = np.nonzero(np.arange(self.path.shape[1]) < path_len[:, None])
        history[b, read[b] + k] = self.path[rows[b], k]
        return GuessedHistory(history, lengths, read)

    def launched(self, rows: np.ndarray, read: np.ndarray, path: np.ndarray, path_len: np.ndarray,
                 assumed: np.ndarray | None = None, assumed_len: np.ndarray | None = None) -> None:
        """A step of ``rows`` launched with ``read`` [bs] tokens read, drafting ``path`` [bs, <= width] of
        ``path_len`` [bs] (0: plain); ``assumed`` [bs, <= width + 1] / ``assumed_len`` [bs]: the tokens it
        assumed follow them (a lookup ahead of an unread step; None: nothing was in flight)."""
        self.basis[rows] = read
        self.path[rows, : path.shape[1]] = path
        self.path_len[rows] = path_len
        if assumed is None:
            self.assumed_len[rows] = 0
        else:
            self.assumed[rows, : assumed.shape[1]] = assumed
            self.assumed_len[rows] = assumed_len
