"""Where a decode step's GPU time goes, and the skinny GEMMs of ``specdec.models.ops.gemv`` vs cuBLAS.

Llama-3.1-8B shapes, bf16, one device call (``python benchmarks/bench_decode_kernels.py --parts ...``):

  bandwidth  device copy (read + write) and read-only (a large sum) bandwidth: the floors
  gemm       every linear shape of the target and the EAGLE-3 head at M = 1..32 tokens (``--tp N``: as one
             of N tensor-parallel ranks holds it): cuBLAS
             (F.linear) vs the table's Triton config, without and with programmatic dependent
             launch (``--sweep`` adds candidate configs, timed with PDL), GB/s of weight read; each point is a CUDA
             graph of launches over rotating weight copies (more than 4x L2 in all, so every launch
             streams its weight from memory)
  rope       ``apply_rope_`` at the 8B shape (32 q + 8 kv heads, head_dim 128) for ``--rope-tokens``
             tokens (one forward's rows: bs x tokens per request), against the kernel it replaced
             (defined in this script as a baseline) and the torch reference: us, GB/s of q and k read
             + written (+ positions), ratio to the copy-bandwidth floor
  breakdown  torch.profiler over graph-replayed decode steps at bs 1 of an 8B-shaped model with
             ``--layers`` layers, old path and new: per-kernel GPU time per step
  e2e        plain decode ms/step of the full 8B-shaped model (random weights, Triton attention,
             CUDA graphs) at ``--batch-sizes`` as ``specdec.bench.synthetic`` measures it, for each
             path: "before" (cuBLAS, no PDL), "gemv" (Triton GEMMs, no PDL), "gemv+pdl" (the
             default now); ratio to the weight-bandwidth floor (bytes the step reads / copy bandwidth)

The breakdown and e2e parts live in ``decode_model_runs.py``. Writes ``bench_decode_kernels.json``
and ``bench_decode_kernels.md`` under ``--output-dir``, or the JSON to ``--output`` and the markdown
next to it.
``--dry-run``: tiny shapes on the CPU through Triton's interpreter (checks the script, times nothing real).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

from decode_model_runs import breakdown, end_to_end

SHAPES = {  # name -> (N, K): out_features, in_features
    "qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
    "lm_head": (128256, 4096), "draft_qkv": (6144, 8192), "draft_lm_head": (32000, 4096),
}
TINY_SHAPES = {"qkv": (48, 64), "o": (32, 32), "gate_up": (96, 64), "down": (64, 48), "lm_head": (97, 64)}
ROW_PARALLEL = ("o", "down")  # sharded along K under tensor parallelism; the rest along N


def sharded(shapes: dict[str, tuple[int, int]], tp: int) -> dict[str, tuple[int, int]]:
    """Each weight as one of ``tp`` ranks holds it (the 8B draft head is sharded as the target is)."""
    return {name: (n, k // tp) if name in ROW_PARALLEL else (n // tp, k) for name, (n, k) in shapes.items()}
TOKENS = [1, 2, 4, 8, 16, 32]
L2_BYTES = 50 << 20


def sweep_configs(m: int) -> list:
    """Candidate tilings at m tokens (elementwise path: <= 64 fp32 accumulators a thread)."""
    from specdec.models.ops.gemv_kernels import GemvConfig as C

    elementwise = {
        1: [C(4, 1024, prefetch=True), C(8, 512, prefetch=True), C(4, 1024), C(8, 512, num_stages=3),
            C(2, 2048, prefetch=True), C(8, 1024, 8, prefetch=True), C(16, 512, 8, prefetch=True)],
        2: [C(4, 512, prefetch=True), C(4, 512), C(2, 1024, prefetch=True), C(8, 512, 8, prefetch=True)],
    }.get(m, [])
    dot = [C(16, 256, 4, 4, True), C(32, 256, 4, 4, True), C(16, 512, 4, 3, True), C(64, 128, 4, 4, True),
           C(32, 128, 4, 6, True), C(32, 512, 4, 3, True),
           # deeper pipelines: more of W in flight a program, for weights of fewer row blocks than SMs
           C(32, 256, 4, 6, True), C(32, 256, 4, 8, True), C(32, 256, 8, 6, True), C(32, 512, 4, 4, True),
           C(16, 512, 4, 6, True), C(32, 1024, 4, 2, True), C(32, 128, 4, 10, True)]
    return elementwise + dot  # NOTE: the table takes one tensor-core tiling for 1-8 tokens (bit-equal rows)


# ----------------------------------------------------------------------------- timing
class Timer:
    """Median time of one launch: a CUDA graph of ``fns`` (each one launch) replayed ``reps`` times
    (``specdec.bench.device_timing.graph_us``); on the CPU (``--dry-run``) one eager pass."""

    def __init__(self, device: str, reps: int) -> None:
        self.device, self.reps = device, reps

    def __call__(self, fns: list) -> float:  # seconds per launch
        if self.device == "cpu":
            fns[0]()  # compile outside the timing
            t0 = time.perf_counter()
            for fn in fns:
                fn()
            return (time.perf_counter() - t0) / len(fns)
        from specdec.bench.device_timing import graph_us

        return graph_us(lambda: [fn() for fn in fns], reps=self.reps, warmup=1) * 1e-6 / len(fns)


def bandwidths(device: str) -> dict:
    """Copy (bytes read + written) and read-only (a large sum) bandwidth, GB/s, event-timed medians."""
    import torch

    from specdec.bench.device_timing import copy_bandwidth, event_us

    if device == "cpu":
        return {"copy_GBps": float("nan"), "read_GBps": float("nan")}
    x = torch.randn(1 << 29, device=device, dtype=torch.bfloat16)  # 1 GiB
    read_us = event_us(lambda: x.sum(dtype=torch.float32), reps=10)
    return {"copy_GBps": copy_bandwidth(device) / 1e9, "read_GBps": x.numel() * 2 / (read_us * 1e-6) / 1e9}


# ----------------------------------------------------------------------------- GEMMs
def _operands(n: int, k: int, m: int, device: str, dtype, *, x_cols: int | None = None):
    import torch

    nbytes = n * k * 2
    copies = max(2, math.ceil(4 * L2_BYTES / nbytes)) if device != "cpu" else 1
    gen = torch.Generator(device=device).manual_seed(n + k + m)
    weights = [torch.randn(n, k, device=device, dtype=dtype, generator=gen) * k**-0.5 for _ in range(copies)]
    x = torch.randn(m, x_cols or k, device=device, dtype=dtype, generator=gen)
    return weights, x, max(copies, 8) if device != "cpu" else 1


def _rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def bench_gemm(shapes: dict, tokens: list[int], timer: Timer, device: str, sweep: bool, rows: list, save) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from specdec.models.ops import gemv
    from specdec.models.ops.gemv_kernels import gemv as launch
    from specdec.models.ops.launch import programmatic_launch

    for name, (n, k) in shapes.items():
        for m in tokens:
            weights, x, launches = _operands(n, k, m, device, torch.bfloat16)
            ws = [weights[i % len(weights)] for i in range(launches)]
            nbytes = n * k * 2
            row = {"shape": name, "N": n, "K": k, "M": m, "weight_MB": nbytes / 1e6}
            row["cublas_us"] = timer([lambda w=w: F.linear(x, w) for w in ws]) * 1e6
            table = gemv._config(gemv._bucket(m), n, k)
            candidates = ([table] if table else []) + ([c for c in sweep_configs(m) if c != table] if sweep else [])
            ref = F.linear(x, weights[0])
            results = []
            for cfg in candidates:  # with PDL (the default on Hopper)
                try:
                    err = _rel_err(launch(x, weights[0], None, cfg), ref)
                except Exception as e:  # NOTE: a candidate past the GPU's shared memory (triton's OutOfResources)
                    print(f"gemm {name} M={m} {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                t = timer([lambda w=w, c=cfg: launch(x, w, None, c) for w in ws])
                results.append({"config": dataclasses.asdict(cfg), "us": t * 1e6, "rel_err_vs_cublas": err,
                                "table": cfg == table})
            if table:
                with programmatic_launch(False):
                    row["table_nopdl_us"] = timer([lambda w=w: launch(x, w, None, table) for w in ws]) * 1e6
            row["triton"] = results
            if results:
                best = min(results, key=lambda r: r["us"])
                row["best_triton_us"], row["best_config"] = best["us"], best["config"]
            if table:
                row["table_pdl_us"] = results[0]["us"]
                row["table_us"] = row["table_nopdl_us"]
            row["cublas_GBps"] = nbytes / row["cublas_us"] / 1e3
            row["best_GBps"] = nbytes / row.get("best_triton_us", math.inf) / 1e3
            nan = float("nan")
            print(f"gemm {name:13s} M={m:2d}  cublas {row['cublas_us']:8.1f} us {row['cublas_GBps']:6.0f} GB/s   "
                  f"table {row.get('table_us', nan):8.1f} us  +pdl {row.get('table_pdl_us', nan):8.1f}  "
                  f"best {row.get('best_triton_us', nan):8.1f} us {row['best_GBps']:6.0f} GB/s  "
                  f"{row.get('best_config')}", flush=True)
            rows.append(row)
            del weights
        save()
    return rows


# ----------------------------------------------------------------------------- RoPE
ROPE_TOKENS = [1, 32, 128, 512, 2048]
ROPE_SHAPE = {"q_heads": 32, "kv_heads": 8, "head_dim": 128}  # Llama-3.1-8B
TINY_ROPE_SHAPE = {"q_heads": 4, "kv_heads": 1, "head_dim": 64}


@functools.cache
def old_rope_launch():
    """BASELINE ONLY, not package code: ``apply_rope_``'s kernel before issue #16 part 3 (one
    1-warp program per (token, head), each recomputing its token's cos / sin), kept here to time
    the rewrite against it on the same inputs."""
    import triton
    import triton.language as tl

    from specdec.models.ops.launch import pdl_kwargs
    from specdec.models.ops.triton_kernels import INTERPRETED, libdevice

    @triton.jit
    def kernel(q_ptr, k_ptr, pos_ptr, inv_freq_ptr, q_stride, k_stride, n_q_heads, half,
               LIBDEVICE: tl.constexpr, PDL: tl.constexpr, BLOCK_D: tl.constexpr):
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        t = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        d = tl.arange(0, BLOCK_D)
        mask = d < half
        pos = tl.load(pos_ptr + t).to(tl.float32)
        angle = pos * tl.load(inv_freq_ptr + d, mask=mask, other=0.0)
        if LIBDEVICE:
            cos, sin = libdevice.cos(angle), libdevice.sin(angle)
        else:
            cos, sin = tl.cos(angle), tl.sin(angle)
        if head < n_q_heads:
            ptr = q_ptr + t * q_stride + head * (2 * half)
        else:
            ptr = k_ptr + t * k_stride + (head - n_q_heads) * (2 * half)
        x1 = tl.load(ptr + d, mask=mask, other=0.0)
        x2 = tl.load(ptr + half + d, mask=mask, other=0.0)
        x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
        tl.store(ptr + d, (x1f * cos - x2f * sin).to(x1.dtype), mask=mask)
        tl.store(ptr + half + d, (x2f * cos + x1f * sin).to(x1.dtype), mask=mask)

    def launch(q, k, positions, inv_freq) -> None:
        half = inv_freq.shape[0]
        hq, hk = q.shape[1] // (2 * half), k.shape[1] // (2 * half)
        kernel[(q.shape[0], hq + hk)](q, k, positions, inv_freq, q.stride(0), k.stride(0), hq, half,
                                      LIBDEVICE=not INTERPRETED, BLOCK_D=max(16, triton.next_power_of_2(half)),
                                      num_warps=1, enable_fp_fusion=False, **pdl_kwargs(q.device))

    return launch


def bench_rope(shape: dict, tokens: list[int], timer: Timer, device: str, copy_bw: float, rows: list, save) -> list:
    """``apply_rope_`` (ours), the old kernel and the torch reference on q / k column slices of one
    fused qkv output (as the model passes them), each launch on the next of up to 64 qkv copies: more
    than 4x L2 in all from T = 512, so q and k come from memory there (below, partly from L2, as
    they would just after the QKV GEMM). Bytes: q and k read and written once, positions, inv_freq."""
    import torch

    from specdec.models.llama import rope_inv_freq
    from specdec.models.ops import apply_rope_ref
    from specdec.models.ops.triton_kernels import apply_rope_ as ours

    hq, hk, d = shape["q_heads"], shape["kv_heads"], shape["head_dim"]
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    inv_freq = rope_inv_freq(d, 500000.0, scaling).to(device)
    old = old_rope_launch()
    for t in tokens:
        gen = torch.Generator(device=device).manual_seed(t)
        width = (hq + 2 * hk) * d
        qkv_bytes = t * width * 2
        copies = min(64, max(2, math.ceil(4 * L2_BYTES / qkv_bytes))) if device != "cpu" else 1
        bufs = [torch.randn(t, width, device=device, dtype=torch.bfloat16, generator=gen) for _ in range(copies)]
        positions = torch.randint(0, 8192, (t,), device=device, generator=gen)
        views = [(b[:, : hq * d], b[:, hq * d : (hq + hk) * d]) for b in bufs]
        launches = max(copies, 8) if device != "cpu" else 1
        qk = [views[i % copies] for i in range(launches)]

        errs = {}
        x = bufs[0].clone()
        want = x.clone()
        apply_rope_ref(want[:, : hq * d], want[:, hq * d : (hq + hk) * d], positions, inv_freq)
        for name, fn in (("ours", ours), ("old", old)):
            got = x.clone()
            fn(got[:, : hq * d], got[:, hq * d : (hq + hk) * d], positions, inv_freq)
            errs[name] = (got.float() - want.float()).abs().max().item()

        nbytes = 2 * t * (hq + hk) * d * 2 + positions.numel() * positions.element_size() + inv_freq.numel() * 4
        row = {"T": t, "q_heads": hq, "kv_heads": hk, "head_dim": d, "bytes": nbytes,
               "max_abs_diff_vs_ref": errs}
        for name, fn in (("ours", ours), ("old", old), ("torch_ref", apply_rope_ref)):
            row[f"{name}_us"] = timer([lambda q=q, k=k, fn=fn: fn(q, k, positions, inv_freq) for q, k in qk]) * 1e6
            row[f"{name}_GBps"] = nbytes / row[f"{name}_us"] / 1e3
        row["speedup_vs_old"] = row["old_us"] / row["ours_us"]
        row["floor_us"] = nbytes / (copy_bw * 1e3) if copy_bw == copy_bw else float("nan")
        row["ours_x_floor"] = row["ours_us"] / row["floor_us"]
        print(f"rope T={t:5d}  ours {row['ours_us']:8.2f} us {row['ours_GBps']:6.0f} GB/s   old "
              f"{row['old_us']:8.2f} us {row['old_GBps']:6.0f} GB/s   torch {row['torch_ref_us']:8.2f} us   "
              f"{row['speedup_vs_old']:.2f}x vs old, {row['ours_x_floor']:.2f}x floor  "
              f"max|diff| vs ref {errs}", flush=True)
        rows.append(row)
        del bufs, views, qk
        save()
    return rows


# ----------------------------------------------------------------------------- report
def markdown(results: dict) -> str:
    env = results["env"]
    lines = [f"# Decode kernels, {env['date']}, {env['device']}, commit {env['commit']}", "",
             f"torch {env['torch']}, triton {env['triton']}.", ""]
    bw = results.get("bandwidth")
    if bw:
        lines += [f"Copy bandwidth {bw['copy_GBps']:.0f} GB/s (read + write), "
                  f"read-only {bw['read_GBps']:.0f} GB/s.", ""]
    if results.get("gemm"):
        lines += ["| shape | N x K | M | cuBLAS us | GB/s | table us | GB/s | table+PDL us | GB/s | best swept us |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["gemm"]:
            mb = r["weight_MB"] * 1e-3
            t, tp = r.get("table_us", math.nan), r.get("table_pdl_us", math.nan)
            lines.append(f"| {r['shape']} | {r['N']}x{r['K']} | {r['M']} | {r['cublas_us']:.1f} | "
                         f"{r['cublas_GBps']:.0f} | {t:.1f} | {mb / t * 1e6:.0f} | {tp:.1f} | {mb / tp * 1e6:.0f} | "
                         f"{r.get('best_triton_us', math.nan):.1f} |")
        lines.append("")
    if results.get("rope"):
        lines += ["| RoPE T | MB moved | ours us | GB/s | x floor | old us | GB/s | speedup | torch ref us |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in results["rope"]:
            lines.append(f"| {r['T']} | {r['bytes'] / 1e6:.2f} | {r['ours_us']:.2f} | {r['ours_GBps']:.0f} | "
                         f"{r['ours_x_floor']:.2f} | {r['old_us']:.2f} | {r['old_GBps']:.0f} | "
                         f"{r['speedup_vs_old']:.2f}x | {r['torch_ref_us']:.2f} |")
        lines.append("")
    e2e = results.get("e2e")
    if e2e:
        paths = [p for p in ("before", "gemv", "gemv+pdl") if p in e2e]
        lines += [f"Plain decode, full model, floor {e2e['floor_ms']:.2f} ms (weights read per step / copy bandwidth; "
                  f"{e2e['floor_ms_all_weights']:.2f} ms counting the embedding table too)", "",
                  "| bs | " + " | ".join(f"{p} ms/step | share of floor" for p in paths) + " | speedup |",
                  "|---|" + "---|---|" * len(paths) + "---|"]
        for points in zip(*(e2e[p] for p in paths)):
            cells = " | ".join(f"{q['step_ms']:.3f} | {q['floor_share']:.0%}" for q in points)
            speedup = points[0]["step_ms"] / points[-1]["step_ms"]
            lines.append(f"| {points[0]['batch_size']} | {cells} | {speedup:.2f}x |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="bandwidth,gemm,rope,breakdown,e2e")
    parser.add_argument("--paths", default="before,gemv,gemv+pdl", help="model paths of the e2e part")
    parser.add_argument("--sweep", action="store_true", help="time candidate configs besides the table's")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--tp", type=int, default=1, help="the gemm part's weights as one of this many "
                        "tensor-parallel ranks holds them (qkv, gate_up, lm_head: N / tp; o, down: K / tp)")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--rope-tokens", default=",".join(map(str, ROPE_TOKENS)))
    parser.add_argument("--layers", type=int, default=4, help="layers of the breakdown's model")
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--context-len", type=int, default=1024)
    parser.add_argument("--decode-steps", type=int, default=24)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--output-dir", default=".")
    parser.add_argument("--output", help="JSON path (the markdown goes next to it); default under --output-dir")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton

    from specdec.bench.synthetic import SHAPES as MODEL_SHAPES

    args.device = "cpu" if args.dry_run else "cuda"
    parts = set(args.parts.split(","))
    shapes = sharded(TINY_SHAPES if args.dry_run else {s: SHAPES[s] for s in args.shapes.split(",")}, args.tp)
    tokens = [int(t) for t in args.tokens.split(",")]
    model_shape = dict(MODEL_SHAPES["tiny" if args.dry_run else "llama-3.1-8b"])
    if args.dry_run:
        from specdec.models.ops import gemv

        gemv._applies = lambda device: True  # NOTE: run the kernels on CPU tensors
        model_shape["hidden_size"], model_shape["intermediate_size"] = 64, 128
    timer = Timer(args.device, args.reps)
    results = {"env": {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name()
                       if args.device == "cuda" else "cpu (dry run)", "torch": torch.__version__,
                       "triton": triton.__version__, "commit": os.environ.get("SPECDEC_COMMIT", "unknown"),
                       "argv": sys.argv[1:]}}
    json_path = Path(args.output) if args.output else Path(args.output_dir) / "bench_decode_kernels.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        json_path.write_text(json.dumps(results, indent=1))
        json_path.with_suffix(".md").write_text(markdown(results))

    with torch.inference_mode():
        if "bandwidth" in parts:
            results["bandwidth"] = bandwidths(args.device)
            print("bandwidth", results["bandwidth"], flush=True)
            save()
        if "gemm" in parts:
            results["gemm"] = []
            bench_gemm(shapes, tokens, timer, args.device, args.sweep, results["gemm"], save)
        if "rope" in parts:
            copy_bw = results.get("bandwidth", {}).get("copy_GBps") or bandwidths(args.device)["copy_GBps"]
            rope_tokens = [1, 5] if args.dry_run else [int(t) for t in args.rope_tokens.split(",")]
            results["rope"] = []
            bench_rope(TINY_ROPE_SHAPE if args.dry_run else ROPE_SHAPE, rope_tokens, timer, args.device, copy_bw,
                       results["rope"], save)
    if "breakdown" in parts:
        results["breakdown"] = breakdown(args, {**model_shape, "num_hidden_layers": args.layers})
        save()
    if "e2e" in parts:
        copy_bw = results.get("bandwidth", {}).get("copy_GBps") or bandwidths(args.device)["copy_GBps"]
        results["e2e"] = {}
        end_to_end(args, model_shape, [int(b) for b in args.batch_sizes.split(",")], copy_bw, results["e2e"], save)
        save()
    print(markdown(results))


if __name__ == "__main__":
    main()
