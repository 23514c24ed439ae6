"""The side-by-side record from ``offline.py``'s rows: ``peer.json``, a markdown table, one PNG per workload.

    python benchmarks/peer/report.py rows.jsonl OUT_DIR [--ngram-model NAME]
    python benchmarks/peer/report.py --serving-row RESULT.json ENGINE:CONFIG WORKLOAD >> rows.jsonl

``peer.json`` is a list of ``{"workload", "concurrency", "ctx", "engine", "config", "tok_s", "tau",
"ttft_ms", "tpot_ms"}`` (plus ``ms_per_step`` for decode rows). The table puts each cell's best
configuration of each engine side by side (the ratio is specdec's best over vLLM's best; a configuration
measured several times in a cell is its median run, the range of the runs beside it), then
specdec's speculation over its own plain decoding, and how many greedy answers each speculative
configuration left equal to its engine's plain answers.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

KEYS = ("workload", "concurrency", "ctx", "engine", "config", "tok_s", "tau", "ttft_ms", "tpot_ms")
# rows of offline.py's diagnostics (a forced choice, an admission setting): not a configuration's record
DIAGNOSTIC_KEYS = ("force", "waiting")


def load_rows(path: str) -> list[dict]:
    """The record's rows of ``path`` (diagnostic rows left out)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if not any(k in r for k in DIAGNOSTIC_KEYS)]


def cells(rows: list[dict]) -> dict[tuple, dict[tuple[str, str], dict]]:
    """(workload, concurrency, ctx) -> (engine, config) -> row; a configuration measured several times
    in a cell is its median run (by tok/s), with every run's tok/s as ``runs``."""
    out: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        out[(r["workload"], r["concurrency"], r["ctx"])][(r["engine"], r["config"])].append(r)
    return {cell: {key: _median_run(runs) for key, runs in configs.items()}
            for cell, configs in sorted(out.items(), key=lambda kv: (kv[0][0], kv[0][2] or 0, kv[0][1]))}


