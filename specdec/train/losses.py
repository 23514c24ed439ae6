"""One training forward of a draft head: the training-time test over ``ttt_steps`` draft steps.

For a batch captured from the target (``features[p]``, ``logits[p]`` at every position p):

    step 0   query i reads (token i+1, target features i)      -> matches target logits at i+1
    step s   query i reads (token i+1+s, own hidden of step s-1) -> matches target logits at i+1+s

i.e. step s of row i is the depth-(s+1) draft of a tree rooted after position i, fed the real
tokens (teacher forcing) but its own hidden states (EAGLE-3's training-time test; with
``ttt_steps=1`` this is EAGLE-1's single-step training). Query i of step s sits at position i+s,
as the worker places a depth-(s+1) node. Valid where token i+1+s exists.

Only predictions of tokens at positions >= ``cap.loss_start`` of their row count (the response of
a regenerated sequence, say; 0 = every token). Loss per step: soft cross-entropy against the
target distribution (= KL up to a constant), over the draft vocab for EAGLE-3 (target logits restricted to the kept ids; positions whose target
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

    @classmethod
    def from_tensor(cls, stats: torch.Tensor) -> "StepMetrics":
        """From ``ttt_loss``'s [3, steps] (loss sum, correct, count) tensor (read from the device once)."""
        loss, correct, count = stats.detach().double().cpu().tolist()
        return cls(loss, [int(round(c)) for c in correct], [int(round(c)) for c in count])

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


def ttt_loss(head: torch.nn.Module, cap: Captured, settings: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted loss over the TTT steps, and per-step statistics as a [3, ttt_steps] float64 tensor
    on the device (summed loss, correct top-1, counted positions; ``StepMetrics.from_tensor``).

    Nothing here reads the device (no boolean indexing, no ``.item()``): step s compares the draft's
    outputs at columns ``0 .. t-1-s-1`` with the target's at ``s+1 ..`` as aligned slices, and masks
    (padding, ``cap.loss_start``, the draft vocab) weigh the rows instead of selecting them.
    """
    b, t = cap.input_ids.shape
    backend = TTTAttention(b, t)
    col = torch.arange(t, device=cap.input_ids.device)
    hidden = cap.features.reshape(b * t, -1)  # [b*t, F] step 0 reads the target's features
    target_top = cap.logits.argmax(-1)  # [b, t] target ids
    if settings.kept is not None:
        kept = settings.kept.to(cap.logits.device)
        target_p = torch.softmax(cap.logits[..., kept].float(), dim=-1)  # [b, t, draft_vocab]
        in_vocab = head.t2d[target_top]  # [b, t] the draft cannot produce the others: no loss there
    else:
        kept, in_vocab = None, None
        target_p = torch.softmax(cap.logits.float(), dim=-1)  # [b, t, vocab]
    total = cap.logits.new_zeros(())
    stats = torch.zeros(3, settings.ttt_steps, dtype=torch.float64, device=cap.logits.device)
    for s in range(settings.ttt_steps):
        if s:
            backend.next_step()
        shift = 1 + s
        out = head(training_batch(_shift(cap.input_ids, shift), backend, spec_hidden_states=hidden,
                                  position_offset=s))
        hidden = out.hidden_states  # [b*t, H]
        n_cols = t - shift
        if n_cols <= 0:
            continue
        target_col = col[None, shift:]  # [1, n_cols] position of the predicted token
        valid = (target_col < cap.lengths[:, None]) & (target_col >= cap.loss_start[:, None])  # [b, n_cols]
        weight = valid & in_vocab[:, shift:] if in_vocab is not None else valid
        draft_logits = out.next_token_logits.view(b, t, -1)[:, :n_cols]  # [b, n_cols, draft_vocab]
        loss_rows = -(target_p[:, shift:] * torch.log_softmax(draft_logits.float(), dim=-1)).sum(-1)  # [b, n_cols]
        loss_sum = (loss_rows * weight).sum()
        n = valid.sum()
        step_loss = loss_sum
        if settings.hidden_weight:
            h = hidden.view(b, t, -1)[:, :n_cols]
            l1 = F.smooth_l1_loss(h, cap.features[:, shift:], reduction="none").mean(-1)  # [b, n_cols]
            step_loss = step_loss + settings.hidden_weight * (l1 * valid).sum()
        total = total + settings.step_decay**s * step_loss / n.clamp(min=1)
        # accuracy over every counted position (a target argmax outside the draft vocab is a miss)
        draft_top = draft_logits.argmax(-1)  # [b, n_cols] draft ids
        if kept is not None:
            draft_top = kept[draft_top]
        correct = ((draft_top == target_top[:, shift:]) & valid).sum()
        stats[:, s] = torch.stack([loss_sum.detach().double(), correct.double(), n.double()])
    return total, stats


def expected_chain_acceptance(accuracy: list[float]) -> float:
    """1 + sum_k prod_{j<=k} acc_j: committed tokens per verify for a greedy chain, if step
    accuracies were independent (a rough guide; trees with topk > 1 do better)."""
    total, run = 1.0, 1.0
    for a in accuracy:
        run *= a
        total += run
    return total
