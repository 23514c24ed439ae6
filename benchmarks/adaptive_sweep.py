"""Adaptive speculation against plain decoding and each fixed shape: the sweep's files from the
synthetic benchmark's JSON results (one per context length).

    python benchmarks/adaptive_sweep.py out/synthetic_ctx1024.json out/synthetic_ctx4096.json --output-dir DIR

writes ``DIR/sweep.json`` (a list of ``{"bs", "ctx", "plain_ms", "adaptive_speedup", "fixed": {shape: x}}``,
with an acceptance model also ``adaptive_speedup_expected`` and ``fixed_expected``: the same speedups
with the tokens the model expects instead of those the steps drew, and where the points recorded their
host pauses ``*_expected_steady``: those without the pauses), ``DIR/sweep.png`` (speedup against
batch size, one line per policy, a panel per context length) and ``DIR/sweep.md`` (the tables, with the
goal checks: adaptive >= 0.97 x the best of plain and every fixed shape, and >= 1.0 x plain, in every
cell).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.bench.synthetic_report import add_steady, sweep_rows

GOAL_OF_BEST = 0.97


def load_rows(paths: list[str]) -> tuple[list[dict], list[dict]]:
    """(sweep rows, recomputed from each file's points; each file's setup)."""
    rows, setups = [], []
    for path in paths:
        results = json.loads(Path(path).read_text())
        add_steady(results)  # NOTE: results written before add_ratios ran it
        rows += sweep_rows(results)
        setups.append(results["setup"])
    return sorted(rows, key=lambda r: (r["ctx"], r["bs"])), setups


def goal_checks(row: dict, *, variant: str = "") -> dict:
    """The row's best alternative (plain = 1.0 or a fixed shape) and whether adaptive meets the goals
    (``variant``: "" the drawn speedups, "_expected" those at the acceptance model's expectation,
    "_expected_steady" those without host pauses too)."""
    fixed, adaptive = row["fixed" + variant], row["adaptive_speedup" + variant]
    best_name, best = max([("plain", 1.0), *fixed.items()], key=lambda kv: kv[1])
    return {"best": best_name, "best_speedup": best, "of_best": adaptive / best,
            "meets": adaptive >= GOAL_OF_BEST * best and adaptive >= 1.0}


def _conditioning(acceptance: dict) -> str:
    """'parent rank and ' where the model's hazards have a parent-rank axis ([depth][parent rank][rank])."""
    hazards = acceptance.get("hazards") or [[]]
    return "parent rank and " if hazards[0] and isinstance(hazards[0][0], list) else ""


def _shown_path(path: str | None) -> str | None:
    """A path recorded with the trace, as the repository names it (the recording machine's checkout
    dropped): ``/work/main/specdec/data/smollm2/eagle3_head`` -> ``specdec/data/smollm2/eagle3_head``."""
    marker = "specdec/data/"
    return path[path.index(marker):] if path and marker in path else path


def _acceptance_line(acceptance: dict, setup: dict) -> str:
    """What the sweep's simulated verify accepted by: a replayed trace, measured hazards, or a constant."""
    if not acceptance:
        return f"constant accept length {setup.get('simulated_accept_length')}"
    protocol = acceptance.get("protocol", {})
    head = (f"the {_shown_path(protocol.get('draft'))} head on {protocol.get('dataset')} (acceptance length "
            f"{protocol.get('acceptance_length', 0):.2f} at {protocol.get('shape')})")
    expected = ", ".join(f"{name} {e:.3f}" for name, e in acceptance.get("expected_committed", {}).items())
    if acceptance.get("kind") == "replay":
        return (f"replayed draft trees and target paths of {head}, {acceptance['rows']} recorded steps; tokens a step "
                f"each shape commits on them: {expected}")
    return f"measured hazards by depth, {_conditioning(acceptance)}rank of {head}"


def _draft_line(setup: dict) -> str:
    """The draft head's weights and KV cache, where not the model's dtype (older results lack the keys)."""
    parts = []
    if setup.get("draft_quantization"):
        parts.append(f"{setup['draft_quantization'].upper()} draft weights")
    if setup.get("draft_kv_cache_dtype", "auto") != "auto":
        parts.append(f"{setup['draft_kv_cache_dtype']} draft KV cache")
    return "".join(", " + p for p in parts)


