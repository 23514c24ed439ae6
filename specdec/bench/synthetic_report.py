"""The synthetic sweep's results (``specdec.bench.synthetic``): speedups and floor shares, the
issue-format rows (bs, ctx, plain ms, adaptive and each fixed shape's speedup), the plot, the report.

``results``: {"plain": [point], "speculative": {name: [point]}, "adaptive": [point], "setup": {...}},
one point per batch size (``synthetic.measure``'s dict).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdec.eagle.acceptance import AcceptanceModel
from specdec.eagle.policy import PLAIN, SpecShape

ADAPTIVE = "adaptive"


def expected_committed(point: dict, model: AcceptanceModel) -> float:
    """Tokens a request commits per step that ``model`` expects for the shapes ``point`` ran
    (``point["shapes"]``: steps by shape name, "plain" committing one)."""
    steps = point["shapes"]
    total = sum(steps.values())
    return sum(n * (1.0 if name == PLAIN else _expected(model, SpecShape.parse(name)))
               for name, n in steps.items()) / total


def _expected(model: AcceptanceModel, shape: SpecShape) -> float:
    return model.expected_committed(shape.num_steps, shape.topk, shape.num_draft_tokens)


def speedup_at_expectation(point: dict, model: AcceptanceModel) -> float:
    """The point's speedup with the tokens ``model`` expects instead of those its steps drew: the
    measured step times stand, the draw's luck (a few percent over 64 steps) goes."""
    return point["speedup"] * expected_committed(point, model) / point["committed_per_request_step"]


def sweep_rows(results: dict) -> list[dict]:
    """One row per batch size: plain ms per step, and each policy's speedup over plain decoding;
    with an acceptance model, also each speedup at the model's expectation (``*_expected``)."""
    ctx = results["setup"]["context_len"]
    hazards = results["setup"].get("acceptance_model")
    model = AcceptanceModel.from_json(hazards) if hazards else None
    adaptive = {p["batch_size"]: p for p in results.get(ADAPTIVE, [])}
    rows = []
    for p in results["plain"]:
        bs = p["batch_size"]
        fixed = {name: next(q for q in points if q["batch_size"] == bs)
                 for name, points in results["speculative"].items()}
        point = adaptive.get(bs)
        row = {"bs": bs, "ctx": ctx, "plain_ms": p["step_ms"], "adaptive_speedup": point and point["speedup"],
               "fixed": {name: q["speedup"] for name, q in fixed.items()}}
        if model is not None:
            row["adaptive_speedup_expected"] = point and speedup_at_expectation(point, model)
            row["fixed_expected"] = {name: speedup_at_expectation(q, model) for name, q in fixed.items()}
        rows.append(row)
    return rows


def add_ratios(results: dict, weight_nbytes: int, bandwidth: float) -> None:
    """Each plain point's share of the weight floor (one rank's weight bytes / copy bandwidth), each
    speculative point's speedup over plain and its cost beyond verification, in place."""
    floor_ms = weight_nbytes / bandwidth * 1e3 if bandwidth == bandwidth else float("nan")
    plain = {p["batch_size"]: p for p in results["plain"]}
    for p in results["plain"]:
        p["weight_floor_ms"] = floor_ms
        p["floor_share"] = floor_ms / p["step_ms"]
    for points in [*results["speculative"].values(), results.get(ADAPTIVE, [])]:
        for p in points:
            base = plain[p["batch_size"]]
            p["speedup"] = p["tokens_per_s"] / base["tokens_per_s"]
            overhead = p["step_ms"] - p["phases_ms"].get("verify", 0.0)
            p["overhead_vs_plain_step"] = overhead / base["step_ms"]


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    lines = {**results["speculative"], **({ADAPTIVE: results[ADAPTIVE]} if ADAPTIVE in results else {})}
    for name, points in lines.items():
        ax.plot([p["batch_size"] for p in points], [p["speedup"] for p in points], marker="o", label=name,
                lw=2.5 if name == ADAPTIVE else 1.2)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over plain decoding")
    setup = results["setup"]
    acceptance = ("measured acceptance model" if setup["acceptance_model"]
                  else f"simulated accept length {setup['simulated_accept_length']}")
    ax.set_title(f"{setup['shape']}, ctx {setup['context_len']}, {acceptance}\n{setup['device']}", fontsize=9)
    ax.legend(title="steps x topk x draft tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_report(results: dict, settings: Any) -> None:
    """Write the JSON (and, with ``--plot``, the PNG) and print the speedups."""
    Path(settings.output).write_text(json.dumps(results, indent=1))
    if settings.plot:
        plot(results, settings.plot)
    for name, points in [*results["speculative"].items(), *([(ADAPTIVE, results[ADAPTIVE])] if ADAPTIVE in results else [])]:
        print(f"Speedup {name}: " + ", ".join(f"bs{p['batch_size']}={p['speedup']:.2f}x" for p in points))
    share = results["plain"][0]["floor_share"]
    if share == share:  # NOTE: NaN off CUDA, where no device copy bandwidth is measured
        print(f"Plain decode at bs={results['plain'][0]['batch_size']}: {share:.0%} of the weight-bandwidth floor")
