"""Training data stays disjoint from evaluation prompts; the draft vocab maps are consistent."""

from __future__ import annotations

import pytest
import torch

from ..builders import make_random_target, tiny_llama_config
from specdec.train.data import (
    Sample,
    _drop_eval_overlap,
    datasets_dir,
    eval_prompts,
    load_samples,
    overlapping_prompts,
    screen_prompts,
)
from specdec.train.regenerate import generate_with_engine
from specdec.train.vocab import build_draft_vocab, coverage, token_counts


def test_draft_vocab_worked_example():
    vocab = build_draft_vocab(torch.tensor([0, 9, 1, 7, 0, 5]), 3)
    assert vocab.kept.tolist() == [1, 3, 5]
    assert vocab.d2t.tolist() == [1, 2, 3]
    assert vocab.t2d.tolist() == [False, True, False, True, False, True]


@pytest.mark.parametrize("draft_vocab_size", [1, 13, 96, 97])
def test_every_draft_id_maps_to_a_kept_target_id(draft_vocab_size):
    gen = torch.Generator().manual_seed(draft_vocab_size)
    seqs = [torch.randint(0, 97, (50,), generator=gen).tolist() for _ in range(7)]
    counts = token_counts(seqs, 97)
    vocab = build_draft_vocab(counts, draft_vocab_size)
    targets = torch.arange(draft_vocab_size) + vocab.d2t
    assert vocab.t2d[targets].all()
    assert int(vocab.t2d.sum()) == draft_vocab_size
    assert torch.equal(torch.nonzero(vocab.t2d).view(-1), targets)  # ascending, no duplicates
    # the kept ids are the most frequent ones
    dropped = counts[~vocab.t2d]
    assert dropped.numel() == 0 or counts[vocab.t2d].min() >= dropped.max()
    assert coverage(counts, vocab) == pytest.approx(float(counts[vocab.t2d].sum() / counts.sum()))


def test_draft_vocab_rejects_bad_sizes():
    with pytest.raises(ValueError, match="draft-vocab-size"):
        build_draft_vocab(torch.ones(5, dtype=torch.int64), 6)


def test_eval_overlap_is_dropped():
    prompts = ["Once upon a time, there was a kind farmer."]
    samples = [Sample("Once upon a time,  there was a kind farmer.", " The end.", "x"), Sample("A cat.", " Ran.", "x")]
    assert overlapping_prompts([s.text for s in samples], prompts) == prompts
    kept = _drop_eval_overlap(samples, prompts)
    assert [s.prompt for s in kept] == ["A cat."]


@pytest.mark.skipif(not (datasets_dir() / "tinystories").is_dir(), reason="shared datasets not present")
@pytest.mark.parametrize("dataset", ["tinystories", "gsm8k", "alpaca", "alpaca_eval", "spec_bench"])
def test_training_text_never_contains_an_eval_prompt(dataset):
    prompts = screen_prompts()
    assert len(prompts) > len(eval_prompts()) >= 4 * 80  # tinystories, mt_bench (2 turns), humaneval, gsm8k
    samples = load_samples(dataset)
    # NOTE: Spec-Bench's qa questions are EAGLE's qa benchmark, so the screen keeps only its translations
    assert len(samples) >= 80
    assert overlapping_prompts([s.text for s in samples], prompts) == []
    # regeneration prompts are a part of the training text, so they are disjoint too
    assert overlapping_prompts([s.prompt for s in samples], prompts) == []


def test_regenerate_with_engine_matches_greedy_reference():
    from specdec.engine.engine import Engine
    from ..builders import greedy_generate_reference

    target = make_random_target(tiny_llama_config(), seed=2)
    engine = Engine(target_model=target, max_total_tokens=512)
    prompts = [[1, 5, 9], [1, 7], [1, 30, 31, 32]]
    seqs = generate_with_engine(engine, prompts, temperature=0.0, max_new_tokens=6, chunk=2)
    for prompt, seq in zip(prompts, seqs):
        assert seq[: len(prompt)] == prompt
        assert seq[len(prompt):] == greedy_generate_reference(target, prompt, 6)
