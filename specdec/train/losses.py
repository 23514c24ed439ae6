"""One training forward of a draft head: the training-time test over ``ttt_steps`` draft steps.

For a batch captured from the target (``features[p]``, ``logits[p]`` at every position p):

    step 0   query i reads (token i+1, target features i)      -> matches target logits at i+1
    step s   query i reads (token i+1+s, own hidden of step s-1) -> matches target logits at i+1+s

i.e. step s of row i is the depth-(s+1) draft of a tree rooted after position i, fed the real
tokens (teacher forcing) but its own hidden states (EAGLE-3's training-time test; with
``ttt_steps=1`` this is EAGLE-1's single-step training). Query i of step s sits at position i+s,
as the worker places a depth-(s+1) node. Valid where token i+1+s exists.

Loss per step: soft cross-entropy against the target distribution (= KL up to a constant), over
the draft vocab for EAGLE-3 (target logits restricted to the kept ids; positions whose target
argmax is outside the draft vocab are skipped, as EAGLE-3 does), plus for EAGLE-1 a smooth-L1
regression of the head's hidden state onto the target's next feature. Step s weighs decay**s.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from specdec.train.attention import TTTAttention, training_batch
from specdec.train.capture import Captured


@dataclasses.dataclass(frozen=True)
class LossSettings:
    ttt_steps: int = 1
    # weight of step s is step_decay ** s (EAGLE-3 uses 0.8)
    step_decay: float = 0.8
    # EAGLE-1 hidden-state regression weight (0 for EAGLE-3, which has no such target)
    hidden_weight: float = 0.0
    # [draft_vocab] target ids of the draft vocab (EAGLE-3); None = the full target vocab
    kept: torch.Tensor | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass
class StepMetrics:
    # per TTT step s: summed loss, correct top-1 predictions, counted positions
    loss: list[float]
    correct: list[int]
    count: list[int]

    @classmethod
    def zeros(cls, steps: int) -> "StepMetrics":
        return cls([0.0] * steps, [0] * steps, [0] * steps)

    def add(self, other: "StepMetrics") -> None:
        for s in range(len(self.loss)):
            self.loss[s] += other.loss[s]
            self.correct[s] += other.correct[s]
            self.count[s] += other.count[s]

    def accuracy(self) -> list[float]:
        return [c / n if n else 0.0 for c, n in zip(self.correct, self.count)]

    def mean_loss(self) -> list[float]:
        return [l / n if n else 0.0 for l, n in zip(self.loss, self.count)]


def _shift(x: torch.Tensor, n: int, fill: float | int = 0) -> torch.Tensor:
    """x[:, i + n] at column i (dim 1), ``fill`` past the end."""
    out = torch.full_like(x, fill)
    if n < x.shape[1]:
        out[:, : x.shape[1] - n] = x[:, n:]
    return out


def ttt_loss(head: torch.nn.Module, cap: Captured, settings: LossSettings) -> tuple[torch.Tensor, StepMetrics]:
    """Weighted loss over the TTT steps and per-step metrics for one captured batch."""
    b, t = cap.input_ids.shape
    backend = TTTAttention(b, t)
    col = torch.arange(t, device=cap.input_ids.device)
    hidden = cap.features.reshape(b * t, -1)  # [b*t, F] step 0 reads the target's features
    kept = settings.kept.to(cap.logits.device) if settings.kept is not None else None
    total = cap.logits.new_zeros(())
    metrics = StepMetrics.zeros(settings.ttt_steps)
    for s in range(settings.ttt_steps):
        if s:
            backend.next_step()
        shift = 1 + s
        valid = col[None] + shift < cap.lengths[:, None]  # [b, t]
        out = head(training_batch(_shift(cap.input_ids, shift), backend, spec_hidden_states=hidden,
                                  position_offset=s))
        hidden = out.hidden_states  # [b*t, H]
        target_logits = _shift(cap.logits, shift)[valid]  # [n, vocab]
        draft_logits = out.next_token_logits.view(b, t, -1)[valid]  # [n, draft_vocab]
        target_top = target_logits.argmax(-1)  # [n]
        draft_top = draft_logits.argmax(-1)  # [n] draft ids
        if kept is not None:
            draft_top = kept[draft_top]
            in_vocab = head.t2d[target_top]  # the draft cannot produce the others: no loss there
            target_logits, draft_logits = target_logits[in_vocab][:, kept], draft_logits[in_vocab]
        target_p = torch.softmax(target_logits.float(), dim=-1)
        loss_rows = -(target_p * torch.log_softmax(draft_logits.float(), dim=-1)).sum(-1)  # [n_in_vocab]
        n = int(target_top.shape[0])
        step_loss = loss_rows.sum()
        if settings.hidden_weight:
            target_h = _shift(cap.features, shift)[valid]  # [n, H]
            h = hidden.view(b, t, -1)[valid]
            step_loss = step_loss + settings.hidden_weight * F.smooth_l1_loss(h, target_h, reduction="none").mean(-1).sum()
        total = total + settings.step_decay**s * step_loss / max(n, 1)
        # accuracy over every valid position (a target argmax outside the draft vocab counts as a miss)
        metrics.loss[s] += float(loss_rows.detach().sum())
        metrics.correct[s] += int((draft_top == target_top).sum())
        metrics.count[s] += n
    return total, metrics


def expected_chain_acceptance(accuracy: list[float]) -> float:
    """1 + sum_k prod_{j<=k} acc_j: committed tokens per verify for a greedy chain, if step
    accuracies were independent (a rough guide; trees with topk > 1 do better)."""
    total, run = 1.0, 1.0
    for a in accuracy:
        run *= a
        total += run
    return total
