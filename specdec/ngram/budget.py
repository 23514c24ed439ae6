"""How much an n-gram step drafts: per-request node budgets and the step's verify size.

A lookup draft is either right for a long stretch (the output copies its context) or wrong from its
first token, and verifying a node costs a target forward row whether it is accepted or not. The
rule (adaptive on):

    per request   a budget of draft nodes, starting at N - 1: doubled (up to N - 1) after a step
                  that accepted the whole drafted depth, halved (at least 1) after a step that
                  accepted nothing of a non-empty draft, kept otherwise. A request with no match
                  drafts nothing: its row verifies only its root, which is plain decoding.
    per step      the verify size is the smallest of ``verify_sizes`` (1 + 1, 2, 4, 8, ... and N)
                  that holds the largest tree, and at most ``max_verify_rows`` rows in all
                  (bs x size; past that the trees are cut to the largest size that fits). A step
                  in which no request drafts anything runs a plain decode step instead.

Adaptive off: every request may draft N - 1 nodes and a step that drafts verifies N a request.
Each size has its own target-verify CUDA graphs (``verify_graph_sizes``).
"""

from __future__ import annotations

import numpy as np

from specdec.ngram.config import NgramConfig


def verify_sizes(config: NgramConfig) -> list[int]:
    """The verify sizes (nodes a request, root included) steps choose from, ascending."""
    n = config.num_draft_tokens
    if not config.adaptive:
        return [n]
    sizes, k = {n}, 1
    while 1 + k < n:
        sizes.add(1 + k)
        k *= 2
    return sorted(sizes)


class DraftBudget:
    """Each request row's draft-node budget, and each step's verify size."""

    def __init__(self, config: NgramConfig, max_reqs: int) -> None:
        self.config = config
        self.sizes = verify_sizes(config)
        self.budget = np.full(max_reqs, config.max_nodes, dtype=np.int64)  # [max_reqs]

    def reset(self, rows: list[int]) -> None:
        """New requests (prefilled into ``rows``) start at the full budget."""
        self.budget[rows] = self.config.max_nodes

    def node_cap(self, bs: int) -> int:
        """The most draft nodes a request of a batch of ``bs`` may verify (0: the step runs plain)."""
        rows = self.config.max_verify_rows
        fitting = [s for s in self.sizes if not self.config.adaptive or rows == 0 or bs * s <= rows]
        return fitting[-1] - 1 if fitting else 0

    def limits(self, rows: list[int], bs: int) -> list[int]:
        """Each request's draft-node limit this step."""
        cap = self.node_cap(bs)
        if not self.config.adaptive:
            return [cap] * len(rows)
        return np.minimum(self.budget[rows], cap).tolist()

    def step_size(self, largest_tree: int) -> int:
        """Verify nodes a request for a step whose largest tree has ``largest_tree`` draft nodes."""
        return next(s for s in self.sizes if s >= largest_tree + 1)

    def observe(self, rows: list[int], drafted_depth: list[int], accepted: list[int]) -> None:
        """Update the budgets from a verified step (each row's drafted depth, its accepted nodes)."""
        if not self.config.adaptive:
            return
        cap = self.config.max_nodes
        for row, depth, k in zip(rows, drafted_depth, accepted):
            if depth == 0:
                continue
            if k >= depth:
                self.budget[row] = min(cap, 2 * self.budget[row])
            elif k == 0:
                self.budget[row] = max(1, self.budget[row] // 2)
