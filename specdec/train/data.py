"""Training text and prompts for draft heads, kept disjoint from the evaluation prompts.

Sources (all from ``../shared/datasets``, override with ``SPECDEC_DATASETS``; see its SOURCES.md):
* ``tinystories``: the TinyStories TRAIN split head (``tinystories/tinystories_train_head.txt``),
  paragraphs as samples, the first sentence of each paragraph as a story-opening prompt;
* ``gsm8k``: GSM8K TRAIN questions (prompt) and worked answers (response);
* ``alpaca``: the Alpaca self-instruct seed tasks (instruction + input, output);
* ``alpaca_eval``: the 805 AlpacaEval instructions (text-davinci-003's outputs as the response);
* ``spec_bench``: Spec-Bench's short-prompt categories that none of our evaluation sets draws on
  (translation, qa); its MT-bench, GSM8K-test ("math_reasoning") and long-document ones are left out
  (and its qa questions are EAGLE's qa benchmark, so the screen below drops them all).

``python -m specdec.cli.train prompts OUT.jsonl[.gz] SOURCES...`` writes a prompt file (``prompt``, ``source``
per line) that travels with the repository: ``specdec/data/train_prompts/smollm2.jsonl.gz`` was made so.

Evaluation prompts are ``specdec/data/prompts/*.jsonl`` (TinyStories VALIDATION first sentences,
EAGLE's mt_bench / humaneval / gsm8k question files); training data is screened against those and,
when ``datasets_dir()`` has them, every evaluation set there (``screen_prompts``: EAGLE's six
benchmark files, MT-bench, GSM8K test, HumanEval). They are never read as training text: any
training sample that contains a screened prompt verbatim is dropped (short TinyStories
sentences such as "Once upon a time, there was a little boy named Tim." recur across splits), and
``overlapping_prompts`` checks the result. Instruction sets also drop near-duplicates of a
screened prompt (word-set Jaccard similarity >= 0.5: AlpacaEval's Vicuna questions include
MT-bench's, some with different numbers).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import random
import re
from pathlib import Path

EVAL_PROMPT_DIR = Path(__file__).resolve().parents[1] / "data" / "prompts"
SOURCES = ("tinystories", "gsm8k", "alpaca", "alpaca_eval", "spec_bench")
SPEC_BENCH_CATEGORIES = ("translation", "qa")
# instruction sets are screened for near-duplicates of evaluation prompts as well (GSM8K's train split
# is disjoint from its test split by construction; TinyStories' openings recur by chance)
INSTRUCTION_SOURCES = ("alpaca", "alpaca_eval", "spec_bench")
NEAR_DUPLICATE = 0.5


def datasets_dir() -> Path:
    """``$SPECDEC_DATASETS`` or the workspace's ``shared/datasets`` next to the repository."""
    env = os.environ.get("SPECDEC_DATASETS")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "datasets"


@dataclasses.dataclass(frozen=True)
class Sample:
    """One training text: ``prompt`` (what a target would be asked) and the human ``response``."""

    prompt: str
    response: str
    source: str

    @property
    def text(self) -> str:
        return self.prompt + self.response


