"""Deterministic inference's decode attention (``row_attention``) against the default decode path, per
launch plan: GPU time per layer call, replayed from a CUDA graph (issue #41: the mode's cost at bs 64).

Llama-3-8B heads (32 query heads, 8 KV heads, head_dim 128), bf16, page_size 1 with shuffled slots
(``bench_attention.make_batch``), one decode row a request. ``default``: the triton backend's own decode
plan; each other column one of ``row_attention``'s plans: SPLIT_LEN x NUM_PROGRAMS, then the KV tile
(entries, warps, stages). Every plan is a constant of a run (it sets the bits, the same for every
batch), so the fastest across batch sizes can be the mode's. The grid is sized from ``--static-bound``
(a server's context length under CUDA graphs), as the engine's decode graphs size it.

    python benchmarks/bench_row_attention.py --output-dir DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from bench_attention import D, HKV, make_batch
from common import metadata_line, run_metadata
from specdec.attention import create_attention_backend
from specdec.attention.triton_kernels.row_attention import row_attention  # noqa: F401 (imports the module)
from specdec.bench.device_timing import copy_bandwidth, graph_us
from specdec.forward import ForwardMode

ra = sys.modules["specdec.attention.triton_kernels.row_attention"]  # (the package exports the function by that name)

# (SPLIT_LEN, NUM_PROGRAMS, (KV tile entries, warps, stages) or None: launch_config's)
PLANS = [(256, 8, None), (256, 8, (64, 2, 3)), (256, 8, (64, 4, 3)), (256, 8, (64, 2, 4)), (256, 8, (128, 8, 3)),
         (256, 16, (64, 2, 3)), (512, 8, (64, 2, 3)), (512, 8, None), (128, 16, (64, 2, 3)), (256, 4, (64, 2, 3))]


def plan_name(plan) -> str:
    split, programs, tile = plan
    return f"{split}x{programs}" + ("" if tile is None else "/" + "-".join(map(str, tile)))


def case(bs: int, ctx: int, args) -> dict:
    batch, layer, q, k, v = make_batch(ForwardMode.DECODE, bs, ctx, 1)
    kv_bytes = bs * (ctx + 1) * HKV * D * 2 * 2
    row = {"bs": bs, "context": ctx, "floor_us": kv_bytes / args.bandwidth * 1e6, "us": {}}
    backend = create_attention_backend("triton")
    b = dataclasses.replace(batch, attn_backend=backend, attn_metadata=None)
    backend.init_forward_metadata(b)
    out_default = backend.forward(q, k, v, layer, b).view(bs, -1, D)
    row["us"]["default"] = graph_us(lambda: backend.forward(q, k, v, layer, b), reps=args.iters)
    cache = batch.kv_cache
    qh = q.view(bs, -1, D)
    out = torch.empty_like(qh)
    table = batch.req_to_token  # [bs, ctx + 1]: entry e of row r holds position e's slot
    row_list = torch.arange(bs, device="cuda")
    row_lens = torch.full((bs,), ctx + 1, dtype=torch.int32, device="cuda")
    cache.k_buffers[0][batch.out_cache_loc] = k.view(bs, HKV, D)  # the decode token's own K/V, as the backend stored
    cache.v_buffers[0][batch.out_cache_loc] = v.view(bs, HKV, D)

    def run():
        ra.row_attention(qh, cache.k_buffers[0], cache.v_buffers[0], table, row_list, row_lens, out,
                         sm_scale=layer.scaling, max_kv_len=args.static_bound)

    saved = ra.GPU_SPLIT_LEN, ra.GPU_NUM_PROGRAMS, ra.GPU_TILE
    try:
        for plan in PLANS:
            ra.GPU_SPLIT_LEN, ra.GPU_NUM_PROGRAMS, ra.GPU_TILE = plan
            run()
            err = (out.float() - out_default.float()).abs().max().item()
            if err > 2e-2:
                raise SystemExit(f"{plan_name(plan)} at bs {bs}: differs from the default path by {err}")
            row["us"][plan_name(plan)] = graph_us(run, reps=args.iters)
    finally:
        ra.GPU_SPLIT_LEN, ra.GPU_NUM_PROGRAMS, ra.GPU_TILE = saved
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 128])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--static-bound", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    args.bandwidth = copy_bandwidth()
    rows = []
    for ctx in args.contexts:
        for bs in args.batch_sizes:
            r = case(bs, ctx, args)
            rows.append(r)
            print(f"bs={bs:3d} ctx={ctx:5d} floor {r['floor_us']:6.1f} us  "
                  + "  ".join(f"{name}:{us:6.1f}" for name, us in r["us"].items()), flush=True)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    meta = run_metadata()
    (args.output_dir / "bench_row_attention.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    names = list(rows[0]["us"])
    lines = ["# Deterministic decode attention: GPU time (µs) per layer call, by plan\n", metadata_line(meta), "",
             "| bs | ctx | floor | " + " | ".join(names) + " |", "|---" * (3 + len(names)) + "|"]
    lines += [f"| {r['bs']} | {r['context']} | {r['floor_us']:.1f} | " + " | ".join(f"{r['us'][n]:.1f}" for n in names)
              + " |" for r in rows]
    (args.output_dir / "bench_row_attention.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
