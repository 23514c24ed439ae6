"""Train an EAGLE-1 (``EagleDraftModel``) or EAGLE-3 (``Eagle3DraftModel``) head against a frozen target.

    for each batch of token sequences:
        cap  = capture(target, ids)               teacher-forced target features + logits
        loss = ttt_loss(head, cap, settings)      see losses.py (TTT steps, KL, hidden regression)
        AdamW step, cosine schedule with linear warm-up, gradient clipping

The head shares the target's embedding (and, for EAGLE-1, its lm_head); those stay frozen and are
never saved. EAGLE-3 heads get a reduced draft vocab from token frequencies (vocab.py) and start
their lm_head / final norm from the target's rows for the kept ids. A checkpoint file (head,
optimizer, schedule, step) is written every ``checkpoint_every`` steps and at each epoch end;
``train(resume=True)`` continues from it with the same data order (shuffles are seeded per epoch).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch

from specdec.engine.progress import progress
from specdec.models.eagle import EagleDraftModel
from specdec.models.eagle3 import Eagle3DraftModel
from specdec.models.llama import LlamaForCausalLM
from specdec.train.capture import capture, pad_batch
from specdec.train.losses import LossSettings, StepMetrics, expected_chain_acceptance, ttt_loss
from specdec.train.vocab import DraftVocab

DraftHead = EagleDraftModel | Eagle3DraftModel


def _usable(seqs: list[list[int]], starts: list[int] | None) -> tuple[list[list[int]], list[int]]:
    """Sequences of two or more tokens (one prediction at least) and their loss starts."""
    starts = [0] * len(seqs) if starts is None else list(starts)
    if len(starts) != len(seqs):
        raise ValueError(f"DraftTrainer: {len(starts)} loss starts for {len(seqs)} sequences")
    keep = [i for i, s in enumerate(seqs) if len(s) >= 2]
    return [seqs[i] for i in keep], [starts[i] for i in keep]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    algorithm: str = "EAGLE"  # EAGLE | EAGLE3
    epochs: int = 4
    lr: float = 3e-3
    batch_size: int = 16
    ttt_steps: int = 1
    step_decay: float = 0.8
    hidden_weight: float = 0.1  # EAGLE-1 only
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.05
    grad_clip: float = 0.5
    seed: int = 0
    log_every: int = 25
    checkpoint_every: int = 200
    # optimizer steps in all (the schedule's length); None = epochs over the training sequences
    max_steps: int | None = None
    # seconds for the whole run (training + held-out evaluation): after ``probe_steps`` steps, and at
    # every log line from then on, the run measures its pace and shortens the schedule to fit (never
    # lengthens it); None = no limit
    time_budget: float | None = None
    probe_steps: int = 30

    def __post_init__(self) -> None:
        if self.algorithm not in ("EAGLE", "EAGLE3"):
            raise ValueError(f"--algorithm {self.algorithm!r}: expected EAGLE or EAGLE3")
        for name in ("epochs", "batch_size", "ttt_steps", "log_every", "checkpoint_every", "probe_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)} must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"--lr {self.lr} must be > 0")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"--max-steps {self.max_steps} must be >= 1")
        if self.time_budget is not None and self.time_budget <= 0:
            raise ValueError(f"--time-budget {self.time_budget} must be > 0")


@torch.no_grad()
def build_head(target: LlamaForCausalLM, algorithm: str, *, vocab: DraftVocab | None = None, seed: int = 0) -> DraftHead:
    """A fresh one-layer head for ``target`` (seeded init), sharing the target's embedding."""
    torch.manual_seed(seed)
    config = dataclasses.replace(target.config, num_hidden_layers=1)
    weight = target.lm_head_weight
    kw = dict(dtype=weight.dtype, device=weight.device)
    if algorithm == "EAGLE":
        if target.aux_hidden_layers is not None:
            raise ValueError("EAGLE heads train on a target built with aux_hidden_layers=None")
        return EagleDraftModel(config, embed_tokens=target.embed_tokens, lm_head_weight=weight, **kw)
    if target.aux_hidden_layers is None:
        raise ValueError("EAGLE-3 heads train on a target built with aux_hidden_layers")
    draft_vocab = int(vocab.kept.shape[0]) if vocab is not None else config.vocab_size
    head = Eagle3DraftModel(config, aux_hidden_layers=target.aux_hidden_layers, embed_tokens=target.embed_tokens,
                            draft_vocab_size=draft_vocab, **kw)
    kept = vocab.kept if vocab is not None else torch.arange(config.vocab_size)
    head.d2t.copy_(kept - torch.arange(draft_vocab))
    head.t2d.zero_()
    head.t2d[kept.to(head.t2d.device)] = True
    # warm start: the target's own read-out (final norm -> lm_head rows of the kept ids)
    head.lm_head.weight.copy_(weight[kept.to(weight.device)])
    head.norm.weight.copy_(target.model.norm.weight)
    return head