def eval_prompts(prompt_dir: Path = EVAL_PROMPT_DIR) -> list[str]:
    """Every turn of every evaluation prompt file (what must never be trained on)."""
    out = []
    for path in sorted(prompt_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                out.extend(t for t in json.loads(line).get("turns", []) if t.strip())
    return out


# evaluation sets of ``datasets_dir()`` screened too when present (JSONL with ``turns``, GSM8K test with
# ``question``, HumanEval with ``prompt``): EAGLE's six benchmark files, MT-bench, GSM8K test, HumanEval
SCREEN_FILES = ("eagle_bench/alpaca/question.jsonl", "eagle_bench/gsm8k/question.jsonl",
                "eagle_bench/humaneval/question.jsonl", "eagle_bench/mt_bench/question.jsonl",
                "eagle_bench/qa/question.jsonl", "eagle_bench/sum/question.jsonl", "mt_bench/question.jsonl",
                "gsm8k/test.jsonl", "humaneval/HumanEval.jsonl.gz")


def _read_text(path: Path) -> str:
    """The text of ``path``, gunzipped when its name ends in ``.gz``."""
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def _screen_file(path: Path) -> list[str]:
    text = _read_text(path)
    out = []
    for line in text.splitlines():
        if line.strip():
            row = json.loads(line)
            out.extend(t for t in row.get("turns", [row.get("question") or row.get("prompt") or ""]) if t.strip())
    return out


def screen_prompts(prompt_dir: Path = EVAL_PROMPT_DIR, datasets: Path | None = None) -> list[str]:
    """What training prompts are screened against: ``eval_prompts`` plus every evaluation set of
    ``SCREEN_FILES`` found under ``datasets`` (default ``datasets_dir()``), deduplicated."""
    root = datasets or datasets_dir()
    out = eval_prompts(prompt_dir)
    for name in SCREEN_FILES:
        if (root / name).is_file():
            out.extend(_screen_file(root / name))
    return list(dict.fromkeys(out))


def overlapping_prompts(texts: list[str], prompts: list[str]) -> list[str]:
    """The prompts that occur verbatim (after whitespace normalisation) inside any of ``texts``."""
    norm = lambda s: " ".join(s.split())  # noqa: E731
    corpus = "\n".join(norm(t) for t in texts)
    return [p for p in dict.fromkeys(norm(p) for p in prompts) if p and p in corpus]


def _drop_eval_overlap(samples: list[Sample], prompts: list[str]) -> list[Sample]:
    norm = lambda s: " ".join(s.split())  # noqa: E731
    # NOTE: search the joined corpus first; only the few prompts found there are checked per sample.
    banned = overlapping_prompts([s.text for s in samples], prompts)
    return [s for s in samples if not any(b in norm(s.text) for b in banned)]


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"']?\s")


def first_sentence(text: str) -> str:
    m = _SENTENCE_END.search(text)
    return text[: m.end()].strip() if m else text.strip()


def tinystories_samples(path: Path | None = None) -> list[Sample]:
    """Paragraphs of the TinyStories TRAIN head: prompt = first sentence, response = the rest."""
    path = path or datasets_dir() / "tinystories" / "tinystories_train_head.txt"
    paragraphs = [p.strip() for p in path.read_text().split("\n\n") if p.strip()]
    out = []
    for p in paragraphs:
        head = first_sentence(p)
        out.append(Sample(prompt=head, response=p[len(head):], source="tinystories"))
    return out


def gsm8k_samples(path: Path | None = None) -> list[Sample]:
    path = path or datasets_dir() / "gsm8k" / "train.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Sample(prompt=r["question"] + "\n", response=r["answer"], source="gsm8k") for r in rows]


def alpaca_samples(path: Path | None = None) -> list[Sample]:
    path = path or datasets_dir() / "alpaca" / "seed_tasks.jsonl"
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        for inst in row.get("instances", []):
            prompt = row["instruction"] + ("\n" + inst["input"] if inst.get("input") else "") + "\n"
            out.append(Sample(prompt=prompt, response=inst.get("output", ""), source="alpaca"))
    return out


def alpaca_eval_samples(path: Path | None = None) -> list[Sample]:
    path = path or datasets_dir() / "alpaca" / "alpaca_eval_805_text_davinci_003_outputs.json"
    rows = json.loads(path.read_text())
    return [Sample(prompt=r["instruction"], response=r.get("output", ""), source="alpaca_eval") for r in rows]


def spec_bench_samples(path: Path | None = None, categories: tuple[str, ...] = SPEC_BENCH_CATEGORIES) -> list[Sample]:
    path = path or datasets_dir() / "spec_bench" / "question.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Sample(prompt=r["turns"][0], response="", source="spec_bench")
            for r in rows if r["category"] in categories]


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", text.lower()))


