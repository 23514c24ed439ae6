"""Deterministic inference's linear layers against the default path's, one 8B-shaped forward's worth
(issue #41: the mode's cost at 64 and 128 rows).

For each M, the linear layers of a Llama-3.1-8B forward (32 x [qkv 6144x4096, o 4096x4096,
gate_up 28672x4096, down 4096x14336] and the lm_head 128256x4096 with fp32 logits), each layer its
own weights (16 GB: L2 holds none of them from one layer to the next), captured in one CUDA graph and
replayed: no launch overhead, only the kernels. Rows:

  default      specdec.models.ops.gemv.linear (the default path: GEMV / tensor-core tiles / cuBLAS by M)
  cublas       F.linear
  det          gemv.linear under --enable-deterministic-inference (the default path's tensor-core
               tilings where its table has one, the batch-invariant kernel elsewhere)
  bi           specdec.models.ops.batch_invariant at its launch_for choice
  gemv ...     (--per-shape) the default path's kernel at one of its table's tilings
  bi t{T}n{N}k{K}w{W}s{S}
               the same kernel at another launch (T-row tiles, N columns, K chunk, W warps, S stages);
               every launch gives the same bits (``--check``, tests/models/test_batch_invariant.py), so
               the fastest for each M may serve it

and the floor: the weights' bytes over the GPU's memory bandwidth (--bandwidth-tbs, H200 4.8).

    python benchmarks/det_linear.py --m 1 64 128 --json $OUT/det_linear.json

``--per-shape``: each weight shape timed alone (its 32 layers in one graph), so the fastest launch of
each shape shows (rows with ``shape``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_metadata  # noqa: E402

from specdec.forward import batch_invariant  # noqa: E402
from specdec.models.ops import gemv, gemv_kernels  # noqa: E402
from specdec.models.ops import batch_invariant_kernels as bik  # noqa: E402

HIDDEN, INTER, VOCAB, LAYERS = 4096, 14336, 128256, 32
LAYER_SHAPES = [(6144, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]  # (N, K)


def make_weights(layers: int, device: str) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
    def w(n, k):
        return (torch.randn(n, k, device=device, dtype=torch.bfloat16) * k ** -0.5).contiguous()

    return [[w(n, k) for n, k in LAYER_SHAPES] for _ in range(layers)], w(VOCAB, HIDDEN)


def forward_linears(fn, xs: dict[int, torch.Tensor], layers, lm_head) -> list[torch.Tensor]:
    """Every linear of one forward through fn(x, w, out_dtype) (inputs by K; outputs kept alive)."""
    outs = [fn(xs[w.shape[1]], w, None) for layer in layers for w in layer]
    outs.append(fn(xs[HIDDEN], lm_head, torch.float32))
    return outs


def time_graph(fn, xs, layers, lm_head, *, replays: int, repeats: int) -> list[float]:
    return time_calls(lambda: forward_linears(fn, xs, layers, lm_head), replays=replays, repeats=repeats)


def time_calls(calls, *, replays: int, repeats: int) -> list[float]:
    """ms of one replay of ``calls()`` captured in a CUDA graph, ``repeats`` samples."""
    calls()  # compile / warm outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / replays)
    del graph
    return samples


def candidate_launches(m: int) -> list[bik.Launch]:
    """Launches beside launch_for's: 16-row tiles (mma.sync on Hopper) up to 16 rows, 64-row ones
    (wgmma), columns, warps, pipeline depth and K chunk."""
    L = bik.Launch
    if m <= 16:
        return [L(16, 32, 2, 8), L(16, 16, 2, 6), L(16, 16, 4, 8), L(16, 16, 2, 8, block_k=128)]
    return [L(64, n, w, s, block_k=bk) for n, w in ((64, 4), (128, 4), (128, 8)) for s in (4, 5, 6)
            for bk in (64, 128) if not (bk == 128 and s > 5)]


def shape_launches(m: int) -> list[bik.Launch]:
    """--per-shape's candidates: launch_for's and other column counts and depths."""
    L = bik.Launch
    if m <= 16:
        return [L(16, n, 2, s, block_k=128) for n in (16, 32) for s in (6, 8)]
    return [L(64, n, w, s, block_k=128) for n, w in ((32, 4), (64, 4), (128, 4), (128, 8)) for s in (3, 4, 5)]


_C = gemv_kernels.GemvConfig
GEMV_CANDIDATES = {  # the default table's tensor-core tilings, at any M (tests/models/test_batch_invariant.py)
    "gemv dot32x256w4s4": _C(32, 256, 4, 4, use_dot=True),
    "gemv dot32x512w4s3": _C(32, 512, 4, 3, use_dot=True),
    "gemv swap64x128w4s5": _C(64, 128, 4, 5, use_dot=True, swap_ab=True),
    "gemv swap128x128w8s3": _C(128, 128, 8, 3, use_dot=True, swap_ab=True),
    "gemv swap128x128w4s4": _C(128, 128, 4, 4, use_dot=True, swap_ab=True),
}


def per_shape(m: int, args) -> list[dict]:
    """Each weight shape alone: its layers' launches in one graph, for default, cublas, det and
    each of shape_launches(m)."""
    rows = []
    shapes = LAYER_SHAPES + [(VOCAB, HIDDEN)]
    for n, k in shapes:
        count = 1 if n == VOCAB else args.layers
        weights = [(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5) for _ in range(count)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        dt = torch.float32 if n == VOCAB else None
        floor_ms = count * n * k * 2 / (args.bandwidth_tbs * 1e12) * 1e3
        runs = {"default": lambda w: gemv.linear(x, w, out_dtype=dt), "cublas": lambda w: F.linear(x, w),
                "det": lambda w: _det(x, w, dt)}
        for launch in shape_launches(m):
            runs[launch_name(launch)] = lambda w, launch=launch: bik.linear(x, w, None, out_dtype=dt or x.dtype,
                                                                             launch=launch)
        for name, config in GEMV_CANDIDATES.items():  # the default path's kernel at other tilings (same bits)
            runs[name] = lambda w, config=config: gemv_kernels.gemv(x, w, None, config, out_dtype=dt,
                                                                     round_out=False)
        for name, fn in runs.items():
            if args.runs and name not in args.runs:
                continue
            try:
                samples = time_calls(lambda fn=fn: [fn(w) for w in weights], replays=args.replays,
                                     repeats=args.repeats)
            except Exception as exc:
                print(f"m={m:4d} {n}x{k} {name:22s} failed: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                continue
            ms = statistics.median(samples)
            rows.append({"m": m, "shape": f"{n}x{k}", "run": name, "ms": round(ms, 4), "min_ms": round(min(samples), 4),
                         "max_ms": round(max(samples), 4), "floor_ms": round(floor_ms, 4)})
            print(f"m={m:4d} {n}x{k} {name:22s} {ms:7.3f} ms (floor {floor_ms:.3f})", flush=True)
    return rows


def _det(x, w, dt):
    with batch_invariant():
        return gemv.linear(x, w, out_dtype=dt)


def launch_name(launch: bik.Launch) -> str:
    return (f"bi t{launch.tile_m}n{launch.block_n}k{launch.block_k}w{launch.num_warps}s{launch.num_stages}")


def check_bits(launches: list[bik.Launch]) -> list[dict]:
    """Each launch's rows against the 16-row M = 1 launch's (the decode step's), at 8B shapes: equal
    bits at M = 128, and its own rows at M = 1 and 64 equal to its M = 128 rows."""
    reference = bik.SKINNY
    out = []
    for n, k, dt in [(6144, HIDDEN, torch.bfloat16), (HIDDEN, INTER, torch.bfloat16), (32768, HIDDEN, torch.float32)]:
        x = torch.randn(128, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        ref = bik.linear(x, w, None, out_dtype=dt, launch=reference)
        for launch in launches:
            try:
                whole = bik.linear(x, w, None, out_dtype=dt, launch=launch)
                own = (torch.equal(bik.linear(x[5:6], w, None, out_dtype=dt, launch=launch), whole[5:6])
                       and torch.equal(bik.linear(x[:64], w, None, out_dtype=dt, launch=launch), whole[:64]))
            except Exception as exc:
                print(f"check {launch_name(launch)} failed: {type(exc).__name__}", flush=True)
                continue
            row = {"n": n, "k": k, "run": launch_name(launch), "equal_to_decode_launch": torch.equal(whole, ref),
                   "max_abs_diff": (whole.float() - ref.float()).abs().max().item(), "rows_invariant": own}
            print(f"check n={n} k={k} {row['run']}: equal to the decode launch {row['equal_to_decode_launch']} "
                  f"(max diff {row['max_abs_diff']:.3g}), its own rows at M = 1 / 64 {own}", flush=True)
            out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16, 64, 128])
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-sweep", action="store_true", help="only default, cublas and bi's own launch")
    parser.add_argument("--check", action="store_true", help="first, each candidate launch's bits (check_bits)")
    parser.add_argument("--per-shape", action="store_true", help="each weight shape alone (per_shape), then stop")
    parser.add_argument("--runs", nargs="+", default=None,
                        help="--per-shape: only these rows (default, cublas, det, ...)")
    parser.add_argument("--bandwidth-tbs", type=float, default=4.8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("det_linear.py: needs a CUDA GPU")
    checks = check_bits(sorted({c for m in args.m for c in candidate_launches(m)})) if args.check else []
    if args.per_shape:
        rows = [row for m in args.m for row in per_shape(m, args)]
        if args.json:
            args.json.write_text(json.dumps({"meta": run_metadata(), "rows": rows, "checks": checks}, indent=1))
        return
    layers, lm_head = make_weights(args.layers, "cuda")
    weight_bytes = sum(w.numel() * 2 for layer in layers for w in layer) + lm_head.numel() * 2
    floor_ms = weight_bytes / (args.bandwidth_tbs * 1e12) * 1e3
    rows = []
    for m in args.m:
        xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in (HIDDEN, INTER)}
        runs = {
            "default": lambda x, w, dt: gemv.linear(x, w, out_dtype=dt),
            "cublas": lambda x, w, dt: F.linear(x, w) if dt is None else F.linear(x, w).to(dt),
            "det": _det,
            "bi": lambda x, w, dt: bik.linear(x, w, None, out_dtype=dt or x.dtype),
        }
        if not args.no_sweep:
            for launch in candidate_launches(m):
                runs[launch_name(launch)] = (
                    lambda x, w, dt, launch=launch: bik.linear(x, w, None, out_dtype=dt or x.dtype, launch=launch))
        for name, fn in runs.items():
            t0 = time.perf_counter()
            try:
                samples = time_graph(fn, xs, layers, lm_head, replays=args.replays, repeats=args.repeats)
            except Exception as exc:  # a launch that does not compile (shared memory, registers): say so, go on
                print(f"m={m:4d} {name:22s} failed: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                continue
            ms = statistics.median(samples)
            row = {"m": m, "run": name, "ms": round(ms, 4), "min_ms": round(min(samples), 4),
                   "max_ms": round(max(samples), 4), "floor_ms": round(floor_ms, 4)}
            if name == "bi":
                row["launch"] = {f"{n}x{k}": bik.launch_for(m, n)._asdict() for n, k in LAYER_SHAPES}
            rows.append(row)
            print(f"m={m:4d} {name:22s} {ms:7.3f} ms (min {min(samples):.3f} max {max(samples):.3f}; floor "
                  f"{floor_ms:.3f}; {time.perf_counter() - t0:.1f} s)", flush=True)
        best = min((r for r in rows if r["m"] == m and r["run"].startswith("bi")), key=lambda r: r["ms"], default=None)
        default = next((r for r in rows if r["m"] == m and r["run"] == "default"), None)
        if best and default:
            ratio = best["ms"] / default["ms"]
            print(f"m={m:4d} best batch-invariant {best['run']} {best['ms']:.3f} ms = {ratio:.2f}x the default path",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps({"meta": run_metadata(), "rows": rows, "checks": checks}, indent=1))


if __name__ == "__main__":
    main()
