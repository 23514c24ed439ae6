"""The draft head's GEMMs with FP8 copies (``--speculative-draft-model-quantization fp8``), per call.

For each GEMM of an 8B-shaped EAGLE-3 head and each token count, microseconds a call of:

    bf16        the 16-bit weight as the model runs it (``gemv.linear``: the Triton table or cuBLAS)
    w8a16       the skinny kernel reading the FP8 copy (the path up to FP8_MAX_TOKENS), <= 32 tokens
    w8a8        the activations quantized per token, then ``torch._scaled_mm`` (the path past it
                where ``gemv._w8a8_pays``)
    w8a8_fast   the same with Hopper's fast FP8 accumulation (no promotion to fp32)
    w8a8_gemm   ``torch._scaled_mm`` alone, on activations quantized beforehand
    w8a8_triton the activations quantized, then the split-K Triton GEMM with the dispatch table's
                tiling (``gemv._w8a8_config``), where the table has one

and the floor: the FP8 copy's bytes at the measured copy bandwidth. Each timing is a CUDA graph of
20 calls over 4 rotating weight copies (more bytes than L2), the median of 10 replays
(``specdec.bench.device_timing.graph_us``). Every W8A8
result is checked against ``gemv.linear_w8a8_ref`` first (``*_row_err``: the largest relative error
of a token's output row).

``--tune`` times the Triton W8A8 GEMM alone over a grid of tilings instead (``tune_configs``), each
checked against the reference first, next to ``torch._scaled_mm`` alone: the measurements behind
the dispatch table (``w8a8_tune.json``), with the row error of the fastest tiling at three
promotion intervals of the FP8 MMA's sum.

    python benchmarks/bench_draft_gemm.py --output-dir OUT      # writes OUT/draft_gemm.json
    python benchmarks/bench_draft_gemm.py --tune --output-dir OUT   # writes OUT/w8a8_tune.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from pathlib import Path

import torch

from common import run_metadata
from specdec.bench.device_timing import copy_bandwidth, graph_us
from specdec.models.ops import gemv
from specdec.models.ops.gemv_kernels import gemv as gemv_launch
from specdec.models.ops.gemv_kernels import quantize_rows_fp8
from specdec.models.ops.w8a8_kernels import W8A8Config, w8a8_gemm

# an EAGLE-3 head for Llama-3.1-8B: [N, K] of each GEMM weight
SHAPES = {"qkv": (6144, 8192), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (32000, 4096), "fc": (4096, 12288)}
TOKENS = [8, 16, 17, 24, 32, 48, 64, 128, 256]
COPIES = 4
CALLS = 20  # a graph replays this many calls back to back (its launch latency divided among them)


def scaled_mm(xq, x_scale, q, scale, *, fast: bool) -> torch.Tensor:
    return torch._scaled_mm(xq, q.t(), scale_a=x_scale[:, None], scale_b=scale[None, :], out_dtype=torch.bfloat16,
                            use_fast_accum=fast)


def variants(m: int, x: torch.Tensor, weights: list[torch.Tensor]) -> dict:
    turn = itertools.count()

    def weight() -> torch.Tensor:
        return weights[next(turn) % COPIES]

    xq, x_scale = quantize_rows_fp8(x)
    out = {
        "bf16": lambda: gemv.linear(x, weight()),  # NOTE: the copies carry no FP8 attribute here: see main
        "w8a8": lambda: scaled_mm(*quantize_rows_fp8(x), *weight().fp8, fast=False),
        "w8a8_fast": lambda: scaled_mm(*quantize_rows_fp8(x), *weight().fp8, fast=True),
        "w8a8_gemm": lambda: scaled_mm(xq, x_scale, *weight().fp8, fast=False),
    }
    n, k = weights[0].shape
    config = gemv._w8a8_config(gemv._bucket(m), n, k)
    if config is not None:
        out["w8a8_triton"] = lambda: w8a8_gemm(*quantize_rows_fp8(x), *weight().fp8, None, config)
    if m <= gemv.MAX_TOKENS:
        config = gemv._fp8_config(gemv._bucket(m), *weights[0].shape)

        def w8a16():
            q, scale = weight().fp8
            return gemv_launch(x, q, None, config, scale=scale)

        out["w8a16"] = w8a16
    return out


def row_error(x: torch.Tensor, w: torch.Tensor, *, fast: bool) -> float:
    """The largest relative error of a token's ``torch._scaled_mm`` W8A8 output row against its
    reference (fp32 sums of the same operands)."""
    q, scale = w.fp8
    return w8a8_row_error(scaled_mm(*quantize_rows_fp8(x), q, scale, fast=fast), x, q, scale)


def tune_configs(m: int, n: int) -> list[W8A8Config]:
    """The tilings ``--tune`` tries for ``m`` tokens against N = ``n`` weight rows: 64 tokens a tile
    (4 warps) with 64-256 weight rows, or 128 tokens (8 warps) with 64-128 (256 spilled registers
    with the sum promoted every 128 products); K chunks of 128 bytes; and the splits along K that
    give a wave of 100-1100 programs (always 1 too)."""
    out = []
    for block_m, block_ns, num_warps in [(64, (64, 128, 256), 4), (128, (64, 128), 8)]:
        if block_m > 64 and m <= 64:
            continue
        for block_n in block_ns:
            tiles = -(-m // block_m) * -(-n // block_n)
            for split_k in (1, 2, 4, 8):
                if split_k == 1 or 100 <= tiles * split_k <= 1100:
                    out.append(W8A8Config(block_m, block_n, 128, split_k, num_warps, 3 if block_n == 256 else 4))
    return out


def w8a8_row_error(out: torch.Tensor, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> float:
    """The largest relative error of a token's output row against ``linear_w8a8_ref``."""
    ref = gemv.linear_w8a8_ref(x, q, scale).double()
    return ((out.double() - ref).norm(dim=1) / ref.norm(dim=1)).max().item()