def near_duplicates(texts: list[str], prompts: list[str], threshold: float = NEAR_DUPLICATE) -> list[int]:
    """Indices of ``texts`` whose word set has Jaccard similarity >= ``threshold`` with a prompt's.

    Intersection sizes for all pairs come from one product (texts x prompt-vocabulary) @
    (prompt-vocabulary x prompts) per chunk of texts, so tens of thousands of texts screen in seconds; the counts are
    integers, exact in float32, and the test is ``|w & r| >= threshold * |w | r|`` as written.
    """
    import torch  # NOTE: lazy, so that reading prompt files needs no torch

    ref = [w for w in (_words(p) for p in prompts) if w]
    if not ref or not texts:
        return []
    index = {word: j for j, word in enumerate(sorted(set().union(*ref)))}
    cols = torch.tensor([index[x] for r in ref for x in r], dtype=torch.int64)
    rows = torch.repeat_interleave(torch.arange(len(ref)), torch.tensor([len(r) for r in ref]))
    ref_matrix = torch.zeros(len(index), len(ref))  # [prompt vocabulary, prompts] 0/1
    ref_matrix[cols, rows] = 1.0
    ref_sizes = torch.tensor([len(r) for r in ref], dtype=torch.float32)
    words = [_words(t) for t in texts]
    out = []
    for start in range(0, len(texts), 4096):
        chunk = words[start : start + 4096]
        hits = [(i, index[x]) for i, w in enumerate(chunk) for x in w if x in index]
        if not hits:
            continue
        at = torch.tensor(hits, dtype=torch.int64)
        text_matrix = torch.zeros(len(chunk), len(index))  # [chunk, prompt vocabulary] 0/1
        text_matrix[at[:, 0], at[:, 1]] = 1.0
        inter = text_matrix @ ref_matrix  # [chunk, prompts] |w & r|
        sizes = torch.tensor([len(w) for w in chunk], dtype=torch.float32)
        union = sizes[:, None] + ref_sizes[None] - inter
        dup = ((inter >= threshold * union) & (sizes[:, None] > 0)).any(dim=1)
        out.extend(start + i for i in dup.nonzero().flatten().tolist())
    return out


def _from_file(path: Path) -> list[Sample]:
    """A ``.txt`` (blank-line separated paragraphs) or ``.jsonl`` / ``.jsonl.gz`` (``text`` or
    ``prompt``/``response``, optional ``source``)."""
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        rows = [json.loads(line) for line in _read_text(path).splitlines() if line.strip()]
        return [Sample(r.get("prompt", ""), r.get("response", r.get("text", "")), r.get("source", path.name))
                for r in rows]
    return tinystories_samples(path)


def load_samples(dataset: str, *, num_samples: int | None = None, seed: int = 0) -> list[Sample]:
    """Samples of ``dataset`` (comma-separated sources or file paths), eval overlap removed, shuffled.

    ``num_samples`` keeps that many after shuffling with ``seed`` (all when None).
    """
    loaders = {"tinystories": tinystories_samples, "gsm8k": gsm8k_samples, "alpaca": alpaca_samples,
               "alpaca_eval": alpaca_eval_samples, "spec_bench": spec_bench_samples}
    samples: list[Sample] = []
    for name in (n.strip() for n in dataset.split(",") if n.strip()):
        if name in loaders:
            samples.extend(loaders[name]())
        elif Path(name).is_file():
            samples.extend(_from_file(Path(name)))
        else:
            raise ValueError(f"--dataset: {name!r} is neither one of {', '.join(SOURCES)} nor a file")
    banned = screen_prompts()
    samples = _drop_eval_overlap(samples, banned)
    instructions = [i for i, s in enumerate(samples) if s.source in INSTRUCTION_SOURCES]
    near = {instructions[j] for j in near_duplicates([samples[i].prompt for i in instructions], banned)}
    samples = [s for i, s in enumerate(samples) if i not in near]
    random.Random(seed).shuffle(samples)
    return samples[:num_samples] if num_samples else samples


def write_prompt_file(path: str | Path, sources: list[str], *, limits: dict[str, int] | None = None,
                      seed: int = 0) -> list[Sample]:
    """Write the prompts of ``sources`` (eval overlap removed, at most ``limits[source]`` each) as
    JSONL lines ``{"prompt", "source"}``, gzipped when ``path`` ends in ``.gz``; responses are left out
    (the target writes its own)."""
    out: list[Sample] = []
    for name in sources:
        part = load_samples(name, seed=seed)
        out.extend(part[: (limits or {}).get(name) or None])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps({"prompt": s.prompt, "source": s.source}) + "\n" for s in out)
    if Path(path).suffix == ".gz":
        Path(path).write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))  # same bytes each run
    else:
        Path(path).write_text(text)
    return out
