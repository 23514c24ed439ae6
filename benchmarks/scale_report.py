"""The scaling record from one multi-GPU run's outputs: ``scale.json`` and ``scale.md``.

    python benchmarks/scale_report.py OUT_DIR [--output-dir DIR]

Reads what ``scripts/gpu_suite.sh tp`` and ``scripts/gpu_peer.sh scale-decode|dp`` leave in OUT_DIR:

- ``synthetic_tp<N>[_nccl].json``: the 8B synthetic sweep (``specdec bench --synthetic``) at tp N:
  plain, each fixed shape and adaptive speculation, with the collectives' share of a step where the
  point was profiled (``--profile-device``: the smallest and largest batch size);
- ``scale_rows.jsonl``: ``benchmarks/peer/offline.py``'s decode rows of both engines, their tp size in
  ``flags`` (``tp_size``: specdec, ``tensor_parallel_size``: vLLM);
- ``dp<D>_tp<T>_c<C>.json``: ``specdec bench-serving`` against ``specdec serve --dp-size D --tp-size T``.

``scale.json`` is a list of ``{"tp", "dp", "bs", "engine", "config", "ms_per_step", "tok_s",
"collective_share"}`` plus ``workload`` (``synthetic``: the sweep; ``decode``: the side-by-side
driver; ``serve``: the server at ``bs`` concurrent requests) and, on synthetic rows, ``all_reduce``.
``scale.md`` holds the tables and the goals: plain decode at bs 1 against its weight floor per tp
size, speculation's speedup at tp N against tp 1's, and specdec over vLLM per tp and batch size.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

TP_FLAGS = ("tp_size", "tensor_parallel_size")


def _row(workload: str, tp: int, dp: int, bs: int, engine: str, config: str, ms: float | None,
         tok_s: float | None, share: float | None) -> dict:
    return {"workload": workload, "tp": tp, "dp": dp, "bs": bs, "engine": engine, "config": config,
            "ms_per_step": ms, "tok_s": tok_s, "collective_share": share}


def _reducer(path: Path, data: dict) -> str | None:
    """The sweep's all-reduce: None at tp 1, "nccl" for a ``synthetic_tp<N>_nccl.json`` run
    (--disable-custom-all-reduce) or where the run recorded torch.distributed's, else the name it
    recorded ("push", "one-shot"; older runs recorded none: "one-shot")."""
    if int(data["setup"].get("tp_size", 1)) == 1:
        return None
    recorded = data["setup"].get("all_reduce")
    if path.stem.endswith("_nccl") or recorded == "torch.distributed":
        return "nccl"
    return recorded or "one-shot"


def synthetic_rows(path: Path) -> list[dict]:
    """A sweep's points; config "plain", the shape's name ("3x1x4") or "adaptive"; ``all_reduce``: see
    ``_reducer``."""
    data = json.loads(path.read_text())
    tp = int(data["setup"].get("tp_size", 1))
    reducer = _reducer(path, data)
    shares = {(config, p["batch_size"]): p["collective_share"]
              for config, points in data.get("device_profile", {}).items() for p in points}
    series = {"plain": data["plain"], **data.get("speculative", {}), "adaptive": data.get("adaptive", [])}
    rows = []
    for config, points in series.items():
        for p in points:
            rows.append(_row("synthetic", tp, 1, p["batch_size"], "specdec", config, p["step_ms"], p["tokens_per_s"],
                             shares.get((config, p["batch_size"]))) | {"all_reduce": reducer})
    return rows


def decode_rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        flags = r.get("flags", {})
        tp = next((int(flags[k]) for k in TP_FLAGS if k in flags), 1)
        rows.append(_row("decode", tp, 1, r["concurrency"], r["engine"], r["config"], r["ms_per_step"], r["tok_s"],
                         None) | {"ctx": r["ctx"]})
    return rows


def serve_rows(out: Path) -> list[dict]:
    rows = []
    for path in sorted(out.glob("dp*_tp*_c*.json")):
        m = re.fullmatch(r"dp(\d+)_tp(\d+)_c(\d+)", path.stem)
        if not m:
            continue
        run = json.loads(path.read_text())["speculative"]
        dp, tp, c = (int(g) for g in m.groups())
        tpot = run.get("tpot_ms", {}).get("median")
        rows.append(_row("serve", tp, dp, c, "specdec", "plain", tpot, run["throughput_tok_s"], None)
                    | {"completed": run["completed"], "failed": run["failed"]})
    return rows


def _fmt(x, spec=".2f") -> str:
    return "—" if x is None else format(x, spec)


def floor_table(out: Path) -> list[str]:
    """Plain decode at each tp's smallest batch size against its weight floor (bytes a GPU reads / copy bandwidth)."""
    lines = ["| tp | bs | ms a step | weight floor ms | floor / step | collectives' share |",
             "|---|---:|---:|---:|---:|---:|"]
    for path in sorted(out.glob("synthetic_tp*.json")):
        data = json.loads(path.read_text())
        p = min(data["plain"], key=lambda q: q["batch_size"])
        share = next((q["collective_share"] for q in data.get("device_profile", {}).get("plain", [])
                      if q["batch_size"] == p["batch_size"]), None)
        tp = data["setup"].get("tp_size", 1)
        lines.append(f"| {_tp_label(tp, _reducer(path, data))} | "
                     f"{p['batch_size']} | {p['step_ms']:.2f} | {p['weight_floor_ms']:.2f} | "
                     f"{100 * p['floor_share']:.0f} % | {_fmt(share and 100 * share, '.0f')} % |")
    return lines


