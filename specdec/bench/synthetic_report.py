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


def acceptance_record(path: str | None, shapes: list[str]) -> dict | None:
    """The acceptance model a sweep drew from, for its results: a hazards JSON as it is, or a draft
    trace's protocol and size; either with ``expected_committed``, the tokens a step of each of
    ``shapes`` ("SxKxN") commits on average under it (a trace: replayed over all its rows)."""
    if path is None:
        return None
    if path.endswith(".npz"):
        from specdec.eagle.replay import DraftTrace

        trace = DraftTrace.load(path)
        record = {"kind": "replay", "file": Path(path).name, "rows": len(trace), "protocol": trace.protocol}
        expect = trace.expected_committed
    else:
        record = {"kind": "hazards", **json.loads(Path(path).read_text())}
        expect = AcceptanceModel.from_json(record).expected_committed
    record["expected_committed"] = {name: expect(*_steps_topk_tokens(name)) for name in sorted(shapes)}
    return record


def _steps_topk_tokens(name: str) -> tuple[int, int, int]:
    shape = SpecShape.parse(name)
    return shape.num_steps, shape.topk, shape.num_draft_tokens


def shapes_run(results: dict) -> list[str]:
    """Every shape name any speculative point of ``results`` ran a step of."""
    points = [p for ps in results["speculative"].values() for p in ps] + results.get(ADAPTIVE, [])
    return sorted({name for p in points for name in p["shapes"] if name != PLAIN})


def expected_committed(point: dict, expected: dict[str, float]) -> float:
    """Tokens a request commits per step that the acceptance model expects for the shapes ``point``
    ran (``point["shapes"]``: steps by shape name, "plain" committing one; ``expected``: by name)."""
    steps = point["shapes"]
    total = sum(steps.values())
    return sum(n * (1.0 if name == PLAIN else expected[name]) for name, n in steps.items()) / total


def speedup_at_expectation(point: dict, expected: dict[str, float], speedup: str = "speedup") -> float:
    """The point's speedup (``point[speedup]``: over the whole window, or "speedup_steady": without its
    host pauses) with the tokens the model expects instead of those its steps drew: the measured step
    times stand, the draw's luck (a few percent over 64 steps) goes."""
    return point[speedup] * expected_committed(point, expected) / point["committed_per_request_step"]


def sweep_rows(results: dict) -> list[dict]:
    """One row per batch size: plain ms per step, and each policy's speedup over plain decoding;
    with an acceptance model, also each speedup at the model's expectation (``*_expected``), and
    where the points recorded their host pauses, at the expectation without them
    (``*_expected_steady``)."""
    ctx = results["setup"]["context_len"]
    acceptance = results["setup"].get("acceptance_model")
    expected = acceptance and acceptance.get("expected_committed")
    if acceptance and expected is None:  # results written before the record kept it: a hazards model
        model = AcceptanceModel.from_json(acceptance)
        expected = {name: model.expected_committed(*_steps_topk_tokens(name)) for name in shapes_run(results)}
    adaptive = {p["batch_size"]: p for p in results.get(ADAPTIVE, [])}
    rows = []
    for p in results["plain"]:
        bs = p["batch_size"]
        fixed = {name: next(q for q in points if q["batch_size"] == bs)
                 for name, points in results["speculative"].items()}
        point = adaptive.get(bs)
        row = {"bs": bs, "ctx": ctx, "plain_ms": p["step_ms"], "adaptive_speedup": point and point["speedup"],
               "fixed": {name: q["speedup"] for name, q in fixed.items()}}
        if expected is not None:
            row["adaptive_speedup_expected"] = point and speedup_at_expectation(point, expected)
            row["fixed_expected"] = {name: speedup_at_expectation(q, expected) for name, q in fixed.items()}
            if all("speedup_steady" in q for q in [*fixed.values(), *([point] if point else [])]):
                row["adaptive_speedup_expected_steady"] = point and speedup_at_expectation(
                    point, expected, "speedup_steady")
                row["fixed_expected_steady"] = {name: speedup_at_expectation(q, expected, "speedup_steady")
                                                for name, q in fixed.items()}
        rows.append(row)
    return rows


def add_steady(results: dict) -> None:
    """Each point's ``steady_tokens_per_s`` (its tokens over its window less the host's pauses: its
    steps past twice the median counted at the median, ``synthetic.step_spread``) where it recorded
    its step spread, and each speculative point's ``speedup_steady`` over plain's, in place."""
    plain = {p["batch_size"]: p for p in results["plain"]}
    for p in [*results["plain"], *(q for ps in results["speculative"].values() for q in ps),
              *results.get(ADAPTIVE, [])]:
        if "steady_tokens_per_s" not in p and "step_ms_spread" in p:
            produced = p["committed_per_request_step"] * p["batch_size"] * p["decode_steps"]
            elapsed = produced / p["tokens_per_s"]
            p["steady_tokens_per_s"] = produced / (elapsed - p["step_ms_spread"]["slow_excess_ms"] / 1e3)
    for p in [*(q for ps in results["speculative"].values() for q in ps), *results.get(ADAPTIVE, [])]:
        base = plain[p["batch_size"]]
        if "steady_tokens_per_s" in p and "steady_tokens_per_s" in base:
            p["speedup_steady"] = p["steady_tokens_per_s"] / base["steady_tokens_per_s"]


def add_ratios(results: dict, weight_nbytes: int, bandwidth: float) -> None:
    """Each plain point's share of the weight floor (one rank's weight bytes / copy bandwidth), each
    speculative point's speedup over plain (and without host pauses, where recorded) and its cost
    beyond verification, in place."""
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
    add_steady(results)


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
    acceptance = (f"measured acceptance ({setup['acceptance_model']['kind']})" if setup["acceptance_model"]
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
