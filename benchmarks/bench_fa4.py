"""FlashAttention-4 against the other backends: one layer's attention per forward mode.

Llama-3-8B heads (32 query heads, 8 KV heads, head_dim 128), bf16, page_size 1 with every request's
slots shuffled over the cache (bench_attention's batches). For bs in {1, 8, 32, 64, 128} and
context in {1024, 4096}:

    decode   one token per request after ``ctx`` cached ones
    verify   TARGET_VERIFY of an 8-node random tree after ``ctx`` cached tokens
    extend   128 new tokens per request after ``ctx`` cached ones (chunked prefill, draft extend)
    prefill  EXTEND of ``ctx`` new tokens with no cache (bs 1 and 8 only)

Variants: triton; fa4 (defaults: tree mode "mask_mod", no split); fa4_merge (verify only, tree mode
"merge"); fa4_split (decode and verify, page-table split-KV planned for 2 waves); and
flashinfer / fa3 where installed. Each is timed eagerly and replayed from a CUDA graph (median of
CUDA-event timings after warm-up); the ratio column divides fa4's graph time by the fastest other
backend's graph time (<= 1.1 is the goal). The floor is the KV bytes read over the copy bandwidth.

    python benchmarks/bench_fa4.py --output-dir benchmarks/results/fa4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from bench_attention import D, DTYPE, HKV, HQ, make_batch
from common import metadata_line, run_metadata
from specdec.attention import available_backends, create_attention_backend
from specdec.bench.device_timing import copy_bandwidth, event_us, graph_us
from specdec.forward import ForwardMode

BATCH_SIZES = (1, 8, 32, 64, 128)
CONTEXTS = (1024, 4096)
VARIANTS = {  # name: (registry name, constructor arguments, modes it runs)
    "triton": ("triton", {}, ("decode", "verify", "extend", "prefill")),
    "fa4": ("fa4", {}, ("decode", "verify", "extend", "prefill")),
    "fa4_merge": ("fa4", {"tree": "merge"}, ("verify",)),
    "fa4_split": ("fa4", {"num_splits": None}, ("decode", "verify")),
    "flashinfer": ("flashinfer", {}, ("decode", "verify", "extend", "prefill")),
    "fa3": ("fa3", {}, ("decode", "verify", "extend", "prefill")),
}
MODES = {"decode": (ForwardMode.DECODE, 1), "verify": (ForwardMode.TARGET_VERIFY, 8),
         "extend": (ForwardMode.EXTEND, 128), "prefill": (ForwardMode.EXTEND, None)}


def cases() -> list[tuple[str, int, int]]:
    out = [(m, bs, ctx) for m in ("decode", "verify", "extend") for bs in BATCH_SIZES for ctx in CONTEXTS]
    return out + [("prefill", bs, ctx) for bs in (1, 8) for ctx in CONTEXTS]


def bench_case(mode: str, bs: int, ctx: int, variants: list[str], args) -> dict:
    fmode, n = MODES[mode]
    prefix, new = (0, ctx) if n is None else (ctx, n)
    batch, layer, q, k, v = make_batch(fmode, bs, prefix, new)
    kv_bytes = bs * (prefix + new) * HKV * D * DTYPE.itemsize * 2
    row = {"mode": mode, "bs": bs, "context": ctx, "new_tokens": new, "kv_bytes": kv_bytes,
           "floor_us": kv_bytes / args.bandwidth * 1e6, "us": {}, "graph_us": {}}
    for name in variants:
        registry_name, kwargs, modes = VARIANTS[name]
        if mode not in modes:
            continue
        backend = create_attention_backend(registry_name, **kwargs)
        b = dataclasses.replace(batch, attn_backend=backend, attn_metadata=None)
        backend.init_forward_metadata(b)
        call = lambda: backend.forward(q, k, v, layer, b)  # noqa: E731
        row["us"][name] = event_us(call, reps=args.iters, warmup=args.warmup)
        try:
            row["graph_us"][name] = graph_us(call, reps=args.iters, warmup=args.warmup)
        except RuntimeError as e:  # not capturable: keep the eager time, say why
            row.setdefault("graph_errors", {})[name] = str(e).splitlines()[0][:200]
        del b, backend
    others = [t for name, t in row["graph_us"].items() if not name.startswith("fa4")]
    ours = [t for name, t in row["graph_us"].items() if name.startswith("fa4")]
    row["fa4_best"] = min(ours) if ours else None
    row["fa4_vs_fastest_other"] = min(ours) / min(others) if ours and others else None
    del batch, q, k, v
    torch.cuda.empty_cache()
    return row


def markdown(rows: list[dict], variants: list[str], bandwidth: float) -> str:
    head = ["mode", "bs", "ctx", "new", "floor us"] + [f"{v} us" for v in variants] + ["fa4 / fastest other"]
    lines = [f"Copy bandwidth (read + write): {bandwidth / 1e9:.0f} GB/s. Llama-3-8B heads (32/8/128), bf16, page_size 1 "
             "(slots shuffled), one layer's `forward` (K/V write + attention), CUDA-graph replay (GPU time, "
             "eager in parentheses). Last column: fa4's best variant over the fastest non-fa4 backend "
             "(< 1: fa4 faster).", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["mode"], str(r["bs"]), str(r["context"]), str(r["new_tokens"]), f"{r['floor_us']:.1f}"]
        for v in variants:
            g, e = r["graph_us"].get(v), r["us"].get(v)
            cells.append("-" if e is None else f"{g:.1f} ({e:.0f})" if g is not None else f"- ({e:.0f})")
        ratio = r["fa4_vs_fastest_other"]
        cells.append("-" if ratio is None else f"{ratio:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/results/fa4"))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_fa4 needs a CUDA device")
    start = time.time()
    args.bandwidth = copy_bandwidth()
    present = set(available_backends())
    variants = [v for v, (name, _, _) in VARIANTS.items() if name in present]
    rows = []
    for mode, bs, ctx in [c for c in cases() if c[0] in args.modes]:
        rows.append(bench_case(mode, bs, ctx, variants, args))
        r = rows[-1]
        print(mode, bs, ctx, {k: round(t, 1) for k, t in r["graph_us"].items()}, "eager",
              {k: round(t, 1) for k, t in r["us"].items()}, flush=True)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    result = {**run_metadata(), "copy_bandwidth_bytes_per_s": args.bandwidth, "variants": variants,
              "heads": {"num_heads": HQ, "num_kv_heads": HKV, "head_dim": D}, "dtype": str(DTYPE), "page_size": 1,
              "rows": rows, "wall_s": time.time() - start}
    (args.output_dir / "bench_fa4.json").write_text(json.dumps(result, indent=1))
    table = markdown(rows, variants, args.bandwidth)
    (args.output_dir / "bench_fa4.md").write_text(f"# FA4 attention benchmark ({result['device']})\n\n"
                                                  f"{metadata_line(result)}\n\n" + table)
    print(table)
    print(f"wrote {args.output_dir} in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
