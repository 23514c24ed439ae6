"""Prefix caching for the reference host: which KV pages a request can take from earlier requests.

``RadixPrefixCache`` (the default) keeps finished and in-progress requests' KV pages in a
``RadixCache`` and maps a new request's longest cached prefix into its row of ``req_to_token``, so
its prefill starts there; ``NoPrefixCache`` (``--disable-radix-cache``) frees a request's pages
when it ends. The scheduler talks to either through the same methods.

One page holds the target's KV *and* the draft head's KV of its positions: the worker's draft
cache uses the host's slot indices (``specdec.host``). The two depend on different tokens:

    target KV at position p   depends on tokens 0 .. p
    draft KV at position p    depends on tokens 0 .. p + 1   (the draft input at p is the token
                              p + 1 with the target feature of p: EAGLE's shift by one)

So a position's key is the *pair* (token p, token p + 1): a cached path then fixes every token its
KV depends on, and a draft entry is reused only by a request whose next token is the one it was
computed with. Example, page_size 1, request A = "a b c d" (KV of positions 0..2 when it ends, "d"
the last output):

    token keys   a, b, c           a request "a b c x" would reuse 3 positions
    pair keys    ab, bc, cd        a request "a b c x" reuses 2: the draft KV at "c" saw "d", not "x"

Every engine keys by pairs, with a draft head or not (plain decoding, NGRAM, a standalone draft LM:
one position fewer reused than token keys would give). A prompt then takes the same cached prefix
whatever the algorithm, so its prefill starts at the same position, splits into the same forwards
and computes the same bits: with token keys plain decoding's prefill started one token later than
EAGLE's after every partial hit, and in bf16 that alone parted greedy answers (H200, SmolLM2,
MT-bench one prompt at a time after the first: 1 of 8 equal with the decode paths equal bit for bit).

A position is *final*, and may enter the tree, once its key is known: the request's KV holds it
and (pair keys) the next token exists. A request always computes at least its last token (its
logits give the next one), so at most len(tokens) - 1 positions come from the cache.

Ownership: a page is free (allocator), a request's own (mapped only in its row), or the tree's
(mapped in any number of rows, locked while a request uses it). A request's row maps its cached
prefix first, then its own pages; ``cache_request`` hands the final whole pages to the tree (the
tree's copy wins where it already had them: the request's duplicates are freed and its row is
pointed at the tree's pages), and ``release_request`` also frees the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from specdec.engine.memory import PagedKVMemory
from specdec.engine.radix_cache import RadixCache, _Node

# a key packs (token p, token p + 1); token ids are far below 2**32
_PAIR_SHIFT = 32


def pair_keys(tokens: Sequence[int]) -> list[int]:
    """One key per position p < len(tokens) - 1: (token p, token p + 1) (target + draft KV)."""
    return [(a << _PAIR_SHIFT) | b for a, b in zip(tokens[:-1], tokens[1:])]


class PrefixHit(NamedTuple):
    """What a request would take from the cache if admitted now."""

    tokens: int  # positions its cached prefix supplies
    # pages of that prefix no request uses: reclaimable until the request locks them
    unlocked_pages: int


@dataclasses.dataclass
class CacheStats:
    """Prompt tokens looked up at admission and how many of them came from the cache."""

    queried_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class NoPrefixCache:
    """``--disable-radix-cache``: nothing is shared; a request's pages are freed when it ends."""

    enabled = False

    def __init__(self, memory: PagedKVMemory) -> None:
        self.memory = memory
        self.stats = CacheStats()

    def lookup(self, tokens: Sequence[int]) -> PrefixHit:
        return PrefixHit(0, 0)

    def acquire(self, row: int, tokens: Sequence[int]) -> int:
        self.stats.queried_tokens += len(tokens)
        return 0

    def cache_request(self, row: int, tokens: Sequence[int], kv_len: int) -> None:
        pass

    def release_request(self, row: int, tokens: Sequence[int], kv_len: int, kv_alloc: int) -> None:
        self.memory.free_request_tokens(row, max(kv_len, kv_alloc))

    def reclaimable_pages(self) -> int:
        return self.memory.num_free_pages()

    def make_room(self, pages: int) -> bool:
        return self.memory.num_free_pages() >= pages

    def flush(self) -> int:
        return 0

    def pages(self) -> list[int]:
        return []

    @property
    def cached_pages(self) -> int:
        return 0

    @property
    def locked_pages(self) -> int:
        return 0


