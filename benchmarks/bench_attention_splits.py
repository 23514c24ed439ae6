"""Split-KV sweep of the Triton attention kernels: GPU time per layer call against the split count.

Same cases as bench_attention.py (Llama-3-8B heads, bf16, page_size 1, shuffled slots), graph
replays only, for the planner's own choice ("auto") and forced split counts. It tells the planner
(``plan_num_splits``) how far to cut short contexts when the grid is small.

    python benchmarks/bench_attention_splits.py --output-dir benchmarks/results/attention
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from bench_attention import D, DTYPE, HKV, make_batch
from common import metadata_line, run_metadata
from specdec.attention.triton_backend import TritonBackend
from specdec.bench.device_timing import copy_bandwidth, graph_us
from specdec.forward import ForwardMode

SPLITS = (None, 1, 2, 4, 8, 16, 32)
CASES = [(mode, bs, ctx, n) for bs in (1, 4, 16, 64) for ctx in (1024, 4096)
         for mode, n in ((ForwardMode.DECODE, 1), (ForwardMode.TARGET_VERIFY, 4), (ForwardMode.TARGET_VERIFY, 8))]


def sweep(mode: ForwardMode, bs: int, ctx: int, n: int, args) -> dict:
    batch, layer, q, k, v = make_batch(mode, bs, ctx, n)
    kv_bytes = bs * (ctx + n) * HKV * D * DTYPE.itemsize * 2
    row = {"mode": mode.name, "bs": bs, "context": ctx, "tokens": n, "floor_us": kv_bytes / args.bandwidth * 1e6,
           "us": {}}
    for splits in SPLITS:
        backend = TritonBackend(num_splits=splits)
        b = dataclasses.replace(batch, attn_backend=backend, attn_metadata=None)
        backend.init_forward_metadata(b)
        row["us"]["auto" if splits is None else str(splits)] = graph_us(
            lambda: backend.forward(q, k, v, layer, b), reps=args.iters, warmup=args.warmup)
    best = min((t, s) for s, t in row["us"].items())
    row["best"] = best[1]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/results/attention"))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    args.bandwidth = copy_bandwidth()
    rows = []
    for case in CASES:
        rows.append(sweep(*case, args))
        r = rows[-1]
        print(f"{r['mode']:13s} bs={r['bs']:3d} ctx={r['context']:5d} n={r['tokens']:2d} floor {r['floor_us']:6.1f} us  "
              + "  ".join(f"{s}:{t:6.1f}" for s, t in r["us"].items()) + f"  best {r['best']}", flush=True)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    meta = run_metadata()
    (args.output_dir / "bench_attention_splits.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# Triton attention: GPU time (µs) per layer call against the split count\n", metadata_line(meta), "",
             "| mode | bs | context | tokens | floor | " + " | ".join(("auto",) + tuple(map(str, SPLITS[1:]))) + " |",
             "|---" * (5 + len(SPLITS)) + "|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['bs']} | {r['context']} | {r['tokens']} | {r['floor_us']:.1f} | "
                     + " | ".join(f"{t:.1f}" for t in r["us"].values()) + " |")
    (args.output_dir / "bench_attention_splits.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