def markdown(rows: list[dict], setups: list[dict], commit: str) -> str:
    setup = setups[0]
    shapes = list(rows[0]["fixed"])
    acceptance = setup.get("acceptance_model") or {}
    lines = [
        f"# Adaptive speculation: {setup['shape']} (random weights), {setup['device']}",
        "",
        f"{setup['date']} · {setup['device']} · commit {commit} · {setup['attention_backend']} attention, "
        f"CUDA graphs {'on' if setup['cuda_graphs'] else 'off'}, overlap {'on' if setup['overlap_schedule'] else 'off'}"
        + _draft_line(setup),
        "",
        "Acceptance: " + _acceptance_line(acceptance, setup),
        "",
        "Speedup in tokens/s over plain decoding at the same batch size and context. "
        f"Goal: adaptive >= {GOAL_OF_BEST} x the best of plain and every fixed shape, and >= 1.0 x plain.",
        "",
    ]
    lines += _table(rows, shapes, "")
    if all("adaptive_speedup_expected" in r for r in rows):
        lines += ["", "At the acceptance model's expectation: the same measured step times, with the tokens the "
                  "model expects for the shapes each point ran instead of those its steps drew.", ""]
        lines += _table(rows, shapes, "_expected")
    if all("adaptive_speedup_expected_steady" in r for r in rows):
        lines += ["", "At the expectation, without host pauses: each point's steps slower than twice its median "
                  "counted at the median, plain's too (`step_ms_spread` in the results: pauses of 10-40 ms came "
                  "at random, in every engine).", ""]
        lines += _table(rows, shapes, "_expected_steady")
    return "\n".join(lines) + "\n"


def _table(rows: list[dict], shapes: list[str], suffix: str) -> list[str]:
    """The markdown table of ``rows`` (the speedups of ``goal_checks``' ``variant`` ``suffix``) and its goal count."""
    lines = ["| ctx | bs | plain ms/step | " + " | ".join(shapes) + " | adaptive | adaptive / best | goal |",
             "|---|---|---|" + "---|" * len(shapes) + "---|---|---|"]
    for row in rows:
        check = goal_checks(row, variant=suffix)
        fixed = " | ".join(f"{row['fixed' + suffix][s]:.2f}x" for s in shapes)
        lines.append(f"| {row['ctx']} | {row['bs']} | {row['plain_ms']:.2f} | {fixed} | "
                     f"**{row['adaptive_speedup' + suffix]:.2f}x** | {check['of_best']:.3f} ({check['best']}) | "
                     f"{'yes' if check['meets'] else 'NO'} |")
    met = sum(goal_checks(r, variant=suffix)["meets"] for r in rows)
    return lines + ["", f"Goal met in {met} of {len(rows)} cells."]


def plot(rows: list[dict], setups: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({r["ctx"] for r in rows})
    fig, axes = plt.subplots(1, len(contexts), figsize=(5.5 * len(contexts), 4), squeeze=False)
    for ax, ctx in zip(axes[0], contexts):
        cells = [r for r in rows if r["ctx"] == ctx]
        bs = [r["bs"] for r in cells]
        for name in cells[0]["fixed"]:
            ax.plot(bs, [r["fixed"][name] for r in cells], marker="o", lw=1.2, label=name)
        ax.plot(bs, [r["adaptive_speedup"] for r in cells], marker="s", lw=2.6, color="black", label="adaptive")
        ax.axhline(1.0, color="gray", lw=0.8, ls="--", label="plain")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup over plain decoding")
        ax.set_title(f"ctx {ctx}", fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(f"{setups[0]['shape']}, measured acceptance model, {setups[0]['device']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="synthetic benchmark JSON files (specdec bench --synthetic)")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--commit", default="unknown")
    args = parser.parse_args()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows, setups = load_rows(args.results)
    (out / "sweep.json").write_text(json.dumps(rows, indent=1))
    (out / "sweep.md").write_text(markdown(rows, setups, args.commit))
    try:
        plot(rows, setups, out / "sweep.png")
    except ImportError:
        print("no matplotlib here: sweep.png not drawn")
    print((out / "sweep.md").read_text())


if __name__ == "__main__":
    main()
