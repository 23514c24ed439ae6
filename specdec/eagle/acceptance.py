"""How often the target accepts the draft's children, per depth and rank, and what that predicts.

Glossary (with docs/architecture.md): depth d = 1..S (the root's children are depth 1); rank
r = 0..K-1, a child's place among its siblings in draft-probability order (smaller node index =
higher draft probability, and the children a tree keeps of a node are always its best ranks). The
*hazard* ``h[d-1, r]`` is the probability that the rank-r child is accepted, given that the
accepted path reached its parent and the parent's children of rank < r were rejected. Greedy
verification walks a node's children in rank order and accepts the first that matches, so one
verify step observes, per request, for every depth on its accepted path: ranks < r tried and
rejected, rank r accepted; and at the depth after its last accepted node: every child present
tried and rejected (censored: the accepted rank, if any, was not in the tree).

From hazards, the probability that a node is on the accepted path is the product over its path of
``q[d, r] = h[d, r] * prod_{j<r} (1 - h[d, j])``, and a tree's expected committed tokens are
1 + the sum of its nodes' probabilities. ``expected_committed`` builds, for a shape (S, K, N),
the tree the EAGLE-2 draft loop would build if the draft's confidences were these probabilities
(depth 1: the root's K children; each further depth: the K children of each of the previous
depth's K best nodes; the N - 1 best of all kept): a static estimate of what the dynamic tree
(which ranks by the draft's own confidence) commits. The synthetic benchmark builds exactly this
tree (``DraftRunner.rank_probs``). Worked example, K = 2, h = [[.8, .5], [.6, .5]]:
    q = [[.8, .1], [.6, .2]]; nodes of (2, 2, 4): d1r0 .8, d2r0 .48 (= .8 * .6), d2r1 .16 (= .8 * .2)
    -> 1 + .8 + .48 + .16 = 2.44 committed tokens per step; the chain (2, 1, 3): 1 + .8 + .48 = 2.28.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np


@dataclasses.dataclass(frozen=True)
class AcceptanceModel:
    # [max_depth, max_topk] hazards h[d-1, r] in [0, 1]
    hazards: np.ndarray

    def __post_init__(self) -> None:
        h = np.asarray(self.hazards, dtype=np.float64)
        if h.ndim != 2 or h.size == 0 or not np.all((h >= 0) & (h <= 1)):
            raise ValueError(f"acceptance model: hazards must be a non-empty [depth, rank] table in [0, 1], got {h!r}")
        object.__setattr__(self, "hazards", h)

    @property
    def max_depth(self) -> int:
        return self.hazards.shape[0]

    @property
    def max_topk(self) -> int:
        return self.hazards.shape[1]

    def child_probs(self) -> np.ndarray:
        """[max_depth, max_topk] q[d, r]: P(the accepted child at depth d + 1 has rank r | parent reached)."""
        h = self.hazards
        survive = np.cumprod(np.concatenate([np.ones((h.shape[0], 1)), 1 - h[:, :-1]], axis=1), axis=1)
        return h * survive

    def expected_committed(self, num_steps: int, topk: int, num_draft_tokens: int) -> float:
        """1 + the summed path probabilities of the nodes an (S, K, N) EAGLE tree keeps.

        The tree is built as the draft loop builds it, with the model's child probabilities for
        scores: depth 1 holds the root's K children; every further depth the K children of each of
        the previous depth's K best nodes; the tree keeps the N - 1 best of all (a child never
        scores above its parent, so a kept node's ancestors are kept).
        """
        if num_steps > self.max_depth or topk > self.max_topk:
            raise ValueError(f"acceptance model covers depth {self.max_depth}, topk {self.max_topk}; "
                             f"asked for ({num_steps}, {topk}, {num_draft_tokens})")
        q = self.child_probs()
        level = q[0, :topk]  # path probabilities of this depth's candidates
        candidates = [level]
        for depth in range(1, num_steps):
            expanded = np.sort(level)[::-1][:topk]
            level = (expanded[:, None] * q[depth, :topk][None, :]).ravel()
            candidates.append(level)
        kept = np.sort(np.concatenate(candidates))[::-1][: num_draft_tokens - 1]
        return 1.0 + float(kept.sum())

    def to_json(self) -> dict:
        return {"hazards": [[round(float(x), 4) for x in row] for row in self.hazards]}

    @classmethod
    def from_json(cls, data: dict) -> "AcceptanceModel":
        return cls(np.asarray(data["hazards"], dtype=np.float64))

    @classmethod
    def load(cls, path: str | Path) -> "AcceptanceModel":
        return cls.from_json(json.loads(Path(path).read_text()))

    @classmethod
    def uniform(cls, hazard: float, *, max_depth: int, max_topk: int) -> "AcceptanceModel":
        """A prior: every child of every depth accepted with the same hazard."""
        return cls(np.full((max_depth, max_topk), hazard))


@dataclasses.dataclass
class PathObservations:
    """Counts from verify steps: [max_depth, max_topk] children tried and children accepted."""

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
    """Which ranks each request's accepted path tried and accepted at every depth (module doc)."""
    bs, n = next_token.shape
    rows = np.arange(bs)
    # rank of every node among its siblings, and each node's number of children
    rank = np.full((bs, n), -1, dtype=np.int64)
    children = np.zeros((bs, n), dtype=np.int64)
    cur = next_token.copy()  # [bs, N] the r-th child of each node, in round r
    for r in range(max_topk):
        b, p = np.nonzero(cur >= 0)
        if b.size == 0:
            break
        child = cur[b, p]
        rank[b, child] = r
        children[b, p] += 1
        cur = np.full_like(cur, -1)
        cur[b, p] = next_sibling[b, child]
    tried = np.zeros((max_depth, max_topk))
    accepted = np.zeros((max_depth, max_topk))
    depths = accept_index.shape[1] - 1
    alive = np.ones(bs, dtype=bool)
    for d in range(1, min(depths, max_depth) + 1):
        parent = accept_index[:, d - 1]
        child = accept_index[:, d]
        took = alive & (child >= 0)
        r = np.where(took, rank[rows, np.maximum(child, 0)], 0)
        # accepted at rank r: ranks < r tried and rejected, r tried and accepted
        for j in range(max_topk):
            tried[d - 1, j] += np.count_nonzero(took & (j <= r))
        np.add.at(accepted[d - 1], r[took], 1)
        # rejected at this depth: every child present was tried (censored beyond them)
        stopped = alive & (child < 0) & (parent >= 0)
        present = np.minimum(children[rows, np.maximum(parent, 0)], max_topk)
        for j in range(max_topk):
            tried[d - 1, j] += np.count_nonzero(stopped & (j < present))
        alive = took
    return PathObservations(tried, accepted)


class AcceptanceStats:
    """Online hazards: observed counts, forgetting old ones, over a prior's pseudo-counts."""

    def __init__(self, prior: AcceptanceModel, *, prior_weight: float = 16.0, horizon: float = 4096.0) -> None:
        # horizon: observations (tried children at a depth) after which old counts weigh 1/e
        self.prior = prior
        self.prior_weight = prior_weight
        self.horizon = horizon
        self.tried = np.zeros_like(prior.hazards)
        self.accepted = np.zeros_like(prior.hazards)

    def update(self, obs: PathObservations) -> None:
        depth, topk = obs.tried.shape
        decay = np.exp(-obs.tried[:, :1].sum() / self.horizon)  # by the root-depth observations
        self.tried *= decay
        self.accepted *= decay
        self.tried[:depth, :topk] += obs.tried
        self.accepted[:depth, :topk] += obs.accepted

    def model(self) -> AcceptanceModel:
        w = self.prior_weight
        return AcceptanceModel((self.accepted + w * self.prior.hazards) / (self.tried + w))

    @property
    def observations(self) -> float:
        return float(self.tried[0].sum())
