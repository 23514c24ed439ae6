"""Lazy draft for plain steps (``--speculative-lazy-plain``, a prototype; issue #40): a plain decode step of a
speculative engine normally runs a one-token draft extend so that its requests can speculate in any
later step. With a ``DraftStash`` it only stashes what that extend would read (the committed token,
the target's features, the draft position and slot), and one draft extend over each request's
stash runs when the request speculates next, or when its stash is full (``EAGLEWorker.catch_up``).
The stash lives in ``DraftResources``, shared by every shape's worker of adaptive speculation.
The draft KV and root expansion then equal what the per-step extends would have written.

Per request row r (device):  tokens [R, D], positions [R, D], slots [R, D], features [R, D, F]
(F the target's feature width: an 8B target's EAGLE-3 features at 256 rows and D = 16 take 100 MB);
host: ``counts[r]`` (entries stashed), ``first[r]`` (the first entry's position, where known).

Lossless whatever the stash holds (verification decides). Not yet handled: a request that finishes
with entries stashed leaves its draft KV at those positions unwritten, so a later request reusing
them from the prefix cache drafts from stale draft K/V there (fewer accepted tokens, same output).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec.forward import to_device


class StashedExtend(NamedTuple):
    """One ragged draft extend over the stashed entries of ``rows`` (n requests, T tokens)."""

    rows: torch.Tensor  # [n] request rows with entries
    counts: list[int]  # [n] entries each (the extend lengths)
    tokens: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T]
    features: torch.Tensor  # [T, F]
    prefix_lens: torch.Tensor  # [n] each request's first stashed position (the draft KV before it)
    prefix_lens_cpu: list[int] | None  # the same on the host, where every one is known


class DraftStash:
    def __init__(self, rows: int, depth: int, *, device: torch.device) -> None:
        self.depth = depth
        kw = dict(dtype=torch.int64, device=device)
        self.tokens = torch.zeros(rows, depth, **kw)
        self.positions = torch.zeros(rows, depth, **kw)
        self.slots = torch.zeros(rows, depth, **kw)
        self.features: torch.Tensor | None = None  # [rows, depth, F], at the first push (F, dtype: the target's)
        self.counts: dict[int, int] = {}
        self.first: dict[int, int | None] = {}

    def pending(self, rows: list[int]) -> list[int]:
        return [self.counts.get(r, 0) for r in rows]

    def full(self, rows: list[int]) -> bool:
        return any(c >= self.depth for c in self.pending(rows))

    def push(self, rows_t: torch.Tensor, rows: list[int], tokens: torch.Tensor, positions: torch.Tensor,
             slots: torch.Tensor, features: torch.Tensor, positions_cpu: list[int] | None) -> None:
        """One plain step's entry per request (none full: ``EAGLEWorker.catch_up`` first)."""
        if self.features is None:
            self.features = features.new_zeros(self.tokens.shape + features.shape[-1:])
        cols = to_device(self.pending(rows), torch.int64, rows_t.device)
        self.tokens[rows_t, cols] = tokens
        self.positions[rows_t, cols] = positions
        self.slots[rows_t, cols] = slots
        self.features[rows_t, cols] = features
        for i, r in enumerate(rows):
            if self.counts.get(r, 0) == 0:
                self.first[r] = None if positions_cpu is None else positions_cpu[i]
            self.counts[r] = self.counts.get(r, 0) + 1

    def take(self, rows: list[int]) -> StashedExtend | None:
        """The stashed entries of ``rows`` as one draft extend's inputs, forgotten here; None if there
        are none."""
        live = [r for r, c in zip(rows, self.pending(rows)) if c > 0]
        if not live:
            return None
        device = self.tokens.device
        counts = [self.counts[r] for r in live]
        row_idx = to_device([r for r, c in zip(live, counts) for _ in range(c)], torch.int64, device)
        col_idx = to_device([j for c in counts for j in range(c)], torch.int64, device)
        firsts = [self.first.get(r) for r in live]
        live_t = to_device(live, torch.int64, device)
        for r in live:
            self.counts[r] = 0
        return StashedExtend(live_t, counts, self.tokens[row_idx, col_idx], self.positions[row_idx, col_idx],
                             self.slots[row_idx, col_idx], self.features[row_idx, col_idx], self.positions[live_t, 0],
                             None if any(f is None for f in firsts) else firsts)

    def forget(self, rows: list[int]) -> None:
        """New requests in ``rows`` (prefill): nothing stashed."""
        for r in rows:
            self.counts.pop(r, None)
            self.first.pop(r, None)