def _median_run(runs: list[dict]) -> dict:
    """The median run of several (the lower middle one of an even count), its rate among all of them."""
    ranked = sorted(runs, key=lambda r: r["tok_s"])
    return {**ranked[(len(ranked) - 1) // 2], "runs": [r["tok_s"] for r in runs]}


def best(cell: dict, engine: str) -> tuple[str, dict] | None:
    mine = [(cfg, r) for (eng, cfg), r in cell.items() if eng == engine]
    return max(mine, key=lambda cr: cr[1]["tok_s"]) if mine else None


def identical(cell: dict, engine: str, config: str) -> tuple[int, int] | None:
    """Greedy answers of ``config`` equal to the same engine's plain answers: (equal, total)."""
    plain, spec = cell.get((engine, "plain")), cell.get((engine, config))
    if config == "plain" or not plain or not spec or "digests" not in spec:
        return None
    pairs = list(zip(plain["digests"], spec["digests"]))
    return sum(a == b for a, b in pairs), len(pairs)


def _equal_column(cell: dict, engine: str) -> str:
    parts = []
    for eng, config in cell:
        counts = identical(cell, eng, config) if eng == engine else None
        if counts:
            parts.append(f"{config}: {counts[0]}/{counts[1]}")
    return ", ".join(parts) or "—"


def _fmt(x, spec=".0f") -> str:
    return "—" if x is None else format(x, spec)


def _rate(row: dict) -> str:
    """tok/s, and the range of the runs where there were several."""
    runs = row.get("runs", [])
    return _fmt(row["tok_s"]) + (f" ({_fmt(min(runs))}-{_fmt(max(runs))})" if len(runs) > 1 else "")


def table(rows: list[dict]) -> list[str]:
    lines = ["| workload | conc. | ctx | specdec best (tok/s, config) | vLLM best (tok/s, config) | specdec / vLLM "
             "| specdec spec / plain | greedy equal to plain (specdec; vLLM) |",
             "|---|---|---|---|---|---|---|---|"]
    for (workload, conc, ctx), cell in cells(rows).items():
        ours, theirs = best(cell, "specdec"), best(cell, "vllm")
        ratio = ours[1]["tok_s"] / theirs[1]["tok_s"] if ours and theirs else None
        plain = cell.get(("specdec", "plain"))
        spec = [r for (e, c), r in cell.items() if e == "specdec" and c != "plain"]
        own = max(r["tok_s"] for r in spec) / plain["tok_s"] if plain and spec else None
        equal = [_equal_column(cell, engine) for engine in ("specdec", "vllm")]
        lines.append(f"| {workload} | {conc} | {_fmt(ctx)} | "
                     f"{_rate(ours[1]) if ours else '—'} ({ours[0] if ours else '—'}) | "
                     f"{_rate(theirs[1]) if theirs else '—'} ({theirs[0] if theirs else '—'}) | "
                     f"{_fmt(ratio, '.2f')} | {_fmt(own, '.2f')} | {equal[0]}; {equal[1]} |")
    return lines


def plot(rows: list[dict], out: Path) -> list[Path]:
    """tok/s against concurrency, a line per engine and configuration, one PNG per workload and ctx."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return []
    series: dict[tuple, dict[tuple, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        series[(r["workload"], r["ctx"])][(r["engine"], r["config"])].append((r["concurrency"], r["tok_s"]))
    written = []
    for (workload, ctx), lines in series.items():
        fig = Figure(figsize=(6.5, 4), layout="constrained")
        ax = fig.subplots()
        for (engine, config), points in sorted(lines.items()):
            xs, ys = zip(*sorted(points))
            ax.plot(xs, ys, marker="o", linestyle="-" if engine == "specdec" else "--", label=f"{engine} {config}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests" if ctx is None else "batch size")
        ax.set_ylabel("output tokens / s")
        ax.set_title(workload + ("" if ctx is None else f", ctx {ctx}"), fontsize=10)
        ax.legend(fontsize=8)
        path = out / f"{workload}{'' if ctx is None else f'-ctx{ctx}'}.png"
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


def serving_row(result: dict, *, workload: str, engine: str, config: str) -> dict:
    """A record row from ``specdec bench-serving``'s JSON of one server (``gpu_peer.sh serve``): tok/s,
    the acceptance length (from the server's /metrics over the OpenAI API) and median TTFT / TPOT."""
    run = result["speculative"]
    return {"workload": workload, "concurrency": result["concurrency"], "ctx": None, "engine": engine,
            "config": config, "tok_s": run["throughput_tok_s"], "tau": run["acceptance_length"],
            "ttft_ms": run["ttft_ms"]["median"] if run["ttft_ms"] else None,
            "tpot_ms": run["tpot_ms"]["median"] if run["tpot_ms"] else None,
            "completed": run["completed"], "failed": run["failed"]} | (run.get("engine_steps") or {})


def lookup_record(rows: list[dict], model: str) -> list[dict]:
    """The n-gram record (``ngram.json``): each row's speedup over its engine's plain decoding in the
    same cell (None where that engine ran no plain configuration)."""
    out = []
    for (workload, conc, _), cell in cells(rows).items():
        for (engine, config), r in cell.items():
            plain = cell.get((engine, "plain"))
            out.append({"model": model, "dataset": workload.split("-", 1)[-1], "concurrency": conc,
                        "engine": engine, "algorithm": config, "tok_s": r["tok_s"], "tau": r.get("tau"),
                        "speedup": r["tok_s"] / plain["tok_s"] if plain else None})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="?")
    parser.add_argument("out", nargs="?")
    parser.add_argument("--ngram-model", help="also write ngram.json (the lookup workload's record) for this model")
    parser.add_argument("--serving-row", nargs=3, metavar=("RESULT", "ENGINE:CONFIG", "WORKLOAD"),
                        help="print the record row of a bench-serving JSON instead")
    args = parser.parse_args(argv)
    if args.serving_row:
        path, run, workload = args.serving_row
        engine, _, config = run.partition(":")
        print(json.dumps(serving_row(json.loads(Path(path).read_text()), workload=workload, engine=engine,
                                     config=config)))
        return
    if not (args.rows and args.out):
        parser.error("rows and out are required (or --serving-row)")
    rows = load_rows(args.rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = [{k: r.get(k) for k in KEYS} | ({"ms_per_step": r["ms_per_step"]} if "ms_per_step" in r else {})
              for r in rows]
    (out / "peer.json").write_text(json.dumps(record, indent=1))
    (out / "table.md").write_text("\n".join(table(rows)) + "\n")
    if args.ngram_model:
        (out / "ngram.json").write_text(json.dumps(lookup_record(rows, args.ngram_model), indent=1))
    for path in plot(rows, out):
        print(f"Wrote {path}")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
