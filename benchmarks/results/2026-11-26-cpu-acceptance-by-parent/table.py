"""The acceptance model by parent rank, from this folder's CPU runs: the hazards of the draft's first
and second choices' children, each shape's measured tokens a step against the models' expectations,
and the c1c3846 H100 sweep's fixed shapes re-scored at the old and the new model. Prints markdown.

    PYTHONPATH=. python benchmarks/results/2026-11-26-cpu-acceptance-by-parent/table.py
"""
import json
from pathlib import Path

import numpy as np

from specdec.bench.acceptance import PSEUDO_COUNTS
from specdec.eagle.acceptance import AcceptanceModel
from specdec.eagle.policy import SpecShape

HERE = Path(__file__).resolve().parent
SWEEP = HERE.parent / "2026-11-26-h100-adaptive" / "c1c3846"
SHAPES = ("3x1x4", "5x4x8", "6x8x32", "6x8x64")


def counts(name: str) -> tuple[np.ndarray, np.ndarray, dict]:
    run = json.loads((HERE / name).read_text())
    return np.array(run["tried"]), np.array(run["accepted"]), run["protocol"]


def models(name: str) -> tuple[AcceptanceModel, AcceptanceModel]:
    """(by parent rank, pooled) from a run's counts, as ``specdec.cli.bench acceptance`` fits them now."""
    tried, accepted, _ = counts(name)
    pooled = AcceptanceModel.from_counts(tried.sum(1, keepdims=True), accepted.sum(1, keepdims=True),
                                         pseudo_counts=0.0)
    return AcceptanceModel.from_counts(tried, accepted, pseudo_counts=PSEUDO_COUNTS), pooled


def expected(model: AcceptanceModel, name: str) -> float:
    s = SpecShape.parse(name)
    return model.expected_committed(s.num_steps, s.topk, s.num_draft_tokens)


tried, accepted, protocol = counts("acc_6x8x32.json")
print(f"Hazards of ranks 0 and 1 by the parent's rank ({protocol['num_prompts']} prompts x "
      f"{protocol['max_new_tokens']} tokens at 6x8x32, {protocol['verify_steps']} verify steps): raw rate (tried)\n")
print("| depth | parent rank | rank 0 | rank 1 |")
print("|---|---|---|---|")
for depth in (2, 3, 4):
    for parent in (0, 1, 2):
        t, a = tried[depth - 1, parent], accepted[depth - 1, parent]
        cells = [f"{a[r] / t[r]:.3f} ({t[r]:.0f})" if t[r] else "-" for r in (0, 1)]
        print(f"| {depth} | {parent} | " + " | ".join(cells) + " |")

chain_t, chain_a, _ = counts("acc_3x1x4.json")
print("\nA chain's own hazards (every parent the draft's first choice) against the tree's, parent rank 0 / pooled:\n")
print("| depth | chain | tree, parent rank 0 | tree, pooled |")
print("|---|---|---|---|")
for depth in (1, 2, 3):
    own = chain_a[depth - 1, 0, 0] / chain_t[depth - 1, 0, 0]
    first = accepted[depth - 1, 0, 0] / tried[depth - 1, 0, 0]
    pool = accepted[depth - 1, :, 0].sum() / tried[depth - 1, :, 0].sum()
    print(f"| {depth} | {own:.3f} ({chain_t[depth - 1, 0, 0]:.0f}) | {first:.3f} | {pool:.3f} |")

by_parent, pooled = models("acc_6x8x32.json")
old_pooled = models("acc_6x8x32_first40.json")[1]  # the model shipped before: the first 40 questions
measured = {name: counts(f"acc_{name}.json")[2]["acceptance_length"] for name in ("3x1x4", "5x4x8", "6x8x32")}
print("\nTokens a step: measured on all 80 questions, and each model's expectation (model / measured)\n")
print("| shape | measured | by parent rank (shipped now) | pooled | shipped before (first 40, pooled) |")
print("|---|---|---|---|---|")
for name in SHAPES:
    real = f"{measured[name]:.3f}" if name in measured else "-"
    ratio = lambda m: f"{expected(m, name):.3f}" + (f" ({expected(m, name) / measured[name]:.3f})" if name in measured else "")  # noqa: E731
    print(f"| {name} | {real} | {ratio(by_parent)} | {ratio(pooled)} | {ratio(old_pooled)} |")

print("\nThe c1c3846 H100 sweep's fixed shapes at the old model's expectation -> the new one's (its step times)\n")
print("| ctx | bs | " + " | ".join(SHAPES) + " |")
print("|---|---|" + "---|" * len(SHAPES))
for ctx in (1024, 4096):
    run = json.loads((SWEEP / f"synthetic_ctx{ctx}.json").read_text())
    plain = {p["batch_size"]: p["step_ms"] for p in run["plain"]}
    for i, bs in enumerate(sorted(plain)):
        if bs not in (1, 4, 64):
            continue
        cells = []
        for name in SHAPES:
            step = run["speculative"][name][i]["step_ms"]
            cells.append(f"{expected(old_pooled, name) * plain[bs] / step:.2f}x -> "
                         f"{expected(by_parent, name) * plain[bs] / step:.2f}x")
        print(f"| {ctx} | {bs} | " + " | ".join(cells) + " |")
