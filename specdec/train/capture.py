"""Teacher-forced target runs: what a draft head trains on, for a padded batch of token sequences.

The target reads the real tokens (teacher forcing) and hands back, for every position ``p``:
* ``features[p]``: what the draft head conditions on — the final normed hidden state (EAGLE-1,
  target built with ``aux_hidden_layers=None``) or the concatenated inputs of the captured layers
  (EAGLE-3, ``aux_hidden_layers`` set), exactly as the worker receives them at inference;
* ``logits[p]``: the target's next-token logits (predicting token ``p + 1``), the distillation label.

Nothing is stored between batches: the target is re-run per batch (cheap next to the head's
backward for small targets, and it keeps memory flat for large ones).
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.models.llama import LlamaForCausalLM
from specdec.train.attention import TTTAttention, training_batch


@dataclasses.dataclass
class Captured:
    # [bs, seq_len] token ids (right-padded with pad_id)
    input_ids: torch.Tensor
    # [bs] real tokens per row
    lengths: torch.Tensor
    # [bs, seq_len, features] target features at each position (H for EAGLE, len(aux) * H for EAGLE-3)
    features: torch.Tensor
    # [bs, seq_len, vocab] fp32 target logits at each position (predicting the next token)
    logits: torch.Tensor
    # [bs] first position whose token the loss predicts (0: all; the response start of a regenerated row)
    loss_start: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.loss_start is None:
            self.loss_start = torch.zeros_like(self.lengths)


def pad_batch(seqs: list[list[int]], *, pad_id: int = 0, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists: ([bs, max_len] int64 ids, [bs] lengths)."""
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("pad_batch: need one or more non-empty sequences")
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.int64)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
    return ids.to(device), lengths.to(device)


@torch.no_grad()
def capture(target: LlamaForCausalLM, input_ids: torch.Tensor, lengths: torch.Tensor,
            loss_start: torch.Tensor | None = None) -> Captured:
    """Run ``target`` over ``input_ids`` [bs, seq_len] (teacher forcing) and collect its outputs."""
    b, t = input_ids.shape
    if t > target.config.max_position_embeddings:
        raise ValueError(f"capture: seq_len={t} exceeds max_position_embeddings={target.config.max_position_embeddings}")
    backend = TTTAttention(b, t)
    out = target(training_batch(input_ids, backend))
    if out.hidden_states is None:
        raise ValueError("capture: the target returned no hidden states")
    return Captured(
        input_ids=input_ids,
        lengths=lengths,
        features=out.hidden_states.view(b, t, -1),
        logits=out.next_token_logits.view(b, t, -1),
        loss_start=loss_start,
    )
