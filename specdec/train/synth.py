"""Training prompts written by the target itself (Magpie: Xu et al. 2024, "alignment data from nothing").

An instruct model's chat template, rendered only up to where a user message's text begins, is a
prompt that the model continues with a user instruction of the kind it was tuned on:

    "<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>\\n<|im_start|>user\\n"
        -> the target samples (T = 1) "Write a short poem about the ocean.<|im_end|>"

The instruction ends at the first stop token (the template's end of turn); rows that hit
``max_new_tokens`` first are dropped as unfinished. The instructions then pass ``clean_prompts``:

* empty, shorter than ``min_words`` words, or holding template markup (``<|``, or a special token
  such as another turn's header) -> dropped;
* exact duplicates after lower-casing and whitespace folding -> one kept;
* at most ``max_per_opening`` instructions that open with the same ``opening_words`` words
  (a small model repeats a few favourite openings; this keeps the set varied);
* the evaluation screen: an evaluation prompt inside the instruction, or a near-duplicate of one
  (``data.near_duplicates``: word-set Jaccard >= 0.5) -> dropped.

The target then answers the kept instructions like any other training prompt (regenerate.py), so
the head trains on the target's own chat distribution, with no evaluation text involved.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Sequence

from specdec.models.llama import LlamaForCausalLM
from specdec.train.chat import render_user_prompt
from specdec.train.data import near_duplicates, overlapping_prompts
from specdec.train.generate import GenerateSettings, generate, truncate_at

_MARK = "\x00specdec-user-text\x00"


@dataclasses.dataclass(frozen=True)
class SynthSettings:
    num_samples: int  # instructions sampled before cleaning
    max_new_tokens: int = 96
    temperature: float = 1.0
    batch_size: int = 1024
    seed: int = 0
    min_words: int = 3
    opening_words: int = 5
    max_per_opening: int = 3

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.max_new_tokens < 1 or self.temperature <= 0:
            raise ValueError(f"SynthSettings: {self} needs num_samples >= 1, max_new_tokens >= 1, temperature > 0")
        if self.min_words < 1 or self.opening_words < 1 or self.max_per_opening < 1:
            raise ValueError(f"SynthSettings: {self} needs min_words, opening_words, max_per_opening >= 1")


def user_turn_prefix(tokenizer: Any) -> str:
    """The chat template rendered up to the first character of a user message's text."""
    text = render_user_prompt(tokenizer, _MARK)
    if _MARK not in text or text.startswith(_MARK):
        raise ValueError("synthesize: the tokenizer has no chat template to draw user turns from")
    return text[: text.index(_MARK)]


@dataclasses.dataclass
class CleanStats:
    sampled: int = 0
    unfinished: int = 0
    too_short_or_markup: int = 0
    duplicate: int = 0
    same_opening: int = 0
    eval_overlap: int = 0
    kept: int = 0


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def clean_prompts(
    texts: Sequence[str],
    screen: Sequence[str],
    settings: SynthSettings,
    stats: CleanStats | None = None,
) -> list[str]:
    """The instructions of ``texts`` that survive the rules of the module docstring, in order."""
    stats = stats if stats is not None else CleanStats()
    out, seen, openings = [], set(), collections.Counter()
    for text in texts:
        text = text.strip()
        words = text.split()
        if len(words) < settings.min_words or "<|" in text:
            stats.too_short_or_markup += 1
            continue
        key = _norm(text)
        if key in seen:
            stats.duplicate += 1
            continue
        seen.add(key)
        opening = " ".join(key.split()[: settings.opening_words])
        if openings[opening] >= settings.max_per_opening:
            stats.same_opening += 1
            continue
        openings[opening] += 1
        out.append(text)
    # NOTE: search the joined texts first; only the few evaluation prompts found there are checked per text
    found = overlapping_prompts(out, list(screen))
    verbatim = {i for i, t in enumerate(out) if any(b in " ".join(t.split()) for b in found)}
    near = set(near_duplicates(out, list(screen)))
    kept = [t for i, t in enumerate(out) if i not in verbatim and i not in near]
    stats.eval_overlap += len(out) - len(kept)
    stats.kept += len(kept)
    return kept


def synthesize_prompts(
    target: LlamaForCausalLM,
    tokenizer: Any,
    settings: SynthSettings,
    screen: Sequence[str],
    stats: CleanStats | None = None,
) -> list[str]:
    """Sample ``settings.num_samples`` user instructions from ``target`` and clean them."""
    stats = stats if stats is not None else CleanStats()
    prefix = tokenizer.encode(user_turn_prefix(tokenizer))
    stop = set(target.config.eos_token_ids)
    gen = GenerateSettings(temperature=settings.temperature, max_new_tokens=settings.max_new_tokens,
                           batch_size=settings.batch_size, seed=settings.seed)
    rows = generate(target, [prefix] * settings.num_samples, gen, desc="synthesize prompts")
    texts, silent = [], {}
    for row in rows:
        body, stopped = truncate_at(row, stop)
        if not stopped:
            stats.unfinished += 1
            continue
        for t in set(body) - silent.keys():
            silent[t] = tokenizer.decode([t]) == ""
        # NOTE: special tokens (another turn's header, say) decode to nothing; such a row is markup
        texts.append("<|special|>" if any(silent[t] for t in body) else tokenizer.decode(body))
    stats.sampled += len(rows)
    return clean_prompts(texts, screen, settings, stats)
