"""Draft trees from n-gram matches, built on the host, packed into the verify's tree structures.

Glossary: history = a request's tokens so far (prompt + output), its last token the root; a
*match* of length n ends at p < L - 1 when history[p - n + 1 : p + 1] == history[L - n : L]
(``specdec.ngram.lookup``); its *continuation* is history[p + 1 : p + 1 + depth], continued past the
history's end as the repeat of period L - 1 - p it found (``lookup.continuation``: in a run of one token
the latest match leaves one token after it, so a draft cut there would be one token long). The drafter
takes the longest n in [min, max] that matches and merges the continuations of its latest
matches into a trie (siblings distinct, as lossless tree sampling needs); the draft tree is a
part of that trie, chosen as SGLang's n-gram cache chooses it:

    BFS   breadth-first; a node keeps its first ``breadth`` children by recency (the latest match
          through it first); the root's breadth is ``NgramConfig.root_breadth(n)``, each level
          ``breadth_scale`` less (at least 1)
    PROB  best-first by path probability: a child's probability is its parent's times its share
          of the matches through the parent, among the parent's ``max_bfs_breadth`` most frequent

Worked example (BFS, breadth 2 at the root, 1 below, 4 nodes), root token 9::

    history  ... 9 4 5 6 ... 9 4 7 ... 9 8 1 ... 9        matches of "9", latest first
    trie     root -> 8 -> 1,  root -> 4 -> 7,  4 -> 5 -> 6 (older)
    tree     node 1 = 8 (root), node 2 = 4 (root), node 3 = 1 (node 1), node 4 = 7 (node 2)

Nodes come out in topological order (parents first), so any prefix of them is a tree too.
``pack_trees`` turns a batch's node lists into the arrays ``specdec.eagle.tree.BuiltTree`` holds.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from specdec.ngram.config import NgramConfig
from specdec.ngram.lookup import continuation

# matches of the longest n-gram whose continuations are merged (the latest ones): bounds the host's work
MAX_MATCHES = 32


@dataclasses.dataclass(frozen=True)
class DraftTree:
    """One request's draft, the root excluded: node i + 1 has ``tokens[i]`` and parent ``parents[i]``
    (0 = the root), parents before children."""

    tokens: list[int]
    parents: list[int]

    def __len__(self) -> int:
        return len(self.tokens)

    def depth(self) -> int:
        """Nodes on the longest root-to-leaf path, the root not counted."""
        depths = [0]
        for p in self.parents:
            depths.append(depths[p] + 1)
        return max(depths)

    def cut(self, nodes: int) -> "DraftTree":
        return DraftTree(self.tokens[:nodes], self.parents[:nodes])


EMPTY = DraftTree([], [])


def find_matches(history: np.ndarray, *, min_n: int, max_n: int) -> tuple[int, np.ndarray]:
    """(n, ends): the longest n in [min_n, max_n] whose suffix occurs earlier, and the end
    positions of its latest ``MAX_MATCHES`` occurrences, latest first ((0, []) when none does).

    Narrows the positions holding the last token one earlier token at a time (a tree needs several ends;
    ``lookup.latest_longest_match_end``, the latest one alone, bisects over n instead)."""
    length = history.shape[0]
    candidates = np.flatnonzero(history[:-1] == history[-1])  # [c] ends of matches of length 1
    best_n, best = 0, candidates[:0]
    n = 1
    while candidates.size and n <= max_n:
        if n >= min_n:
            best_n, best = n, candidates
        if n == max_n:
            break
        keep = candidates[candidates - n >= 0]
        candidates = keep[history[keep - n] == history[length - 1 - n]]
        n += 1
    return best_n, best[::-1][:MAX_MATCHES]


def build_tree(history: np.ndarray, config: NgramConfig, *, max_nodes: int) -> DraftTree:
    """The request's draft tree of at most ``max_nodes`` nodes (EMPTY when nothing matches)."""
    if max_nodes <= 0 or history.shape[0] < 2:
        return EMPTY
    n, ends = find_matches(history, min_n=config.min_match_window, max_n=config.max_match_window)
    if n == 0:
        return EMPTY
    if config.is_chain:  # the latest match's continuation: no trie needed
        tokens = continuation(history, int(ends[0]), max_nodes, repeat=True).tolist()
        return DraftTree(tokens, list(range(len(tokens))))
    trie = _Trie.of(history, ends, depth=max_nodes)
    if config.match_type == "PROB":
        return _best_first(trie, config.max_bfs_breadth, max_nodes)
    return _breadth_first(trie, config.root_breadth(n), config.breadth_scale, max_nodes)


