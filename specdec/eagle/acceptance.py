"""How often the target accepts the draft's children, per depth, parent rank and rank, and what that predicts.

Glossary (with docs/architecture.md): depth d = 1..S (the root's children are depth 1); rank
r = 0..K-1, a child's place among its siblings in draft-probability order (smaller node index =
higher draft probability, and the children a tree keeps of a node are always its best ranks). The
*hazard* ``h[d-1, p, r]`` is the probability that the rank-r child is accepted, given that the
accepted path reached its parent, that parent is of rank p (the root counts as rank 0) and the
parent's children of rank < r were rejected. Greedy verification walks a node's children in rank
order and accepts the first that matches, so one verify step observes, per request, for every
depth on its accepted path: ranks < r tried and rejected, rank r accepted; and at the depth after
its last accepted node: every child present tried and rejected (censored: the accepted rank, if
any, was not in the tree).

Why the parent's rank: the children of the draft's first choice are accepted more often than
those of a lower-ranked parent (the SmolLM2 head on MT-bench: the first child at depth 2 0.656 of
the time under the first choice, 0.576 under the second), so a model that pools parents
underestimates chains, whose every node is a first choice. A table of P < K parent rows serves
ranks >= P - 1 with its last row; P = 1 (a ``[depth, rank]`` table) ignores the parent.

From hazards, the probability that a node is on the accepted path is the product over its path of
``q[d, p, r] = h[d, p, r] * prod_{j<r} (1 - h[d, p, j])``, and a tree's expected committed tokens
are 1 + the sum of its nodes' probabilities. ``expected_committed`` builds, for a shape (S, K, N),
the tree the EAGLE-2 draft loop would build if the draft's confidences were these probabilities
(depth 1: the root's K children; each further depth: the K children of each of the previous
depth's K best nodes; the N - 1 best of all kept): a static estimate of what the dynamic tree
(which ranks by the draft's own confidence) commits. The synthetic benchmark builds exactly this
tree (``DraftRunner.rank_probs``). Worked example, P = 1, K = 2, h = [[.8, .5], [.6, .5]]:
    q = [[.8, .1], [.6, .2]]; nodes of (2, 2, 4): d1r0 .8, d2r0 .48 (= .8 * .6), d2r1 .16 (= .8 * .2)
    -> 1 + .8 + .48 + .16 = 2.44 committed tokens per step; the chain (2, 1, 3): 1 + .8 + .48 = 2.28.
With parent rows, h[1] = [[.6, .5], [.3, .5]] (depth 2 under a rank-0 / a rank-1 parent): the
depth-1 rank-1 node .1 now has children .1 * .3 = .03 and .1 * .35 = .035.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np


@dataclasses.dataclass(frozen=True)
class AcceptanceModel:
    # [max_depth, parent ranks P, max_topk] hazards h[d-1, p, r] in [0, 1]; a [depth, rank] table is P = 1
    hazards: np.ndarray

    def __post_init__(self) -> None:
        h = np.asarray(self.hazards, dtype=np.float64)
        if h.ndim == 2:
            h = h[:, None, :]
        if h.ndim != 3 or h.size == 0 or not np.all((h >= 0) & (h <= 1)):
            raise ValueError("acceptance model: hazards must be a non-empty [depth, rank] or [depth, parent rank, "
                             f"rank] table in [0, 1], got {self.hazards!r}")
        object.__setattr__(self, "hazards", h)

    @property
    def max_depth(self) -> int:
        return self.hazards.shape[0]

    @property
    def parent_ranks(self) -> int:
        return self.hazards.shape[1]

    @property
    def max_topk(self) -> int:
        return self.hazards.shape[2]

    def by_parent(self, parent_ranks: int) -> np.ndarray:
        """[max_depth, parent_ranks, max_topk] hazards, ranks past this table's last parent row on it."""
        return self.hazards[:, np.minimum(np.arange(parent_ranks), self.parent_ranks - 1), :]

    def child_probs(self) -> np.ndarray:
        """[max_depth, P, max_topk] q[d, p, r]: P(the accepted child at depth d + 1 has rank r | parent of
        rank p reached)."""
        h = self.hazards
        survive = np.cumprod(np.concatenate([np.ones(h.shape[:2] + (1,)), 1 - h[..., :-1]], axis=2), axis=2)
        return h * survive

    def expected_committed(self, num_steps: int, topk: int, num_draft_tokens: int) -> float:
        """1 + the summed path probabilities of the nodes an (S, K, N) EAGLE tree keeps.

        The tree is built as the draft loop builds it, with the model's child probabilities for
        scores: depth 1 holds the root's K children; every further depth the K children of each of
        the previous depth's K best nodes, scored by their parent's row; the tree keeps the N - 1
        best of all (a child never scores above its parent, so a kept node's ancestors are kept).
        """
        if num_steps > self.max_depth or topk > self.max_topk:
            raise ValueError(f"acceptance model covers depth {self.max_depth}, topk {self.max_topk}; "
                             f"asked for ({num_steps}, {topk}, {num_draft_tokens})")
        q = self.child_probs()[:, :, :topk]
        last_parent = self.parent_ranks - 1
        level = q[0, 0]  # [K] path probabilities of this depth's candidates, ranks 0..K-1 in order
        candidates = [level]
        for depth in range(1, num_steps):
            best = np.argsort(-level, kind="stable")[:topk]  # this depth's frontier
            rank = np.minimum(best % topk, last_parent)  # each frontier node's rank among its siblings
            level = (level[best, None] * q[depth, rank]).ravel()
            candidates.append(level)
        kept = np.sort(np.concatenate(candidates))[::-1][: num_draft_tokens - 1]
        return 1.0 + float(kept.sum())

    def to_json(self) -> dict:
        h = self.hazards[:, 0] if self.parent_ranks == 1 else self.hazards
        return {"hazards": np.round(h, 4).tolist()}

    @classmethod
    def from_json(cls, data: dict) -> "AcceptanceModel":
        return cls(np.asarray(data["hazards"], dtype=np.float64))

    @classmethod
    def load(cls, path: str | Path) -> "AcceptanceModel":
        return cls.from_json(json.loads(Path(path).read_text()))

    @classmethod
    def uniform(cls, hazard: float, *, max_depth: int, max_topk: int) -> "AcceptanceModel":
        """A prior: every child of every depth accepted with the same hazard."""
        return cls(np.full((max_depth, 1, max_topk), hazard))

    @classmethod
    def from_counts(cls, tried: np.ndarray, accepted: np.ndarray, *, pseudo_counts: float) -> "AcceptanceModel":
        """Hazards from [D, P, K] counts, each parent row shrunk toward the row pooled over parents by
        ``pseudo_counts`` of its rate (sparse rows, the deep ranks of low-ranked parents, stay near
        the pool; a cell nothing reached is the pool's, or 0 if no parent reached its rank). Ranks
        are in draft-probability order, so a child is modelled as accepted no more often than its
        higher-ranked sibling: where a sparse cell says otherwise, its q is cut to its sibling's."""
        tried_all, accepted_all = tried.sum(1, keepdims=True), accepted.sum(1, keepdims=True)
        pooled = np.where(tried_all > 0, accepted_all / np.maximum(tried_all, 1), 0.0)  # [D, 1, K]
        weight = tried + pseudo_counts
        rates = cls(np.where(weight > 0, (accepted + pseudo_counts * pooled) / np.maximum(weight, 1e-12), pooled))
        q = np.minimum.accumulate(rates.child_probs(), axis=2)  # [D, P, K] non-increasing in rank
        untaken = 1 - np.concatenate([np.zeros(q.shape[:2] + (1,)), np.cumsum(q, axis=2)[..., :-1]], axis=2)
        return cls(np.clip(np.where(untaken > 1e-12, q / np.maximum(untaken, 1e-12), 0.0), 0.0, 1.0))