def tune(opts, bandwidth: float) -> None:
    rows = []
    for name, (n, k) in SHAPES.items():
        weights = []
        for _ in range(COPIES):
            w = gemv.attach_fp8_copy_(torch.randn(n, k, device="cuda").mul_(k**-0.5).to(torch.bfloat16))
            weights.append(w.fp8_copy)
        for m in map(int, opts.tokens.split(",")):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            xq, x_scale = quantize_rows_fp8(x)
            turn = itertools.count()
            row = {"gemm": name, "n": n, "k": k, "tokens": m, "floor_us": round(n * k / bandwidth * 1e6, 2),
                   "scaled_mm": round(graph_us(lambda: scaled_mm(xq, x_scale, *weights[next(turn) % COPIES],
                                                                 fast=False), reps=10, calls=CALLS), 2),
                   "configs": []}
            for config in tune_configs(m, n):
                err = w8a8_row_error(w8a8_gemm(xq, x_scale, *weights[0], None, config), x, *weights[0])
                if not err < 4e-3:
                    raise AssertionError(f"Triton W8A8 off its reference: {name} m={m} {config}: {err:.3g}")
                us = graph_us(lambda: w8a8_gemm(xq, x_scale, *weights[next(turn) % COPIES], None, config),
                              reps=10, calls=CALLS)
                row["configs"].append({**dataclasses.asdict(config), "us": round(us, 2), "row_err": round(err, 6)})
            best = min(row["configs"], key=lambda c: c["us"])
            row["best"] = best
            row["best_row_err_by_promotion"] = {  # 0: no promotion, the MMA's own accumulation
                str(every): round(w8a8_row_error(w8a8_gemm(xq, x_scale, *weights[0], None, W8A8Config(**{
                    **{f: best[f] for f in ("block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages")},
                    "promote_every": every})), x, *weights[0]), 6)
                for every in (32, 128, 0)}
            rows.append(row)
            print(f"{name} m={m} floor={row['floor_us']} scaled_mm={row['scaled_mm']} best={best}", flush=True)
    opts.output_dir.mkdir(parents=True, exist_ok=True)
    path = opts.output_dir / "w8a8_tune.json"
    path.write_text(json.dumps({**run_metadata(), "copy_bandwidth_GBps": round(bandwidth / 1e9, 1), "rows": rows}, indent=1))
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=Path("."))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    parser.add_argument("--tune", action="store_true", help="time the Triton W8A8 GEMM's tilings (w8a8_tune.json)")
    opts = parser.parse_args()
    bandwidth = copy_bandwidth()  # bytes/s
    if opts.tune:
        return tune(opts, bandwidth)
    rows = []
    for name, (n, k) in SHAPES.items():
        weights = []
        for _ in range(COPIES):
            w = torch.randn(n, k, device="cuda").mul_(k**-0.5).to(torch.bfloat16)
            gemv.attach_fp8_copy_(w)
            w.fp8 = w.fp8_copy  # NOTE: moved aside: "bf16" runs the dispatch on the 16-bit weight
            del w.fp8_copy
            weights.append(w)
        for m in map(int, opts.tokens.split(",")):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            row = {"gemm": name, "n": n, "k": k, "tokens": m, "floor_us": round(n * k / bandwidth * 1e6, 2),
                   "w8a8_row_err": round(row_error(x, weights[0], fast=False), 5),
                   "w8a8_fast_row_err": round(row_error(x, weights[0], fast=True), 5)}
            if not row["w8a8_row_err"] < 1e-2:
                raise AssertionError(f"W8A8 off its reference: {row}")
            for variant, fn in variants(m, x, weights).items():
                row[variant] = round(graph_us(fn, reps=10, calls=CALLS), 2)
            rows.append(row)
            print("  ".join(f"{key}={value}" for key, value in row.items()), flush=True)
    opts.output_dir.mkdir(parents=True, exist_ok=True)
    path = opts.output_dir / "draft_gemm.json"
    path.write_text(json.dumps({**run_metadata(), "copy_bandwidth_GBps": round(bandwidth / 1e9, 1), "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