class _Trie:
    """The continuations of the matches merged: node 0 is the root; each node's children in
    insertion (recency) order, with how many continuations pass through each."""

    def __init__(self) -> None:
        self.token: list[int] = [-1]
        self.count: list[int] = [0]
        self.children: list[dict[int, int]] = [{}]

    @classmethod
    def of(cls, history: np.ndarray, ends: np.ndarray, *, depth: int) -> "_Trie":
        trie = cls()
        for end in ends.tolist():  # latest first: a node's first children are the most recent
            node = 0
            for token in continuation(history, end, depth, repeat=True).tolist():
                child = trie.children[node].get(token)
                if child is None:
                    child = len(trie.token)
                    trie.children[node][token] = child
                    trie.token.append(token)
                    trie.count.append(0)
                    trie.children.append({})
                trie.count[child] += 1
                node = child
        return trie


def _breadth_first(trie: _Trie, breadth: float, scale: float, max_nodes: int) -> DraftTree:
    tokens, parents = [], []
    queue = [(0, 0, breadth)]  # (trie node, tree node, its breadth)
    head = 0
    while head < len(queue) and len(tokens) < max_nodes:
        node, tree_node, width = queue[head]
        head += 1
        for child in list(trie.children[node].values())[: max(1, int(width))]:
            if len(tokens) == max_nodes:
                break
            tokens.append(trie.token[child])
            parents.append(tree_node)
            queue.append((child, len(tokens), width - scale))
    return DraftTree(tokens, parents)


def _best_first(trie: _Trie, top_k: int, max_nodes: int) -> DraftTree:
    tokens, parents = [], []
    heap: list[tuple[float, int, int, int]] = []  # (-probability, order, trie node, tree parent)
    order = 0

    def push_children(node: int, tree_node: int, prob: float) -> None:
        nonlocal order
        kids = sorted(trie.children[node].values(), key=lambda c: -trie.count[c])[:top_k]  # stable: recency ties
        total = sum(trie.count[c] for c in kids) or 1
        for c in kids:
            heapq.heappush(heap, (-prob * trie.count[c] / total, order, c, tree_node))
            order += 1

    push_children(0, 0, 1.0)
    while heap and len(tokens) < max_nodes:
        neg_prob, _, node, parent = heapq.heappop(heap)
        tokens.append(trie.token[node])
        parents.append(parent)
        push_children(node, len(tokens), -neg_prob)
    return DraftTree(tokens, parents)


@dataclasses.dataclass(frozen=True)
class PackedTrees:
    """A batch's trees as the verify reads them (local node indices; padding past each tree)."""

    # [bs, n] int64 node tokens; the root column is filled from the device, padding repeats the root
    tokens: np.ndarray
    # [bs, n, n] bool: node i sees node j (ancestor or itself); a padding node sees only itself
    mask: np.ndarray
    # [bs, n] int64 depth below the root (padding: 0)
    depth: np.ndarray
    # [bs, n] int64 first child / next sibling, -1 for none; padding nodes are unreachable
    next_token: np.ndarray
    next_sibling: np.ndarray


def pack_trees(trees: list[DraftTree], roots: list[int], n: int) -> PackedTrees:
    """Pad each tree to ``n`` nodes (the root first), the layout ``reconstruct_indices_from_tree_mask``
    would recover from the mask::

        tree root -> {1, 2}, 1 -> {3}, n = 5      mask     depth  next_token  next_sibling
                                                  1 0 0 0 0   0      1           -1
                                                  1 1 0 0 0   1      3            2
                                                  1 0 1 0 0   1     -1           -1
                                                  1 1 0 1 0   2     -1           -1
                                      padding     0 0 0 0 1   0     -1           -1
    """
    bs = len(trees)
    tokens = np.repeat(np.asarray(roots, dtype=np.int64)[:, None], n, axis=1)  # [bs, n]
    mask = np.zeros((bs, n, n), dtype=bool)
    mask[:, np.arange(n), np.arange(n)] = True
    depth = np.zeros((bs, n), dtype=np.int64)
    next_token = np.full((bs, n), -1, dtype=np.int64)
    next_sibling = np.full((bs, n), -1, dtype=np.int64)
    for b, tree in enumerate(trees):
        if len(tree) >= n:
            raise ValueError(f"a tree of {len(tree)} draft nodes does not fit {n} verify nodes (root included)")
        last_child = {}
        for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents), start=1):
            tokens[b, i] = token
            mask[b, i] = mask[b, parent]
            mask[b, i, i] = True
            depth[b, i] = depth[b, parent] + 1
            if parent in last_child:
                next_sibling[b, last_child[parent]] = i
            else:
                next_token[b, parent] = i
            last_child[parent] = i
    return PackedTrees(tokens, mask, depth, next_token, next_sibling)
