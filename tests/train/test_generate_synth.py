"""The batched dense-KV sampler (generate.py) and target-written prompts (synth.py).

Greedy rounds equal one-sequence greedy decoding whatever the padding and bucketing; sampled first
tokens follow softmax(logits / T); Magpie instructions are cut at the end of turn and cleaned.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ..builders import StandaloneRunner, greedy_generate_reference, make_random_target, tiny_llama_config
from specdec.train.data import near_duplicates
from specdec.train.generate import GenerateSettings, generate, generate_round, plan_rounds, truncate_at
from specdec.train.synth import (CleanStats, SynthSettings, clean_prompts, read_openings, synthesize_prompts,
                                 user_turn_prefix)

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _prompts(lengths, seed=0, vocab=97):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("batch_size,max_batch_tokens", [(1, 10**6), (3, 10**6), (7, 10**6), (7, 60)])
def test_greedy_rounds_equal_single_sequence_decoding(batch_size, max_batch_tokens):
    """Lengths 1..13 mixed, so rounds hold left padding of up to 12 columns (a pad query sees itself)."""
    target = make_random_target(tiny_llama_config(), seed=3)
    prompts = _prompts([5, 1, 9, 7, 2, 9, 13])
    settings = GenerateSettings(temperature=0, max_new_tokens=11, batch_size=batch_size,
                                max_batch_tokens=max_batch_tokens)
    assert generate(target, prompts, settings) == [greedy_generate_reference(target, p, 11) for p in prompts]


def test_plan_rounds_worked_example():
    s = lambda limit: GenerateSettings(temperature=0, max_new_tokens=2, batch_size=3, max_batch_tokens=limit)  # noqa: E731
    assert plan_rounds([5, 1, 9, 3], s(100)) == [[1, 3, 0], [2]]
    assert plan_rounds([5, 1, 9, 3], s(20)) == [[1, 3], [0], [2]]
    assert plan_rounds([50], s(20)) == [[0]]  # a row that alone exceeds the limit still runs


@torch.no_grad()
def test_sampled_first_tokens_follow_the_tempered_distribution():
    """4,000 copies of one prompt at T = 0.7 (6 of them padded): the first new token's counts against
    softmax(logits / 0.7) by chi-square (bins of expected count >= 5; p > 1e-4 at the fixed seed), and
    the same seed draws the same tokens again."""
    from scipy.stats import chisquare

    target = make_random_target(tiny_llama_config(), seed=5)
    prompt = _prompts([6], seed=1)[0]
    rows = [prompt] * 3994 + [prompt[2:]] * 6
    gen = torch.Generator().manual_seed(0)
    tokens = generate_round(target, rows, temperature=0.7, max_new_tokens=1, generator=gen)[:3994, 0]
    logits = StandaloneRunner(target, 16).forward(prompt).next_token_logits[-1]
    p = torch.softmax(logits.double() / 0.7, -1)
    counts = torch.bincount(tokens, minlength=p.shape[0]).double()
    big = p * len(tokens) >= 5
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([p[big], p[~big].sum()[None]]) * len(tokens)
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-4
    again = generate_round(target, rows, temperature=0.7, max_new_tokens=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again[:3994, 0], tokens)


def test_truncate_at():
    assert truncate_at([5, 6, 2, 7, 2], [2]) == ([5, 6], True)
    assert truncate_at([5, 6], [2]) == ([5, 6], False)
    assert truncate_at([2], [2, 9]) == ([], True)


class _CharTokenizer:
    """Characters as ids 3.. (mod a 97-id vocab); 2 = end of turn; the ChatML template."""

    chat_template = CHATML

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return [3 + ord(c) % 94 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(32 + (i - 3) % 94) if i >= 3 else "" for i in ids)


def test_user_turn_prefix():
    tok = _CharTokenizer()
    assert user_turn_prefix(tok) == "<|im_start|>user\n"
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        user_turn_prefix(tok)


def test_clean_prompts_worked_example():
    screen = ["Compose an engaging travel blog post about a recent trip to Hawaii.", "What is 2 + 2?"]
    texts = [
        "Write a poem about the sea.",                     # kept
        "  write a  POEM about the sea. ",                  # duplicate after folding
        "Hi there",                                         # two words: too short
        "Explain <|im_start|> tokens",                      # markup
        "Write a poem about the sea in spring.",            # kept (2nd of this opening)
        "Write a poem about the mountains.",                # 3rd opening "write a poem about the": over the limit
        "Compose an engaging travel blog post about a recent trip to Hawaii, please.",  # near-duplicate
        "Answer this: What is 2 + 2? Show your steps.",     # contains an evaluation prompt
        "List three prime numbers.",                        # kept
    ]
    stats = CleanStats()
    kept = clean_prompts(texts, screen, SynthSettings(num_samples=1, max_per_opening=2), stats)
    assert kept == ["Write a poem about the sea.", "Write a poem about the sea in spring.", "List three prime numbers."]
    assert (stats.duplicate, stats.too_short_or_markup, stats.same_opening, stats.eval_overlap, stats.kept) == (1, 2, 1, 2, 3)
    assert near_duplicates(kept, screen) == []


def test_synthesize_prompts_from_a_tiny_target():
    """Rows sampled after the user-turn header, cut at the end-of-turn id (2), decoded and cleaned; the
    counts add up, and the same seed gives the same prompts."""
    target = make_random_target(tiny_llama_config(), seed=4)
    with torch.no_grad():  # make the end of turn likely, so that rows finish inside 12 tokens
        target.lm_head_weight[2] += 0.6 * target.lm_head_weight.std() * torch.sign(target.lm_head_weight[2])
    settings = SynthSettings(num_samples=64, max_new_tokens=12, batch_size=16, seed=3, min_words=1)
    stats = CleanStats()
    got = synthesize_prompts(target, _CharTokenizer(), settings, ["zzzz"], stats)
    assert stats.sampled == 64 and stats.kept == len(got) > 0
    assert stats.sampled == (stats.unfinished + stats.too_short_or_markup + stats.duplicate + stats.same_opening
                             + stats.eval_overlap + stats.kept)
    assert got == synthesize_prompts(target, _CharTokenizer(), settings, ["zzzz"])
    assert all(t == t.strip() and t for t in got)
    json.dumps(got)  # plain strings


def test_synthesized_prompts_start_with_their_openings(tmp_path):
    """Steered synthesis: sample i continues the user-turn header + openings[i % N], and its kept text
    begins with that opening; every opening is drawn."""
    target = make_random_target(tiny_llama_config(), seed=4)
    with torch.no_grad():
        target.lm_head_weight[2] += 0.6 * target.lm_head_weight.std() * torch.sign(target.lm_head_weight[2])
    path = tmp_path / "openings.txt"
    path.write_text("# comment\n\nab\n  cd  \n")
    openings = read_openings(path)
    assert openings == ("ab", "cd")
    tok = _CharTokenizer()
    settings = SynthSettings(num_samples=64, max_new_tokens=12, batch_size=16, seed=3, min_words=1,
                             openings=openings)
    got = synthesize_prompts(target, tok, settings, ["zzzz"])
    heads = [tok.decode(tok.encode(o)) for o in openings]
    assert got and all(any(t.startswith(h) for h in heads) for t in got)
    assert {h for h in heads if any(t.startswith(h) for t in got)} == set(heads)
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(ValueError, match="--synth-openings"):
        read_openings(tmp_path / "empty.txt")


def test_evaluate_grid_and_answer_accuracy_on_stories260k(tmp_path):
    """``python -m specdec.cli.train evaluate`` on the embedded stories260K and its two heads: one cell per
    head and temperature, acceptance within [1, steps + 1], accuracies in [0, 1] per draft step."""
    from specdec.engine.embedded import DEFAULT_MODEL
    from specdec.cli.train import evaluate_main as main

    heads = [str(Path(DEFAULT_MODEL).parent / h) for h in ("eagle_head", "eagle3_head")]
    out = tmp_path / "grid.json"
    main(["--model-path", DEFAULT_MODEL, "--heads", ",".join(heads), "--datasets", "tinystories",
          "--shapes", "3,1,4", "--temperatures", "0,1", "--num-prompts", "3", "--max-new-tokens", "12",
          "--answer-accuracy", "3", "--output", str(out)])
    result = json.loads(out.read_text())
    assert [(r["algorithm"], r["temperature"]) for r in result["rows"]] == [
        ("EAGLE", 0.0), ("EAGLE", 1.0), ("EAGLE3", 0.0), ("EAGLE3", 1.0)]
    assert all(1.0 <= r["acceptance_length"] <= 4.0 and r["completion_tokens"] == 36 for r in result["rows"])
    acc = result["answer_accuracy"]["tinystories"]
    assert [len(acc[h]) for h in heads] == [2, 5] and all(0 <= a <= 1 for h in heads for a in acc[h])
