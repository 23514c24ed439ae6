"""EAGLE-3's reduced draft vocabulary: the most frequent target tokens, and the d2t / t2d maps.

    kept      = sorted ids of the draft_vocab_size most frequent tokens     [draft_vocab]
    d2t[i]    = kept[i] - i          so  target_id = draft_id + d2t[draft_id]
    t2d[v]    = v in kept            (bool, [vocab])

Example, vocab 6, counts [0, 9, 1, 7, 0, 5], draft_vocab_size 3: kept = [1, 3, 5],
d2t = [1, 2, 3], t2d = [F, T, F, T, F, T].
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class DraftVocab:
    # [draft_vocab] int64 target ids kept, ascending
    kept: torch.Tensor
    # [draft_vocab] int64 target_id - draft_id
    d2t: torch.Tensor
    # [vocab] bool, True where the target id is in the draft vocab
    t2d: torch.Tensor


def token_counts(seqs: list[list[int]], vocab_size: int) -> torch.Tensor:
    """[vocab] int64 occurrences of each token id in ``seqs``."""
    flat = torch.tensor([t for s in seqs for t in s], dtype=torch.int64)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= vocab_size):
        raise ValueError(f"token_counts: ids outside [0, {vocab_size})")
    return torch.bincount(flat, minlength=vocab_size)


def build_draft_vocab(counts: torch.Tensor, draft_vocab_size: int) -> DraftVocab:
    """Keep the ``draft_vocab_size`` most frequent ids (ties: the smaller id), sorted ascending."""
    vocab = int(counts.shape[0])
    if not 1 <= draft_vocab_size <= vocab:
        raise ValueError(f"--draft-vocab-size {draft_vocab_size} must be in [1, vocab_size={vocab}]")
    # NOTE: a stable sort on -count breaks ties by id, so the result does not depend on the platform.
    order = torch.sort(-counts.to(torch.int64), stable=True).indices
    kept = torch.sort(order[:draft_vocab_size]).values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True
    return DraftVocab(kept=kept, d2t=kept - torch.arange(draft_vocab_size), t2d=t2d)


def coverage(counts: torch.Tensor, vocab: DraftVocab) -> float:
    """Fraction of token occurrences the draft vocab can produce."""
    total = int(counts.sum())
    return float(counts[vocab.kept].sum()) / total if total else 1.0
