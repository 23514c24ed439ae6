"""Draft-head training on a tiny random target: TTT forward == inference, loss falls, export, resume."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from specdec.forward import CaptureHiddenMode
from specdec.models.loaders import load_draft_head, save_draft_head
from ..builders import StandaloneRunner, make_random_target, tiny_llama_config
from specdec.train.capture import capture, pad_batch
from specdec.train.losses import LossSettings, ttt_loss
from specdec.train.trainer import DraftTrainer, TrainConfig, build_head
from specdec.train.vocab import build_draft_vocab, token_counts

AUX = (1, 2, 4)  # capture indices of the 4-layer tiny target (4 = output of the last layer)


def _target(algorithm: str):
    torch.manual_seed(0)
    return make_random_target(tiny_llama_config(), seed=3, aux_hidden_layers=AUX if algorithm == "EAGLE3" else None)


def _seqs(n: int, seed: int, vocab: int = 97) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(9, 23, (n,), generator=gen).tolist()  # ragged, so padding is exercised
    return [torch.randint(3, vocab, (m,), generator=gen).tolist() for m in lengths]


def _kept(head) -> torch.Tensor | None:
    d2t = getattr(head, "d2t", None)
    return None if d2t is None else d2t + torch.arange(d2t.shape[0])


def _head(target, algorithm: str, seqs):
    vocab = build_draft_vocab(token_counts(seqs, 97), 61) if algorithm == "EAGLE3" else None
    return build_head(target, algorithm, vocab=vocab, seed=1)


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
@torch.no_grad()
def test_ttt_steps_equal_inference_drafting(algorithm):
    """Step s of the padded training forward == the head run as the worker runs it: draft extend
    over positions 0..i, then s single-token draft steps that attend to the prefix + ancestors."""
    target = _target(algorithm)
    seqs = _seqs(3, seed=5)
    head = _head(target, algorithm, seqs).eval()
    ids, lengths = pad_batch(seqs)
    cap = capture(target, ids, lengths)
    steps = 3
    got = []  # per step: [b, t, draft_vocab] logits of the training forward
    original = type(head).forward

    def spy(self, batch):
        out = original(self, batch)
        got.append(out.next_token_logits.view(ids.shape[0], ids.shape[1], -1))
        return out

    type(head).forward = spy
    try:
        ttt_loss(head, cap, LossSettings(ttt_steps=steps, kept=_kept(head)))
    finally:
        type(head).forward = original
    for row, seq in enumerate(seqs):
        for i in (0, len(seq) // 2, len(seq) - 1 - steps):
            runner = StandaloneRunner(head, 64)
            out = runner.forward(seq[1 : i + 2], spec_hidden_states=cap.features[row, : i + 1],
                                 capture_hidden_mode=CaptureHiddenMode.FULL)
            torch.testing.assert_close(out.next_token_logits[-1], got[0][row, i], rtol=1e-4, atol=1e-4)
            hidden = out.hidden_states[-1:]
            for s in range(1, steps):
                out = runner.forward([seq[i + 1 + s]], spec_hidden_states=hidden,
                                     capture_hidden_mode=CaptureHiddenMode.FULL)
                torch.testing.assert_close(out.next_token_logits[-1], got[s][row, i], rtol=1e-4, atol=1e-4)
                hidden = out.hidden_states


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_training_lowers_the_loss(algorithm):
    target = _target(algorithm)
    seqs = _seqs(8, seed=11)
    head = _head(target, algorithm, seqs)
    config = TrainConfig(algorithm=algorithm, epochs=12, lr=1e-2, batch_size=8, ttt_steps=2, seed=0, log_every=1000)
    trainer = DraftTrainer(target, head, config, seqs)
    before = trainer.evaluate(seqs)
    trainer.train()
    after = trainer.evaluate(seqs)
    # NOTE: the loss is a soft cross-entropy, so it cannot fall below the random target's own
    # entropy (~4 nats per step here); a 5% drop is most of the reachable gap in 12 steps.
    assert sum(after.mean_loss()) < 0.95 * sum(before.mean_loss()), (before, after)
    assert after.accuracy()[0] > before.accuracy()[0]


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
@torch.no_grad()
def test_export_round_trip(tmp_path, algorithm):
    target = _target(algorithm)
    seqs = _seqs(4, seed=2)
    head = _head(target, algorithm, seqs).eval()
    for p in head.parameters():
        p.add_(0.01 * torch.randn_like(p))
    save_draft_head(head, tmp_path)
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert "embed_tokens.weight" not in names  # shared with the target, not duplicated
    assert ("lm_head.weight" in names) == (algorithm == "EAGLE3")  # EAGLE-1 shares the target's
    loaded = load_draft_head(tmp_path, target)
    assert type(loaded) is type(head)
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    ids, lengths = pad_batch(seqs)
    cap = capture(target, ids, lengths)
    settings = LossSettings(ttt_steps=2, kept=_kept(head))
    assert torch.equal(ttt_loss(head, cap, settings)[1], ttt_loss(loaded, cap, settings)[1])


def test_resume_restores_step_and_weights(tmp_path):
    target = _target("EAGLE3")
    seqs = _seqs(12, seed=4)
    config = TrainConfig(algorithm="EAGLE3", epochs=2, lr=5e-3, batch_size=4, ttt_steps=2, seed=7,
                         log_every=1000, checkpoint_every=2)
    full = DraftTrainer(target, _head(target, "EAGLE3", seqs), config, seqs)
    full.train()

    ckpt = tmp_path / "state.pt"
    first = DraftTrainer(target, _head(target, "EAGLE3", seqs), dataclasses.replace(config), seqs, checkpoint_path=ckpt)
    for step in range(4):  # stop part-way through epoch 2 (3 batches per epoch)
        order = first._epoch_order(step // 3)[(step % 3) * 4 : (step % 3 + 1) * 4]
        first.train_step([seqs[i] for i in order])
    first.save_checkpoint()

    resumed = DraftTrainer(target, _head(target, "EAGLE3", seqs), config, seqs, checkpoint_path=ckpt)
    assert resumed.load_checkpoint() and resumed.step == 4
    for name, tensor in first.head.state_dict().items():
        assert torch.equal(resumed.head.state_dict()[name], tensor), name
    resumed.step = 0
    resumed.train(resume=True)  # picks the checkpoint's step 4 again and finishes the run
    assert resumed.step == full.step == 6
    for name, tensor in full.head.state_dict().items():
        torch.testing.assert_close(resumed.head.state_dict()[name], tensor, rtol=1e-5, atol=1e-6)


def _ttt_loss_by_selection(head, cap, settings):
    """The loss written the plain way (boolean selection of the scored rows, a shifted copy of the
    target per step): the specification ``ttt_loss``'s sliced, sync-free form must equal."""
    import torch.nn.functional as F

    from specdec.train.attention import TTTAttention, training_batch
    from specdec.train.losses import _shift

    b, t = cap.input_ids.shape
    backend = TTTAttention(b, t)
    col = torch.arange(t)
    hidden = cap.features.reshape(b * t, -1)
    total, stats = torch.zeros(()), torch.zeros(3, settings.ttt_steps, dtype=torch.float64)
    for s in range(settings.ttt_steps):
        if s:
            backend.next_step()
        shift = 1 + s
        valid = (col[None] + shift < cap.lengths[:, None]) & (col[None] + shift >= cap.loss_start[:, None])
        out = head(training_batch(_shift(cap.input_ids, shift), backend, spec_hidden_states=hidden, position_offset=s))
        hidden = out.hidden_states
        target_logits = _shift(cap.logits, shift)[valid]
        draft_logits = out.next_token_logits.view(b, t, -1)[valid]
        target_top, draft_top = target_logits.argmax(-1), draft_logits.argmax(-1)
        if settings.kept is not None:
            draft_top = settings.kept[draft_top]
            in_vocab = head.t2d[target_top]
            target_logits, draft_logits = target_logits[in_vocab][:, settings.kept], draft_logits[in_vocab]
        rows = -(torch.softmax(target_logits, -1) * torch.log_softmax(draft_logits, -1)).sum(-1)
        step_loss = rows.sum()
        if settings.hidden_weight:
            h, target_h = hidden.view(b, t, -1)[valid], _shift(cap.features, shift)[valid]
            step_loss = step_loss + settings.hidden_weight * F.smooth_l1_loss(h, target_h, reduction="none").mean(-1).sum()
        n = int(target_top.shape[0])
        total = total + settings.step_decay**s * step_loss / max(n, 1)
        stats[:, s] = torch.tensor([float(rows.sum()), int((draft_top == target_top).sum()), n], dtype=torch.float64)
    return total, stats


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
@torch.no_grad()
def test_sliced_loss_equals_selection_reference(algorithm):
    """Ragged rows, loss starts inside the rows (one past its end), 4 TTT steps on 9..22-token rows."""
    target = _target(algorithm)
    seqs = _seqs(5, seed=8)
    head = _head(target, algorithm, seqs).eval()
    ids, lengths = pad_batch(seqs)
    starts = torch.tensor([0, 3, 7, len(seqs[3]) + 2, 1])
    cap = capture(target, ids, lengths, starts)
    settings = LossSettings(ttt_steps=4, kept=_kept(head), hidden_weight=0.1 if algorithm == "EAGLE" else 0.0)
    loss, stats = ttt_loss(head, cap, settings)
    ref_loss, ref_stats = _ttt_loss_by_selection(head, cap, settings)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats, ref_stats, rtol=1e-5, atol=1e-4)
    assert stats[2].tolist() == [sum(max(0, len(q) - max(s + 1, int(a))) for q, a in zip(seqs, starts))
                                 for s in range(4)]  # counted = predicted tokens at or after each start


