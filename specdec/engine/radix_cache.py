"""RadixCache: a radix tree over integer keys at page granularity, with page locks and LRU eviction.

Glossary: a *key* is one int per KV position; a *page* holds ``page_size`` consecutive positions
(``specdec.engine.memory``). The tree stores, for every cached key sequence, the KV pages that hold
it; every edge carries whole pages, so a node's ``key`` has ``len(pages) * page_size`` entries and
a child is found by its first page's keys. With page_size = 2 and keys written as letters::

    root ── [a b | c d]  pages (4, 9) ──┬── [e f]  page 2        "abcdef"  -> pages 4 9 2
                                        └── [x y | z w] pages 5 1  "abcdxyzw" -> pages 4 9 5 1

    match("abcdxyq") -> pages (4, 9, 5): three whole pages; the tail "q" fills no page.
    insert("abcexx", pages (4, 7, 8)): "ab" is cached, "ce" differs from "cd", so the (4, 9) node
    splits after page 4 and "cexx" (pages 7, 8) hangs off the new "ab" node; returns (4, 7, 8).
    insert("abcdef", pages (3, 6, 8)): all cached; returns (4, 9, 2), and the caller frees its
    duplicates 3, 6 and 8.

This module knows nothing of tokens or tensors: the caller chooses the keys (the prefix cache keys
a position by its token and the next one, see ``specdec.engine.prefix_cache``) and owns the pages
(it frees what ``evict`` hands back and the duplicates ``insert`` reports).

Locks: a request that uses a cached prefix locks its deepest node, which locks every ancestor
(``lock_ref`` counts requests below). Only unlocked leaves are evicted, least recently used first
(a logical clock, so eviction is deterministic: tensor-parallel ranks must agree on it).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Sequence


class _Node:
    __slots__ = ("parent", "children", "key", "pages", "lock_ref", "last_access", "serial")
    _serials = itertools.count()

    def __init__(self, parent: "_Node | None", key: tuple[int, ...], pages: list[int], clock: int) -> None:
        self.parent = parent
        self.children: dict[tuple[int, ...], _Node] = {}  # by the child's first page of keys
        self.key = key  # [len(pages) * page_size]
        self.pages = pages
        self.lock_ref = 0
        self.last_access = clock
        self.serial = next(_Node._serials)  # breaks LRU ties the same way on every rank

    def lru_key(self) -> tuple[int, int]:
        return (self.last_access, self.serial)


@dataclasses.dataclass(frozen=True)
class Match:
    """The longest cached prefix of a key sequence: its pages and the node that ends it."""

    pages: list[int]
    node: _Node

    def __len__(self) -> int:
        return len(self.pages)


class RadixCache:
    def __init__(self, page_size: int) -> None:
        if page_size < 1:
            raise ValueError(f"RadixCache: page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self._clock = itertools.count(1)
        self.root = _Node(None, (), [], 0)
        self.root.lock_ref = 1  # never evicted
        self.evictable_pages = 0  # pages of nodes no request locks
        self.locked_pages = 0  # pages of nodes some request locks

    @property
    def total_pages(self) -> int:
        return self.evictable_pages + self.locked_pages

    # ------------------------------------------------------------------ lookup
    def match(self, keys: Sequence[int]) -> Match:
        """The cached pages of the longest whole-page prefix of ``keys``; marks them used now.

        A node matched part way is split, so the returned node ends exactly at the match.
        """
        node, pages, pos = self.root, [], 0
        clock = next(self._clock)
        node.last_access = clock
        while True:
            child = self._child(node, keys, pos)
            if child is None:
                break
            shared = self._shared_pages(child, keys, pos)
            if shared < len(child.pages):
                child = self._split(child, shared)
            child.last_access = clock
            pages.extend(child.pages)
            pos += len(child.key)
            node = child
        return Match(pages, node)

    def insert(self, keys: Sequence[int], pages: Sequence[int]) -> Match:
        """Cache ``pages`` (one per ``page_size`` keys) for ``keys``; returns the tree's pages for
        them afterwards and the node that ends them. Where the tree already held a prefix, the
        caller's pages there are duplicates: it frees each page it gave that differs from the
        returned one."""
        ps = self.page_size
        if len(keys) != len(pages) * ps:
            raise ValueError(f"insert: {len(keys)} keys for {len(pages)} pages of {ps}")
        node, out, pos = self.root, [], 0
        clock = next(self._clock)
        while pos < len(keys):
            child = self._child(node, keys, pos)
            if child is None:
                leaf = _Node(node, tuple(keys[pos:]), list(pages[pos // ps:]), clock)
                node.children[leaf.key[:ps]] = leaf
                self.evictable_pages += len(leaf.pages)
                out.extend(leaf.pages)
                node = leaf
                break
            shared = self._shared_pages(child, keys, pos)
            if shared < len(child.pages):
                child = self._split(child, shared)
            child.last_access = clock
            out.extend(child.pages)
            pos += len(child.key)
            node = child
        return Match(out, node)

    # ------------------------------------------------------------------ locks
    def lock(self, node: _Node) -> None:
        """A request uses the prefix ending at ``node``: none of it may be evicted."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_pages -= len(node.pages)
                self.locked_pages += len(node.pages)
            node.lock_ref += 1
            node = node.parent

    def unlocked_pages(self, node: _Node) -> int:
        """Pages of the prefix ending at ``node`` that no request locks: what ``lock(node)`` takes
        out of ``evictable_pages``."""
        pages = 0
        while node is not self.root and node.lock_ref == 0:  # a locked node's ancestors are locked
            pages += len(node.pages)
            node = node.parent
        return pages

    def unlock(self, node: _Node) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("RadixCache.unlock: node is not locked (unbalanced unlock)")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_pages += len(node.pages)
                self.locked_pages -= len(node.pages)
            node = node.parent

    # ------------------------------------------------------------------ eviction
    def evict(self, num_pages: int) -> list[int]:
        """Remove unlocked leaves, least recently used first, until ``num_pages`` pages are out
        (or nothing unlocked is left); returns the removed pages, which the caller frees."""
        heap = [(n.lru_key(), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_pages:
            _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key[: self.page_size]]
            self.evictable_pages -= len(leaf.pages)
            freed.extend(leaf.pages)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.lru_key(), parent))
        return freed

    def reset(self) -> list[int]:
        """Drop every unlocked node; returns their pages (locked prefixes stay)."""
        return self.evict(self.evictable_pages)

    def pages(self) -> list[int]:
        """Every page the tree holds (for invariant checks)."""
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.extend(node.pages)
            stack.extend(node.children.values())
        return out

    # ------------------------------------------------------------------ helpers
    def _child(self, node: _Node, keys: Sequence[int], pos: int) -> _Node | None:
        ps = self.page_size
        if len(keys) - pos < ps:
            return None
        return node.children.get(tuple(keys[pos:pos + ps]))

    def _shared_pages(self, child: _Node, keys: Sequence[int], pos: int) -> int:
        """Whole pages of ``child.key`` equal to ``keys[pos:]`` (at least 1: the lookup page)."""
        ps = self.page_size
        n = min(len(child.key), len(keys) - pos) // ps * ps
        i = ps
        while i < n and child.key[i] == keys[pos + i]:
            i += 1
        return i // ps

    def _split(self, node: _Node, pages: int) -> _Node:
        """Cut ``node`` after its first ``pages`` pages; returns the new upper part."""
        cut = pages * self.page_size
        upper = _Node(node.parent, node.key[:cut], node.pages[:pages], node.last_access)
        upper.lock_ref = node.lock_ref
        upper.children[node.key[cut:cut + self.page_size]] = node
        node.parent.children[node.key[: self.page_size]] = upper
        node.parent = upper
        node.key, node.pages = node.key[cut:], node.pages[pages:]
        return upper

    def _leaves(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out