def _tp_label(tp: int, reducer: str | None) -> str:
    return f"{tp} ({reducer})" if reducer else str(tp)


def speedup_table(rows: list[dict]) -> list[str]:
    """Speculation over plain at each tp (and all-reduce) and batch size (synthetic); beside it at tp > 1,
    the speedup as a share of tp 1's at the same batch size (the goal: >= 80 % at bs 1), and the share
    of tp 1's gain (speedup - 1) kept."""
    synth = [r for r in rows if r["workload"] == "synthetic"]
    plain = {(r["tp"], r["all_reduce"], r["bs"]): r["tok_s"] for r in synth if r["config"] == "plain"}
    configs = sorted({r["config"] for r in synth} - {"plain"})
    speedup = {(r["tp"], r["all_reduce"], r["bs"], r["config"]): r["tok_s"] / plain[r["tp"], r["all_reduce"], r["bs"]]
               for r in synth if r["config"] != "plain" and (r["tp"], r["all_reduce"], r["bs"]) in plain}
    lines = ["| tp | bs | " + " | ".join(f"{c}: speedup (of tp 1's; gain kept)" for c in configs) + " |",
             "|---|---:|" + "---:|" * len(configs)]
    for tp, reducer, bs in sorted(plain, key=lambda k: (k[0], k[1] or "", k[2])):
        cells = []
        for c in configs:
            s, base = speedup.get((tp, reducer, bs, c)), speedup.get((1, None, bs, c))
            kept = ""
            if s and base and tp > 1:
                gain = f"{100 * (s - 1) / (base - 1):.0f} %" if base > 1.05 else "—"
                kept = f" ({100 * s / base:.0f} %; {gain})"
            cells.append(f"{_fmt(s)}x{kept}" if s else "—")
        lines.append(f"| {_tp_label(tp, reducer)} | {bs} | " + " | ".join(cells) + " |")
    return lines


def peer_table(rows: list[dict]) -> list[str]:
    decode = [r for r in rows if r["workload"] == "decode"]
    by = {(r["engine"], r["tp"], r["bs"]): r for r in decode}
    lines = ["| tp | bs | specdec ms a step | vLLM ms a step | specdec / vLLM (speed) |", "|---:|---:|---:|---:|---:|"]
    for tp, bs in sorted({(r["tp"], r["bs"]) for r in decode}):
        ours, theirs = by.get(("specdec", tp, bs)), by.get(("vllm", tp, bs))
        ratio = theirs["ms_per_step"] / ours["ms_per_step"] if ours and theirs else None
        lines.append(f"| {tp} | {bs} | {_fmt(ours and ours['ms_per_step'])} | {_fmt(theirs and theirs['ms_per_step'])} "
                     f"| {_fmt(ratio)}x |")
    return lines


def serve_table(rows: list[dict]) -> list[str]:
    lines = ["| concurrency | dp x tp | tok/s | TPOT median ms | completed / failed |", "|---:|---|---:|---:|---|"]
    for r in sorted((r for r in rows if r["workload"] == "serve"), key=lambda r: (r["bs"], r["dp"], r["tp"])):
        lines.append(f"| {r['bs']} | {r['dp']} x {r['tp']} | {r['tok_s']:.0f} | {_fmt(r['ms_per_step'])} | "
                     f"{r['completed']} / {r['failed']} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the run's output directory")
    parser.add_argument("--output-dir", type=Path, help="where scale.json and scale.md go (default: OUT)")
    args = parser.parse_args(argv)
    rows = [r for path in sorted(args.out.glob("synthetic_tp*.json")) for r in synthetic_rows(path)]
    if (args.out / "scale_rows.jsonl").exists():
        rows += decode_rows(args.out / "scale_rows.jsonl")
    rows += serve_rows(args.out)
    dest = args.output_dir or args.out
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "scale.json").write_text(json.dumps(rows, indent=1))
    sections = {"Plain decode against the weight floor (8B synthetic, ctx 1024)": floor_table(args.out),
                "Speculation's speedup by tp size (8B synthetic)": speedup_table(rows),
                "specdec beside vLLM: plain decode, 8B random weights (offline driver)": peer_table(rows),
                "Throughput through the server: data- and tensor-parallel layouts": serve_table(rows)}
    text = []
    for title, table in sections.items():  # a table of headers only: not measured in this run
        text += [f"## {title}", "", *(table if len(table) > 2 else ["Not measured in this run."]), ""]
    (dest / "scale.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
