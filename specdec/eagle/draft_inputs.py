"""What the draft reads at each position, resolved once per worker (``draft_inputs``): EAGLE's
shifted inputs, or a standalone draft LM's aligned ones.

    shifted (EAGLE, EAGLE-3)  draft position p reads (token p + 1, target feature p), so its KV at p
                              depends on tokens 0 .. p + 1, and the draft forward at the position
                              before the root (whose input is the root) gives the root's expansion.
    aligned (STANDALONE)      draft position p reads token p, as the target does; its KV at p
                              depends on tokens 0 .. p. The root's expansion needs the root's own
                              forward at position seq_len, whose host slot does not exist yet when
                              the draft extend runs (it becomes the next step's tree slot 0): the
                              root's draft K/V waits in its request row's *parking slot* (past the
                              host's slots and the tree scratch) and the next step moves it to the
                              root's slot before drafting (``place_root``).

Worked example: prompt a b c (positions 0..2), first sampled token d; step 1 accepts e, bonus f::

                     shifted                                aligned
    prefill extend   b@0 c@1 d@2 (features of a b c)        a@0 b@1 c@2, d@park
    step 1 draft     prefix 0..2, frontier from 3           move park -> slot(3); prefix 0..3, frontier from 4
    step 1 extend    e@3 f@4 (features of d e)              e@4, f@park
    (or a plain step 1, committing e alone)
    plain extend     e@3 (feature of d)                     move park -> slot(3); e@park

Both draft extends after a verify read the same committed tokens (accepted, then the bonus) and
take the root expansion at the bonus's row; the aligned one sits one position later, its last
token parked. A plain step's draft extend reads its one committed token (``plain_slots``: where).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec.forward import CaptureHiddenMode, to_device


class ExtendInputs(NamedTuple):
    input_ids: torch.Tensor  # [num_tokens]
    features: torch.Tensor | None  # [num_tokens, target_features] (None: the draft reads none)
    positions: torch.Tensor  # [num_tokens]
    out_cache_loc: torch.Tensor  # [num_tokens]
    extend_lens_cpu: list[int]  # [bs]


class ShiftedInputs:
    """EAGLE / EAGLE-3 heads: token p + 1 and the target's feature p at draft position p."""

    needs_features = True
    park_base = -1  # no parking slots (``specdec.kernels.commit_step``: a shifted draft)
    target_hidden = CaptureHiddenMode.FULL  # what the target's prefill captures
    decode_hidden = CaptureHiddenMode.LAST  # what a plain decode step captures
    # a prefill of one token a request gives the draft what a plain step's draft extend does: the next
    # token over the target's feature at the prefilled position, written at that position's slot
    one_token_prefill_is_plain_step = True

    def prefill(
        self,
        input_ids: torch.Tensor,  # [num_tokens] the target's new tokens
        features: torch.Tensor,  # [num_tokens, F] the target's features there
        positions: torch.Tensor,  # [num_tokens]
        out_cache_loc: torch.Tensor,  # [num_tokens]
        extend_lens: list[int],
        next_ids: torch.Tensor,  # [bs] the token after each request's new ones
        rows: torch.Tensor,  # [bs] request rows
    ) -> ExtendInputs:
        """Each request's tokens shifted left by one, the next token last."""
        ends = to_device(extend_lens, torch.int64, input_ids.device).cumsum(0) - 1
        shifted = torch.roll(input_ids, -1)
        shifted[ends] = next_ids
        return ExtendInputs(shifted, features, positions, out_cache_loc, extend_lens)

    def draft_lens(self, seq_lens: torch.Tensor, seq_lens_cpu: list[int] | None):
        """The draft tree's prefix lengths: the draft KV already holds the root's input."""
        return seq_lens, seq_lens_cpu

    def place_root(self, kv, rows: torch.Tensor, root_slots: torch.Tensor) -> None:
        """Nothing to move: the root's draft K/V is in the host's slot before it."""

    def plain_slots(
        self,
        root_slots: torch.Tensor,  # [bs] slots of the roots' position seq_len
        rows: torch.Tensor,  # [bs] request rows
        *,
        out: torch.Tensor | None = None,  # [bs] written where given
    ) -> torch.Tensor:  # [bs]
        """Where a plain step's draft extend writes its committed token: at position seq_len, the
        root's slot."""
        return root_slots if out is None else out.copy_(root_slots)


class AlignedInputs:
    """A standalone draft LM: token p at draft position p; the last token's K/V parked."""

    needs_features = False
    target_hidden = CaptureHiddenMode.NULL
    decode_hidden = CaptureHiddenMode.NULL
    one_token_prefill_is_plain_step = False  # (its prefill drafts the token itself and parks the next)

    def __init__(self, park_base: int) -> None:
        self.park_base = park_base  # parking slot of request row r: park_base + r

    def prefill(self, input_ids, features, positions, out_cache_loc, extend_lens, next_ids, rows) -> ExtendInputs:
        """Each request's tokens where the target put them, then the next token into its parking slot.

        Example, requests of 2 and 3 tokens [a b | c d e], next tokens x, y::

            input_ids [a b x | c d e y]   positions [0 1 2 | 5 6 7 8] (c at 5: a cached prefix)
            out_cache_loc [s(a) s(b) park(row 0) | s(c) s(d) s(e) park(row 1)]
        """
        device = input_ids.device
        bs, total = len(extend_lens), int(input_ids.shape[0])
        lens = to_device(extend_lens, torch.int64, device)
        ends = lens.cumsum(0) + torch.arange(bs, device=device)  # [bs] where each next token goes
        # NOTE: output_size: without it repeat_interleave reads the sum of ``lens`` from the device
        dest = torch.arange(total, device=device) + torch.repeat_interleave(torch.arange(bs, device=device), lens,
                                                                            output_size=total)
        last = positions[lens.cumsum(0) - 1]  # [bs] each request's last new position
        ids, pos, loc = (torch.empty(total + bs, dtype=torch.int64, device=device) for _ in range(3))
        for out, body, tail in ((ids, input_ids, next_ids), (pos, positions, last + 1),
                                (loc, out_cache_loc, self.park_base + rows)):
            out[dest] = body.to(torch.int64)
            out[ends] = tail.to(torch.int64)
        return ExtendInputs(ids, None, pos, loc, [n + 1 for n in extend_lens])

    def draft_lens(self, seq_lens: torch.Tensor, seq_lens_cpu: list[int] | None):
        """The draft tree's prefix takes in the root itself (``place_root`` put its K/V there)."""
        return seq_lens + 1, None if seq_lens_cpu is None else [s + 1 for s in seq_lens_cpu]

    def place_root(self, kv, rows: torch.Tensor, root_slots: torch.Tensor) -> None:
        """Move each root's parked draft K/V into its slot (position seq_len): [bs] each."""
        kv.move((self.park_base + rows)[:, None], root_slots.reshape(-1, 1).contiguous())

    def plain_slots(self, root_slots, rows, *, out=None) -> torch.Tensor:
        """A plain step's committed token sits at position seq_len + 1, whose host slot does not
        exist yet: it goes to the row's parking slot."""
        return torch.add(rows, self.park_base, out=out)


def draft_inputs(standalone: bool, park_base: int | None) -> ShiftedInputs | AlignedInputs:
    if not standalone:
        return ShiftedInputs()
    if park_base is None:
        raise ValueError("a standalone draft needs parking slots in its draft resources")
    return AlignedInputs(park_base)