@dataclasses.dataclass
class PathObservations:
    """Counts from verify steps: [max_depth, max_topk (parent rank), max_topk] children tried and accepted."""

    tried: np.ndarray
    accepted: np.ndarray


def observe_paths(
    accept_index: np.ndarray,  # [bs, S+1] local node of the accepted path at each depth, -1 past it
    next_token: np.ndarray,  # [bs, N] first (best-ranked) child of each node, -1 for leaves
    next_sibling: np.ndarray,  # [bs, N] next-ranked sibling of each node, -1 for the last
    *,
    max_depth: int,
    max_topk: int,
) -> PathObservations:
    """Which ranks each request's accepted path tried and accepted at every depth, by the rank of
    the node it tried them under (module doc): a walk along each path, a few dozen Python steps a
    request. The adaptive policy observes a few requests' paths of every verify step (the worker's
    OBSERVED_PATHS_PER_STEP), host time of every step."""
    shape = (max_depth, max_topk, max_topk)
    tried, accepted = np.zeros(shape), np.zeros(shape)
    for path, first, sibling in zip(accept_index.tolist(), next_token.tolist(), next_sibling.tolist()):
        under = 0  # the parent's rank among its siblings (the root's: 0)
        for d in range(1, min(len(path) - 1, max_depth) + 1):
            parent, child = path[d - 1], path[d]
            if parent < 0:  # (no path: nothing tried)
                break
            rank, node = 0, first[parent]  # walk the parent's children in rank order (at most max_topk)
            while node >= 0 and rank < max_topk and node != child:
                rank, node = rank + 1, sibling[node]
            row = min(under, max_topk - 1)
            if child < 0:  # stopped here: every child present was tried
                tried[d - 1, row, :rank] += 1
                break
            rank = rank if rank < max_topk else 0  # (a child past max_topk ranks 0)
            tried[d - 1, row, :rank + 1] += 1
            accepted[d - 1, row, rank] += 1
            under = rank
    return PathObservations(tried, accepted)