def test_time_budget_shortens_the_schedule():
    target = _target("EAGLE3")
    seqs = _seqs(12, seed=4)
    config = TrainConfig(algorithm="EAGLE3", epochs=50, lr=5e-3, batch_size=4, ttt_steps=2, log_every=1000,
                         time_budget=1e-3, probe_steps=2)
    trainer = DraftTrainer(target, _head(target, "EAGLE3", seqs), config, seqs)
    result = trainer.train()
    # warm-up min(5, probe_steps) = 2 steps, 2 timed steps, then one more fits (the minimum)
    assert result.planned_by == "time_budget" and result.steps == 2 + 2 + 1
    fixed = DraftTrainer(target, _head(target, "EAGLE3", seqs), dataclasses.replace(config, time_budget=None,
                                                                                     max_steps=4), seqs)
    assert fixed.train().steps == 4 and fixed.planned_by == "max_steps"


def test_time_budget_follows_a_slower_pace(monkeypatch):
    """A fake clock: steps take 1 s, then 3 s from step 8 on (another job took the device). Budget 30 s,
    warm-up 2 steps, pace timed over 2: at step 4 the pace is 1 s -> 4 + 26 = 30 steps; at every log
    line after that the pace since step 2 is re-measured and the schedule only shrinks."""
    import specdec.train.trainer as trainer_module

    clock = [0.0]
    monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: clock[0])
    target = _target("EAGLE3")
    seqs = _seqs(12, seed=4)
    config = TrainConfig(algorithm="EAGLE3", epochs=50, lr=5e-3, batch_size=4, ttt_steps=2, log_every=1,
                         time_budget=30.0, probe_steps=2)
    trainer = DraftTrainer(target, _head(target, "EAGLE3", seqs), config, seqs)
    plans = []
    real_step = trainer.train_step

    def timed_step(*args):
        clock[0] += 1.0 if trainer.step < 8 else 3.0
        out = real_step(*args)
        plans.append(trainer.total_steps)
        return out

    trainer.train_step = timed_step
    result = trainer.train()
    # plans[k] is read as step k + 1 ends, before that step's pace check
    assert plans[4] == 30 and plans[:4] == [150] * 4  # epochs-based until the pace is known
    assert all(b <= a for a, b in zip(plans, plans[1:]))  # never longer
    assert result.planned_by == "time_budget" and clock[0] <= 30.0 + 3.0  # ends within one step of the budget
