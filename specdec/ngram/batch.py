"""A whole batch's n-gram draft trees at once: ``tree.build_tree`` / ``tree.pack_trees`` vectorised
over requests, so a step's host cost grows by numpy elements, not by Python per request and node.

The per-request functions of ``specdec.ngram.tree`` are the specification (``build_trees_ref``
runs them row by row); ``tests/ngram/test_batch.py`` checks the fast paths against them on random
histories.

    find_matches_batch   every row's longest matching window and its latest ends: one compare
                         of the batch's histories with their last tokens, then narrowed a window
                         length at a time over the (row, end) candidates of all rows together
    build_trees_batch    chains: the latest match's continuation; BFS trees: the matches'
                         continuations merged a depth at a time (a node is the first match, by
                         recency, sharing its prefix), cut level by level; PROB: per request
    pack_batch           the verify's arrays, filled a node column at a time over the batch
    match_ends           where each row's latest longest match ends (the policy's view)

Shapes: bs rows, M = MAX_MATCHES ends a row, D = the largest draft-node limit of the batch.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specdec.ngram.config import NgramConfig
from specdec.ngram.tree import MAX_MATCHES, DraftTree, PackedTrees, build_tree



@dataclasses.dataclass(frozen=True)
class BatchTrees:
    """A batch's draft trees, the root excluded: row b's node i + 1 (i < sizes[b]) has token
    ``tokens[b, i]`` and parent ``parents[b, i]`` (0 = the root); parents before children, so
    any prefix of a row's nodes is a tree."""

    tokens: np.ndarray  # [bs, D] int64, 0 past a row's size
    parents: np.ndarray  # [bs, D] int64, 0 past a row's size
    sizes: np.ndarray  # [bs] int64

    def cut(self, nodes: int) -> list[DraftTree]:
        """Each row's tree cut to its first ``nodes`` nodes, as ``DraftTree``s."""
        sizes = np.minimum(self.sizes, nodes).tolist()
        return [DraftTree(t[:k], p[:k]) for t, p, k in zip(self.tokens.tolist(), self.parents.tolist(), sizes)]

    def cumulative_depth(self, width: int) -> np.ndarray:
        """[bs, width]: column m is the depth of row b's first m nodes (the root not counted),
        its whole tree's from m = sizes[b] on."""
        bs, d = self.tokens.shape
        depth = np.zeros((bs, d + 1), dtype=np.int64)  # [bs, D + 1] node i's depth, the root's 0
        rows = np.arange(bs)
        for i in range(d):
            depth[:, i + 1] = np.where(i < self.sizes, depth[rows, self.parents[:, i]] + 1, 0)
        cum = np.maximum.accumulate(depth, axis=1)  # [bs, D + 1]
        if width > d + 1:
            cum = np.concatenate([cum, np.repeat(cum[:, -1:], width - d - 1, axis=1)], axis=1)
        return cum[:, :width]


def find_matches_batch(history: np.ndarray, lengths: np.ndarray, *, min_n: int, max_n: int,
                       max_matches: int = MAX_MATCHES) -> tuple[np.ndarray, np.ndarray]:
    """(n, ends): each row's ``find_matches`` (``history`` [bs, >= max length], ``lengths`` [bs]):
    n [bs] (0: no match), ends [bs, max_matches] latest first, -1 past a row's matches."""
    bs = history.shape[0]
    ar = np.arange(bs)
    last = history[ar, np.maximum(lengths - 1, 0)]  # [bs]
    width = max(int(lengths.max()) - 1, 0)
    eq = history[:, :width] == last[:, None]  # [bs, width]
    eq &= np.arange(width) < (lengths - 1)[:, None]
    b, p = np.nonzero(eq)  # candidates (row, end) of window 1, by row then end
    best = np.zeros(bs, dtype=np.int64)
    levels = []
    n = 1
    while b.size and n <= max_n:
        if n >= min_n:
            best[b] = n
            levels.append((n, b, p))
        if n == max_n:
            break
        keep = p >= n
        b, p = b[keep], p[keep]
        keep = history[b, p - n] == history[b, lengths[b] - 1 - n]
        b, p = b[keep], p[keep]
        n += 1
    ends = np.full((bs, max_matches), -1, dtype=np.int64)
    if not levels:
        return best, ends
    picked = [(b[best[b] == n], p[best[b] == n]) for n, b, p in levels]
    b = np.concatenate([x for x, _ in picked])
    p = np.concatenate([y for _, y in picked])
    order = np.lexsort((-p, b))  # by row, latest first
    b, p = b[order], p[order]
    rank = np.arange(b.size) - np.searchsorted(b, b)
    keep = rank < max_matches
    ends[b[keep], rank[keep]] = p[keep]
    return best, ends