class AcceptanceStats:
    """Online hazards by parent rank: observed counts, forgetting old ones, over a prior's pseudo-counts."""

    def __init__(self, prior: AcceptanceModel, *, prior_weight: float = 16.0, horizon: float = 4096.0) -> None:
        # horizon: observations (tried rank-0 children) after which old counts weigh 1/e
        self.prior = prior
        self.prior_weight = prior_weight
        self.horizon = horizon
        self.prior_hazards = prior.by_parent(prior.max_topk)  # [D, K, K]
        self.tried = np.zeros_like(self.prior_hazards)
        self.accepted = np.zeros_like(self.prior_hazards)

    def update(self, obs: PathObservations) -> None:
        depth, parents, topk = obs.tried.shape
        decay = np.exp(-obs.tried[..., 0].sum() / self.horizon)
        self.tried *= decay
        self.accepted *= decay
        self.tried[:depth, :parents, :topk] += obs.tried
        self.accepted[:depth, :parents, :topk] += obs.accepted

    def model(self) -> AcceptanceModel:
        """Each cell's counts over ``prior_weight`` pseudo-counts of a base that moves with the data:
        the prior's cell, shifted by how far the rate pooled over parents has moved from the prior's
        first-parent row (most tries hang under first choices). Rows under lower-ranked parents,
        rarely reached, so follow a head unlike the prior instead of waiting for their own counts."""
        w = self.prior_weight
        first = self.prior_hazards[:, 0]  # [D, K] the prior under a first-choice parent
        pooled = (self.accepted.sum(1) + w * first) / (self.tried.sum(1) + w)  # [D, K]
        base = np.clip(self.prior_hazards + (pooled - first)[:, None, :], 0.0, 1.0)  # [D, K, K]
        return AcceptanceModel((self.accepted + w * base) / (self.tried + w))

    @property
    def observations(self) -> float:
        return float(self.tried[0].sum())
