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

from specdec.models.eagle import EagleDraftModel
from specdec.models.eagle3 import Eagle3DraftModel
from specdec.models.llama import LlamaForCausalLM
from specdec.train.capture import capture, pad_batch
from specdec.train.losses import LossSettings, StepMetrics, expected_chain_acceptance, ttt_loss
from specdec.train.progress import progress
from specdec.train.vocab import DraftVocab

DraftHead = EagleDraftModel | Eagle3DraftModel


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

    def __post_init__(self) -> None:
        if self.algorithm not in ("EAGLE", "EAGLE3"):
            raise ValueError(f"--algorithm {self.algorithm!r}: expected EAGLE or EAGLE3")
        for name in ("epochs", "batch_size", "ttt_steps", "log_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)} must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"--lr {self.lr} must be > 0")


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
        checkpoint_path: str | Path | None = None,
    ) -> None:
        if not train_seqs:
            raise ValueError("DraftTrainer: no training sequences")
        self.target = target.eval().requires_grad_(False)
        self.head = head.train()
        self.config = config
        self.train_seqs = [s for s in train_seqs if len(s) >= 2]
        self.val_seqs = [s for s in (val_seqs or []) if len(s) >= 2]
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path else None
        kept = head.d2t + torch.arange(head.d2t.shape[0], device=head.d2t.device) if isinstance(head, Eagle3DraftModel) else None
        self.loss_settings = LossSettings(
            ttt_steps=config.ttt_steps, step_decay=config.step_decay,
            hidden_weight=config.hidden_weight if config.algorithm == "EAGLE" else 0.0, kept=kept,
        )
        self.device = head.fc.weight.device
        self.batches_per_epoch = math.ceil(len(self.train_seqs) / config.batch_size)
        self.total_steps = self.batches_per_epoch * config.epochs
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

    def _batch(self, seqs: list[list[int]]):
        ids, lengths = pad_batch(seqs, device=self.device)
        return capture(self.target, ids, lengths)

    def train_step(self, seqs: list[list[int]]) -> tuple[float, StepMetrics]:
        loss, metrics = ttt_loss(self.head, self._batch(seqs), self.loss_settings)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return float(loss.detach()), metrics

    @torch.no_grad()
    def evaluate(self, seqs: list[list[int]] | None = None) -> StepMetrics:
        seqs = self.val_seqs if seqs is None else seqs
        self.head.eval()
        metrics = StepMetrics.zeros(self.config.ttt_steps)
        for start in range(0, len(seqs), self.config.batch_size):
            metrics.add(ttt_loss(self.head, self._batch(seqs[start : start + self.config.batch_size]), self.loss_settings)[1])
        self.head.train()
        return metrics

    def train(self, *, resume: bool = False) -> TrainResult:
        if resume:
            self.load_checkpoint()
        start_time, cfg = time.perf_counter(), self.config
        window = StepMetrics.zeros(cfg.ttt_steps)
        epoch_metrics = StepMetrics.zeros(cfg.ttt_steps)
        bar = progress(range(self.step, self.total_steps), desc=f"train {cfg.algorithm}", total=self.total_steps,
                       initial=self.step)
        for step in bar:
            epoch, offset = divmod(step, self.batches_per_epoch)
            if offset == 0:
                epoch_metrics = StepMetrics.zeros(cfg.ttt_steps)
            order = self._epoch_order(epoch)[offset * cfg.batch_size : (offset + 1) * cfg.batch_size]
            loss, metrics = self.train_step([self.train_seqs[i] for i in order])
            window.add(metrics)
            epoch_metrics.add(metrics)
            if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                acc = " ".join(f"{a:.3f}" for a in window.accuracy())
                print(f"step {self.step}/{self.total_steps} epoch {epoch + 1} loss {loss:.4f} "
                      f"lr {self.scheduler.get_last_lr()[0]:.2e} acc/step [{acc}]", flush=True)
                window = StepMetrics.zeros(cfg.ttt_steps)
            end_of_epoch = self.step % self.batches_per_epoch == 0
            if self.checkpoint_path and (self.step % cfg.checkpoint_every == 0 or end_of_epoch):
                self.save_checkpoint()
        val = self.evaluate() if self.val_seqs else epoch_metrics
        return TrainResult(steps=self.step, seconds=time.perf_counter() - start_time,
                           train_accuracy=epoch_metrics.accuracy(), val_accuracy=val.accuracy(),
                           val_loss=val.mean_loss())

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