class RadixPrefixCache:
    """The radix-tree prefix cache over the host's paged KV pool (target and draft together)."""

    enabled = True

    def __init__(self, memory: PagedKVMemory) -> None:
        self.memory = memory
        self.page_size = memory.page_size
        self.keys_of = pair_keys  # every engine (module docstring)
        self.tree = RadixCache(memory.page_size)
        self.stats = CacheStats()
        # request row -> (locked node, tokens of the row that the tree holds)
        self._held: dict[int, tuple[_Node, int]] = {}

    # ------------------------------------------------------------ admission
    def lookup(self, tokens: Sequence[int]) -> PrefixHit:
        """The prefix of ``tokens`` a request would take from the cache now (nothing is locked)."""
        match = self._match(tokens)
        return PrefixHit(len(match) * self.page_size, self.tree.unlocked_pages(match.node))

    def acquire(self, row: int, tokens: Sequence[int]) -> int:
        """Lock the longest cached prefix of ``tokens`` and map it into ``row``; returns its tokens."""
        match = self._match(tokens)
        self.tree.lock(match.node)
        self.memory.map_pages(row, 0, match.pages)
        cached = len(match) * self.page_size
        self._held[row] = (match.node, cached)
        self.stats.queried_tokens += len(tokens)
        self.stats.hit_tokens += cached
        return cached

    def _match(self, tokens: Sequence[int]):
        # NOTE: the last token is always computed (its logits give the next token)
        return self.tree.match(self.keys_of(tokens)[: len(tokens) - 1])

    # ------------------------------------------------------------ hand-over
    def cache_request(self, row: int, tokens: Sequence[int], kv_len: int, *, leaving: bool = False) -> None:
        """Give the tree the final whole pages of a running request (after a prefill chunk), so
        requests admitted later share them; the request keeps using them, locked. ``leaving``: the
        request's row is released next (``release_request``), so its table is not re-pointed."""
        node, held = self._held[row]
        keys = self.keys_of(tokens)[:kv_len]
        final = len(keys) // self.page_size * self.page_size
        if final <= held:
            return
        given = self.memory.row_pages(row, 0, final // self.page_size)  # [final / page_size]
        match = self.tree.insert(keys[:final], given.tolist())
        self._adopt(row, given, match.pages, repoint=not leaving)
        self.tree.lock(match.node)
        self.tree.unlock(node)
        self._held[row] = (match.node, final)

    def release_request(self, row: int, tokens: Sequence[int], kv_len: int, kv_alloc: int) -> None:
        """A request leaves (finished, aborted or retracted): its final pages join the tree, the
        rest of its pages (the partial last page, slots reserved ahead) are freed, its lock goes."""
        self.cache_request(row, tokens, kv_len, leaving=True)
        node, held = self._held.pop(row)
        self.memory.truncate([row], [max(kv_len, kv_alloc, held)], [held])
        self.tree.unlock(node)

    def _adopt(self, row: int, given: np.ndarray, tree_pages: list[int], *, repoint: bool = True) -> None:
        """Where the tree kept its own page for a position the row computed again, free the row's
        copy and (``repoint``) point the row at the tree's.
        NOTE: a leaving row is not re-pointed: its table is released next, and re-pointing costs a
        host-to-device copy and a scatter a finished request (its output, repeated, is all duplicates)."""
        dup = np.flatnonzero(given != np.asarray(tree_pages, dtype=given.dtype))  # [duplicates]
        if dup.size == 0:
            return
        self.memory.free_pages(given[dup])
        if repoint:
            first = int(dup[0])  # duplicates form one run: the tree's pages are a prefix of the key
            self.memory.map_pages(row, first, tree_pages[first:first + dup.size])

    # ------------------------------------------------------------ memory
    def reclaimable_pages(self) -> int:
        """Free pages plus cached pages no request uses (evicted on demand)."""
        return self.memory.num_free_pages() + self.tree.evictable_pages

    def make_room(self, pages: int) -> bool:
        """Evict least recently used cached pages until ``pages`` pages are free; False if they
        cannot be (everything left is in use)."""
        short = pages - self.memory.num_free_pages()
        if short > 0:
            self.memory.free_pages(self.tree.evict(short))
        return self.memory.num_free_pages() >= pages

    def flush(self) -> int:
        """Drop every cached page no request uses; returns how many were freed."""
        freed = self.tree.reset()
        self.memory.free_pages(freed)
        return len(freed)

    def pages(self) -> list[int]:
        """Every page the cache holds."""
        return self.tree.pages()

    @property
    def cached_pages(self) -> int:
        return self.tree.total_pages

    @property
    def locked_pages(self) -> int:
        return self.tree.locked_pages