def build_trees_batch(history: np.ndarray, lengths: np.ndarray, config: NgramConfig,
                      limits: np.ndarray) -> BatchTrees:
    """Each row's ``build_tree(history[b, :lengths[b]], config, max_nodes=limits[b])``."""
    bs = history.shape[0]
    width = max(int(limits.max()), 1) if bs else 1
    if config.match_type == "PROB" and not config.is_chain:
        return build_trees_ref(history, lengths, config, limits)
    n, ends = find_matches_batch(history, lengths, min_n=config.min_match_window, max_n=config.max_match_window)
    live = (n > 0) & (limits > 0) & (lengths >= 2)
    n, ends = np.where(live, n, 0), np.where(live[:, None], ends, -1)
    # the ends columns some row uses (the [bs, M, M] work of trees grows with M squared)
    ends = ends[:, : 1 if config.is_chain else max(int((ends >= 0).sum(1).max()), 1)]
    cont, valid = _continuations(history, lengths, ends, np.where(live, limits, 0), width)
    if config.is_chain:
        tokens = np.where(valid[:, 0], cont[:, 0], 0)
        sizes = valid[:, 0].sum(1)
        parents = np.where(valid[:, 0], np.arange(width), 0)
        return BatchTrees(tokens, parents, sizes)
    return _breadth_first(cont, valid, n, limits, config, width)


def build_trees_ref(history: np.ndarray, lengths: np.ndarray, config: NgramConfig,
                    limits: np.ndarray) -> BatchTrees:
    """``build_trees_batch``'s specification: ``tree.build_tree`` row by row (also its path for
    PROB trees, and for small batches, where numpy's per-call cost outweighs the rows' work)."""
    bs = history.shape[0]
    width = max(int(limits.max()), 1) if bs else 1
    tokens = np.zeros((bs, width), dtype=np.int64)
    parents = np.zeros((bs, width), dtype=np.int64)
    sizes = np.zeros(bs, dtype=np.int64)
    for b in range(bs):
        tree = build_tree(history[b, : lengths[b]], config, max_nodes=int(limits[b]))
        sizes[b] = len(tree)
        tokens[b, : len(tree)], parents[b, : len(tree)] = tree.tokens, tree.parents
    return BatchTrees(tokens, parents, sizes)


def _continuations(history, lengths, ends, limits, width) -> tuple[np.ndarray, np.ndarray]:
    """cont [bs, M, D]: history[b, ends[b, m] + 1 + j], past the row's history the repeat continued
    (``lookup.continuation``: j modulo d = lengths[b] - 1 - ends[b, m]); valid where the match exists
    and j < limits[b]."""
    j = np.arange(width)
    period = np.maximum(lengths[:, None] - 1 - ends, 1)  # [bs, M] d (1 where no match)
    pos = ends[:, :, None] + 1 + j % period[:, :, None]  # [bs, M, D]
    valid = (ends[:, :, None] >= 0) & (j < limits[:, None, None])
    rows = np.arange(history.shape[0])[:, None, None]
    cont = history[rows, np.where(valid, pos, 0)].astype(np.int64)
    return cont, valid