@dataclasses.dataclass
class TrainResult:
    steps: int
    seconds: float
    train_accuracy: list[float]  # per TTT step, over the last epoch
    val_accuracy: list[float]  # per TTT step, held-out sequences
    val_loss: list[float]
    planned_by: str = "epochs"  # what set the number of steps: epochs | max_steps | time_budget

    @property
    def expected_acceptance(self) -> float:
        return expected_chain_acceptance(self.val_accuracy)


class DraftTrainer:
    def __init__(
        self,
        target: LlamaForCausalLM,
        head: DraftHead,
        config: TrainConfig,
        train_seqs: list[list[int]],
        val_seqs: list[list[int]] | None = None,
        *,
        train_starts: list[int] | None = None,
        val_starts: list[int] | None = None,
        checkpoint_path: str | Path | None = None,
    ) -> None:
        """``*_starts[i]``: the first position of sequence i whose prediction is trained / scored
        (its response start; default 0, every token)."""
        if not train_seqs:
            raise ValueError("DraftTrainer: no training sequences")
        self.target = target.eval().requires_grad_(False)
        self.head = head.train()
        self.config = config
        self.train_seqs, self.train_starts = _usable(train_seqs, train_starts)
        self.val_seqs, self.val_starts = _usable(val_seqs or [], val_starts)
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path else None
        kept = head.d2t + torch.arange(head.d2t.shape[0], device=head.d2t.device) if isinstance(head, Eagle3DraftModel) else None
        self.loss_settings = LossSettings(
            ttt_steps=config.ttt_steps, step_decay=config.step_decay,
            hidden_weight=config.hidden_weight if config.algorithm == "EAGLE" else 0.0, kept=kept,
        )
        self.device = head.fc.weight.device
        self.batches_per_epoch = math.ceil(len(self.train_seqs) / config.batch_size)
        self.total_steps = config.max_steps or self.batches_per_epoch * config.epochs
        self.planned_by = "max_steps" if config.max_steps else "epochs"
        params = [p for p in head.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step = 0

    def _lr_factor(self, step: int) -> float:
        warmup = max(1, int(self.config.warmup_ratio * self.total_steps))
        if step < warmup:
            return (step + 1) / warmup
        frac = min(1.0, (step - warmup) / max(1, self.total_steps - warmup))
        floor = self.config.min_lr_ratio
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac))

    def _epoch_order(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(self.config.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.train_seqs), generator=gen).tolist()

    def _batch(self, seqs: list[list[int]], starts: list[int] | None = None):
        ids, lengths = pad_batch(seqs, device=self.device)
        loss_start = torch.tensor(starts, dtype=torch.int64).to(self.device) if starts is not None else None
        return capture(self.target, ids, lengths, loss_start)

    def train_step(self, seqs: list[list[int]], starts: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step; (loss, [3, ttt_steps] statistics), both left on the device."""
        loss, stats = ttt_loss(self.head, self._batch(seqs, starts), self.loss_settings)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return loss.detach(), stats

    @torch.no_grad()
    def evaluate(self, seqs: list[list[int]] | None = None, starts: list[int] | None = None) -> StepMetrics:
        if seqs is None:
            seqs, starts = self.val_seqs, self.val_starts
        self.head.eval()
        bs = self.config.batch_size
        stats = torch.zeros(3, self.config.ttt_steps, dtype=torch.float64, device=self.device)
        for start in range(0, len(seqs), bs):
            part = None if starts is None else starts[start : start + bs]
            stats += ttt_loss(self.head, self._batch(seqs[start : start + bs], part), self.loss_settings)[1]
        self.head.train()
        return StepMetrics.from_tensor(stats)

    def _fit_time_budget(self, elapsed: float, pace: float) -> None:
        """Shorten the schedule so that training and the final evaluation end within the budget."""
        eval_batches = math.ceil(len(self.val_seqs) / self.config.batch_size)
        left = self.config.time_budget - elapsed - 0.5 * pace * eval_batches
        fit = self.step + max(1, int(left / pace))
        if fit < self.total_steps:
            self.total_steps, self.planned_by = fit, "time_budget"
            print(f"time budget {self.config.time_budget:.0f}s: {pace * 1e3:.0f} ms per step, "
                  f"{self.total_steps} steps planned", flush=True)

    def _pace(self, start_time: float, logging: bool) -> None:
        """Time budget: the pace is measured from a few warm-up steps on (when the step of ``probe_steps``
        later is done), then re-measured at every log line, since other work on the device may slow
        the run down (two heads training at once, say). The schedule only ever gets shorter."""
        cfg = self.config
        if cfg.time_budget is None or self.step < self._pace_from:
            return
        if self.step == self._pace_from:
            self._sync()
            self._pace_time = time.perf_counter()
        elif self.step == self._pace_from + cfg.probe_steps or (logging and self.step > self._pace_from + cfg.probe_steps):
            self._sync()
            now = time.perf_counter()
            self._fit_time_budget(now - start_time, (now - self._pace_time) / (self.step - self._pace_from))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train(self, *, resume: bool = False) -> TrainResult:
        if resume:
            self.load_checkpoint()
        start_time, cfg = time.perf_counter(), self.config
        steps = cfg.ttt_steps
        window = torch.zeros(3, steps, dtype=torch.float64, device=self.device)
        epoch_stats = torch.zeros_like(window)
        self._pace_from = self.step + min(5, cfg.probe_steps)
        bar = progress(range(self.step, self.total_steps), desc=f"train {cfg.algorithm}", total=self.total_steps,
                       initial=self.step, unit="steps")
        for step in bar:
            if step >= self.total_steps:  # NOTE: the time budget may shorten the schedule on the way
                break
            epoch, offset = divmod(step, self.batches_per_epoch)
            if offset == 0:
                epoch_stats.zero_()
            order = self._epoch_order(epoch)[offset * cfg.batch_size : (offset + 1) * cfg.batch_size]
            loss, stats = self.train_step([self.train_seqs[i] for i in order], [self.train_starts[i] for i in order])
            window += stats
            epoch_stats += stats
            logging = self.step % cfg.log_every == 0
            self._pace(start_time, logging)
            if logging or self.step == self.total_steps:
                acc = " ".join(f"{a:.3f}" for a in StepMetrics.from_tensor(window).accuracy())
                print(f"step {self.step}/{self.total_steps} epoch {epoch + 1} loss {float(loss):.4f} "
                      f"lr {self.scheduler.get_last_lr()[0]:.2e} acc/step [{acc}] "
                      f"{time.perf_counter() - start_time:.0f}s", flush=True)
                window.zero_()
            end_of_epoch = self.step % self.batches_per_epoch == 0
            if self.checkpoint_path and (self.step % cfg.checkpoint_every == 0 or end_of_epoch):
                self.save_checkpoint()
        val = self.evaluate() if self.val_seqs else StepMetrics.from_tensor(epoch_stats)
        return TrainResult(steps=self.step, seconds=time.perf_counter() - start_time,
                           train_accuracy=StepMetrics.from_tensor(epoch_stats).accuracy(),
                           val_accuracy=val.accuracy(), val_loss=val.mean_loss(), planned_by=self.planned_by)

    # ------------------------------------------------------------ checkpoint
    def save_checkpoint(self) -> None:
        state = {
            "step": self.step,
            "config": dataclasses.asdict(self.config),
            "num_train_seqs": len(self.train_seqs),
            "head": {k: v.detach().cpu() for k, v in self.head.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        self.checkpoint_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.checkpoint_path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(self.checkpoint_path)  # NOTE: atomic, so an interrupted save never loses the last one

    def load_checkpoint(self) -> bool:
        """Restore head, optimizer, schedule and step; False when there is no checkpoint yet."""
        if self.checkpoint_path is None or not self.checkpoint_path.is_file():
            return False
        state = torch.load(self.checkpoint_path, map_location="cpu", weights_only=False)
        for key in ("algorithm", "batch_size", "epochs", "ttt_steps", "seed"):
            if state["config"][key] != getattr(self.config, key):
                raise ValueError(f"--resume: checkpoint {self.checkpoint_path} has {key}={state['config'][key]}, "
                                 f"this run has {getattr(self.config, key)}")
        if state["num_train_seqs"] != len(self.train_seqs):
            raise ValueError(f"--resume: checkpoint trained on {state['num_train_seqs']} sequences, "
                             f"this run has {len(self.train_seqs)}")
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        print(f"resumed from {self.checkpoint_path} at step {self.step}/{self.total_steps}")
        return True
