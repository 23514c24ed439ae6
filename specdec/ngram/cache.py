"""NgramCache: a bounded store of earlier requests' token windows, for drafts a request's own
tokens do not give (SGLang's cross-request n-gram cache, ``--speculative-ngram-capacity`` and
``--speculative-ngram-branch-length``).

Glossary: a *window* is up to ``branch_length`` consecutive tokens of a finished request's prompt +
output; its first n tokens (n in [min_match_window, max_match_window], n < branch_length) are a
*key*, the rest its *continuation*. A lookup matches the longest key equal to a request's latest
n tokens and drafts its continuation as a chain. Worked example (windows 1..2, branch_length 4)::

    finished request   3 8 5 9 7
    keys stored        (3)->8 5 9   (3 8)->5 9   (8)->5 9 7   (8 5)->9 7   (5)->9 7   (5 9)->7   (9)->7
    running request    ... 6 8 5   -> key (8 5) -> draft 9 7

A key seen again takes the newer continuation (the latest context repeats most). ``size`` counts
the tokens held (keys + continuations) and never exceeds ``capacity``: the least recently inserted
or matched keys go first. An insert costs O(window) per token of the request, a lookup
O(max_match_window^2); nothing scans the whole cache. Drafts are only proposals: the target
verifies every token, so whatever the cache holds, output is unchanged.
"""

from __future__ import annotations

import collections

import numpy as np

from specdec.ngram.batch import BatchTrees


class NgramCache:
    def __init__(self, *, capacity: int, branch_length: int, min_n: int, max_n: int) -> None:
        if capacity < 1 or branch_length < 2 or not 1 <= min_n <= max_n:
            raise ValueError(f"NgramCache: capacity={capacity}, branch_length={branch_length}, "
                             f"windows {min_n}..{max_n}")
        self.capacity, self.branch_length, self.min_n, self.max_n = capacity, branch_length, min_n, max_n
        # key -> continuation, least recently used first
        self._entries: collections.OrderedDict[tuple[int, ...], tuple[int, ...]] = collections.OrderedDict()
        self.size = 0  # tokens held: keys + continuations

    def __len__(self) -> int:
        return len(self._entries)

    def insert(self, tokens: list[int] | np.ndarray) -> None:
        """Store every window of ``tokens`` (a finished request's prompt + output), later ones last."""
        toks = tokens.tolist() if isinstance(tokens, np.ndarray) else list(tokens)
        length = len(toks)
        for start in range(length - 1):
            stop = min(start + self.branch_length, length)  # the window is toks[start:stop]
            for n in range(self.min_n, min(self.max_n, stop - start - 1) + 1):
                self._put(tuple(toks[start: start + n]), tuple(toks[start + n: stop]))

    def _put(self, key: tuple[int, ...], continuation: tuple[int, ...]) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.size -= len(key) + len(old)
        self._entries[key] = continuation
        self.size += len(key) + len(continuation)
        while self.size > self.capacity:
            gone, cont = self._entries.popitem(last=False)
            self.size -= len(gone) + len(cont)

    def lookup(self, history: np.ndarray, k: int) -> list[int]:
        """Up to ``k`` draft tokens after the longest stored key equal to ``history``'s suffix ([] if none)."""
        if k <= 0:
            return []
        for n in range(min(self.max_n, history.shape[0]), self.min_n - 1, -1):
            key = tuple(history[history.shape[0] - n:].tolist())
            cont = self._entries.get(key)
            if cont is not None:
                self._entries.move_to_end(key)
                return list(cont[:k])
        return []


def with_cache_drafts(trees: BatchTrees, cache: NgramCache, history: np.ndarray, lengths: np.ndarray,
                      limits: np.ndarray) -> BatchTrees:
    """``trees`` with each row that drafted fewer nodes than its limit replaced by the cache's chain
    where that chain is longer (``history`` [bs, >= max length], ``lengths`` / ``limits`` [bs]).

    Row b with 0 own nodes and the cache's draft 7 8 (limit 3) -> tokens 7 8, parents 0 1, size 2."""
    chains = {}
    for b in np.flatnonzero(trees.sizes < limits).tolist():
        chain = cache.lookup(history[b, : lengths[b]], int(limits[b]))
        if len(chain) > trees.sizes[b]:
            chains[b] = chain
    if not chains:
        return trees
    width = max(trees.tokens.shape[1], max(len(c) for c in chains.values()))
    tokens = np.zeros((len(lengths), width), dtype=np.int64)  # [bs, D]
    parents = np.zeros((len(lengths), width), dtype=np.int64)  # [bs, D]
    tokens[:, : trees.tokens.shape[1]], parents[:, : trees.parents.shape[1]] = trees.tokens, trees.parents
    sizes = trees.sizes.copy()
    for b, chain in chains.items():
        tokens[b], parents[b] = 0, 0
        tokens[b, : len(chain)], parents[b, : len(chain)] = chain, np.arange(len(chain))
        sizes[b] = len(chain)
    return BatchTrees(tokens, parents, sizes)
