"""Training prompts written by the target itself (Magpie: Xu et al. 2024, "alignment data from nothing").

An instruct model's chat template, rendered only up to where a user message's text begins, is a
prompt that the model continues with a user instruction of the kind it was tuned on:

    "<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>\\n<|im_start|>user\\n"
        -> the target samples (T = 1) "Write a short poem about the ocean.<|im_end|>"

``SynthSettings.openings`` steers the kind of request: sample i starts its user text with
``openings[i % len(openings)]`` (written by us, e.g. "Imagine you are"; "" leaves it free) and the
target writes the rest, so that long-form writing, role play, explanations, code and extraction
requests, which SmolLM2 rarely writes unprompted, are drawn as often as its everyday questions.

The instruction ends at the first stop token (the template's end of turn); rows that hit
``max_new_tokens`` first are dropped as unfinished. The instructions then pass ``clean_prompts``:

* empty, shorter than ``min_words`` words, or holding template markup (``<|``, or a special token
  such as another turn's header) -> dropped;
* exact duplicates after lower-casing and whitespace folding -> one kept;
* at most ``max_per_opening`` instructions that open with the same ``opening_words`` words
  (a small model repeats a few favourite openings; this keeps the set varied), counted past the
  longest given opening when the samples are steered;
* the evaluation screen: an evaluation prompt inside the instruction, or a near-duplicate of one
  (``data.near_duplicates``: word-set Jaccard >= 0.5) -> dropped.

The target then answers the kept instructions like any other training prompt (regenerate.py), so
the head trains on the target's own chat distribution, with no evaluation text involved.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any, Sequence

from specdec.models.llama import LlamaForCausalLM
from specdec.engine.chat import render_user_prompt
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
    # user-text openings, cycled over the samples ("" = free); () = every sample free
    openings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.max_new_tokens < 1 or self.temperature <= 0:
            raise ValueError(f"SynthSettings: {self} needs num_samples >= 1, max_new_tokens >= 1, temperature > 0")
        if self.min_words < 1 or self.opening_words < 1 or self.max_per_opening < 1:
            raise ValueError(f"SynthSettings: {self} needs min_words, opening_words, max_per_opening >= 1")


def read_openings(path: str | Path) -> tuple[str, ...]:
    """The openings of a text file: one a line, blank lines and ``#`` comments skipped."""
    lines = [line.strip() for line in Path(path).read_text().splitlines()]
    openings = tuple(line for line in lines if line and not line.startswith("#"))
    if not openings:
        raise ValueError(f"--synth-openings {path}: no openings in the file")
    return openings


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
    header = user_turn_prefix(tokenizer)
    openings = settings.openings or ("",)
    # NOTE: an opening is encoded with the header, so its first word tokenizes as in running text
    prefixes = [tokenizer.encode(header + opening) for opening in openings]
    header_ids = tokenizer.encode(header)
    # the opening's own ids, or None where it merged with the header's last token
    starts = [p[len(header_ids):] if p[: len(header_ids)] == header_ids else None for p in prefixes]
    stop = set(target.config.eos_token_ids)
    gen = GenerateSettings(temperature=settings.temperature, max_new_tokens=settings.max_new_tokens,
                           batch_size=settings.batch_size, seed=settings.seed)
    picks = [i % len(openings) for i in range(settings.num_samples)]
    rows = generate(target, [prefixes[k] for k in picks], gen, desc="synthesize prompts")
    texts, silent = [], {}
    for k, row in zip(picks, rows):
        body, stopped = truncate_at(row, stop)
        if not stopped:
            stats.unfinished += 1
            continue
        for t in set(body) - silent.keys():
            silent[t] = tokenizer.decode([t]) == ""
        # NOTE: special tokens (another turn's header, say) decode to nothing; such a row is markup
        if any(silent[t] for t in body):
            texts.append("<|special|>")
        elif starts[k] is not None:
            texts.append(tokenizer.decode(starts[k] + body))
        else:  # the opening merged with the header's last token: join the texts instead
            texts.append(openings[k] + tokenizer.decode(body))
    stats.sampled += len(rows)
    # NOTE: the same-opening rule looks past the given opening, at the target's own first words
    longest = max(len(o.split()) for o in openings)
    return clean_prompts(texts, screen, dataclasses.replace(settings, opening_words=settings.opening_words + longest),
                         stats)