def _breadth_first(cont, valid, n, limits, config: NgramConfig, width: int) -> BatchTrees:
    """The tries of the rows' continuations cut breadth-first (``tree._breadth_first``).

    A trie node at depth j is named by its first match m (the latest through it): node (b, m, j)
    is ``first[b, m] == m`` there. Its children keep recency order (by first match), and a node at
    depth j keeps its first max(1, int(breadth_j)) children, breadth_0 the row's root breadth, each
    level ``breadth_scale`` less (repeated subtraction, as the reference's, for equal rounding)."""
    bs, m_count, _ = cont.shape
    ar = np.arange(m_count)
    tokens = np.zeros((bs, width), dtype=np.int64)
    parents = np.zeros((bs, width), dtype=np.int64)
    sizes = np.zeros(bs, dtype=np.int64)
    breadth = (config.max_match_window - n) * config.breadth_scale + config.min_bfs_breadth  # [bs] float
    parent_first = np.zeros((bs, m_count), dtype=np.int64)  # the match naming each match's depth j - 1 node
    parent_node = np.zeros((bs, m_count), dtype=np.int64)  # that node's tree index (0: root), -1: not kept
    for j in range(width):
        ok = valid[:, :, j] & (parent_node >= 0)  # [bs, M]
        if not ok.any():
            break
        same = (cont[:, :, None, j] == cont[:, None, :, j]) & (parent_first[:, :, None] == parent_first[:, None, :])
        same &= ok[:, None, :]
        first = np.where(ok, same.argmax(2), -1)  # [bs, M] the node's name: its latest match
        is_node = ok & (first == ar)  # [bs, M] one entry per trie node at depth j
        # children of one parent in recency order: rank among the parent's nodes of smaller m
        sib = is_node[:, None, :] & (parent_first[:, :, None] == parent_first[:, None, :]) & (ar < ar[:, None])
        rank = sib.sum(2)  # [bs, M]
        keep_n = np.maximum(1, breadth.astype(np.int64))  # [bs] children a depth-j parent keeps
        kept = is_node & (rank < keep_n[:, None])
        # BFS order at this depth: by parent's tree index, then recency
        b, m = np.nonzero(kept)
        order = np.lexsort((m, parent_node[b, m], b))
        b, m = b[order], m[order]
        index = sizes[b] + 1 + (np.arange(b.size) - np.searchsorted(b, b))  # [k] tree node numbers
        fits = index <= limits[b]
        b, m, index = b[fits], m[fits], index[fits]
        tokens[b, index - 1] = cont[b, m, j]
        parents[b, index - 1] = parent_node[b, m]
        np.add.at(sizes, b, 1)
        node_index = np.full((bs, m_count), -1, dtype=np.int64)
        node_index[b, m] = index
        # every match continues from its depth-j node: its name and tree index (-1: cut)
        parent_node = np.where(ok, np.take_along_axis(node_index, np.maximum(first, 0), 1), -1)
        parent_first = first
        breadth = breadth - config.breadth_scale
    return BatchTrees(tokens, parents, sizes)


def pack_batch(trees: BatchTrees, roots: np.ndarray, n: int, *, out: np.ndarray | None = None) -> PackedTrees:
    """``pack_trees`` of the rows' trees cut to n - 1 nodes, a node column at a time. ``out``: an
    int64 host buffer [bs, 4n + n*n] to fill in place (tokens, depth, next_token, next_sibling,
    mask: the layout ``worker.device_tree`` copies in one go); the result's arrays view it."""
    bs = trees.tokens.shape[0]
    buf = np.empty((bs, 4 * n + n * n), dtype=np.int64) if out is None else out
    tokens, depth, next_token, next_sibling = (buf[:, k * n: (k + 1) * n] for k in range(4))
    mask = buf[:, 4 * n:].reshape(bs, n, n)
    tokens[:] = roots[:, None]
    depth[:] = 0
    next_token[:] = -1
    next_sibling[:] = -1
    mask[:] = 0
    mask[:, np.arange(n), np.arange(n)] = 1
    rows = np.arange(bs)
    sizes = np.minimum(trees.sizes, n - 1)
    last_child = np.full((bs, n), -1, dtype=np.int64)  # [bs, n] each node's latest child so far
    for i in range(1, min(n, trees.tokens.shape[1] + 1)):
        b = rows[i <= sizes]
        if not b.size:
            break
        parent = trees.parents[b, i - 1]
        tokens[b, i] = trees.tokens[b, i - 1]
        mask[b, i] = mask[b, parent]
        mask[b, i, i] = 1
        depth[b, i] = depth[b, parent] + 1
        prev = last_child[b, parent]
        has = prev >= 0
        next_sibling[b[has], prev[has]] = i
        next_token[b[~has], parent[~has]] = i
        last_child[b, parent] = i
    return PackedTrees(tokens, mask, depth, next_token, next_sibling)  # mask as int64 0 / 1


def match_ends(history: np.ndarray, lengths: np.ndarray, *, min_n: int, max_n: int) -> np.ndarray:
    """[bs] where each row's latest longest match ends (``history`` [bs, >= max length], ``lengths`` [bs]);
    -1 without a match: ``find_matches_batch``'s, as ``lookup.latest_longest_match_end`` finds it row by row."""
    if int(lengths.max(initial=0)) < 2:
        return np.full(len(lengths), -1, dtype=np.int64)
    n, ends = find_matches_batch(history, lengths, min_n=min_n, max_n=max_n)
    return np.where(n > 0, ends[:, 0], -1)
