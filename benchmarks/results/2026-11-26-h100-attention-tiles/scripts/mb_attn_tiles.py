"""Tile, pipeline, grid-order and split sweep of the Triton decode and extend kernels, per layer call.

Llama-3-8B heads (32 query heads, 8 KV heads, head_dim 128), bf16, page size 1. Each case lays its
requests' slots out contiguously (as the engine's allocator does after prefill) or shuffled; the
planner's own launch ("auto", the library's ``decode_attention`` / ``extend_attention``) and each
variant are timed as CUDA-graph replays over enough separate KV buffers to exceed L2 (µs a layer),
and every variant's output is checked against the library's. Writes one JSON line per case.

    python mb_attn_tiles.py --out DIR [--cases chain64,tree1_4k,...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, "benchmarks")
from bench_attention import copy_bandwidth, graph_ms, random_tree_mask  # noqa: E402
from specdec.attention.triton_kernels.common import LOG2E, dot_precision, head_dim_block  # noqa: E402
from specdec.attention.triton_kernels.decode import _decode_kernel, decode_attention  # noqa: E402
from specdec.attention.triton_kernels.extend import _extend_kernel, extend_attention, new_block_n  # noqa: E402
from specdec.attention.triton_kernels.merge import merge_partials  # noqa: E402

HQ, HKV, D = 32, 8, 128
GROUP = HQ // HKV
DT = torch.bfloat16
SCALE = D**-0.5
L2_BYTES = 256 * 2**20  # rotate over KV buffers of at least this much in all
DEVICE = "cuda"


def chain_cfgs():
    for bn, st, w, sp, hf in itertools.product((64, 128), (2, 3, 4), (2, 4), (1, 2), (False, True)):
        yield dict(block_m=16, block_n=bn, stages=st, warps=w, splits=sp, new_split=False, heads_first=hf)


def chain_new_cfgs():
    """The new tokens' tile as wide as the prefix's (``wide_new``, before) or as narrow as they need."""
    for bn, st, w, sp, hf, wide in itertools.product((64, 128), (2, 3), (2, 4), (1, 2), (False, True), (False, True)):
        yield dict(block_m=16, block_n=bn, stages=st, warps=w, splits=sp, new_split=False, heads_first=hf,
                   wide_new=wide)


def tree_cfgs(split_counts):
    for (bm, w), bn, st, sp, ns in itertools.product(((64, 4), (128, 4), (128, 8), (256, 8), (256, 16)), (64, 128),
                                                     (2, 3), split_counts, (False, True)):
        yield dict(block_m=bm, block_n=bn, stages=st, warps=w, splits=sp, new_split=ns, heads_first=False)


def decode_cfgs(split_counts, heads_first=(False, True)):
    for bn, st, w, sp, hf in itertools.product((32, 64, 128), (2, 3, 4), (2, 4), split_counts, heads_first):
        yield dict(block_n=bn, stages=st, warps=w, splits=sp, heads_first=hf)


# name: (mode, bs, ctx, rows a sequence, tree, variants)
CASES = {
    "chain64_1k": ("verify", 64, 1024, 4, False, lambda: chain_cfgs()),
    "chain64_4k": ("verify", 64, 4096, 4, False, lambda: chain_cfgs()),
    "chain32_1k": ("verify", 32, 1024, 4, False, lambda: chain_cfgs()),
    "chain16_1k_new": ("verify", 16, 1024, 4, False, lambda: chain_new_cfgs()),
    "chain32_1k_new": ("verify", 32, 1024, 4, False, lambda: chain_new_cfgs()),
    "chain64_1k_new": ("verify", 64, 1024, 4, False, lambda: chain_new_cfgs()),
    "chain128_1k_new": ("verify", 128, 1024, 4, False, lambda: chain_new_cfgs()),
    "chain64_4k_new": ("verify", 64, 4096, 4, False, lambda: chain_new_cfgs()),
    "decode16_1k": ("decode", 16, 1024, 1, False, lambda: decode_cfgs((1, 2))),
    "decode32_1k": ("decode", 32, 1024, 1, False, lambda: decode_cfgs((1, 2))),
    "decode128_1k": ("decode", 128, 1024, 1, False, lambda: decode_cfgs((1, 2))),
    "tree1_4k": ("verify", 1, 4096, 64, True, lambda: tree_cfgs((4, 7, 14))),
    "tree1_1k": ("verify", 1, 1024, 64, True, lambda: tree_cfgs((2, 4, 7))),
    "decode64_1k": ("decode", 64, 1024, 1, False, lambda: decode_cfgs((1, 2))),
    "decode64_4k": ("decode", 64, 4096, 1, False, lambda: decode_cfgs((1, 2))),
    "decode1_4k": ("decode", 1, 4096, 1, False, lambda: decode_cfgs((16, 32, 64), heads_first=(False,))),
}


class Inputs:
    def __init__(self, mode, bs, ctx, n, tree, shuffled, gen):
        kv = ctx + n
        num_slots = bs * kv
        per_layer = 2 * num_slots * HKV * D * DT.itemsize
        self.layers = max(1, min(16, math.ceil(L2_BYTES / per_layer)))
        self.kv_bytes = per_layer
        order = torch.randperm(num_slots, generator=gen) if shuffled else torch.arange(num_slots)
        self.kv_indices = order.to(torch.int32).to(DEVICE)
        self.kv_indptr = (torch.arange(bs + 1) * kv).to(torch.int32).to(DEVICE)
        self.qo_indptr = (torch.arange(bs + 1) * n).to(torch.int32).to(DEVICE)
        self.k = [torch.randn(num_slots, HKV, D, dtype=DT, device=DEVICE) for _ in range(self.layers)]
        self.v = [torch.randn(num_slots, HKV, D, dtype=DT, device=DEVICE) for _ in range(self.layers)]
        self.q = torch.randn(bs * n, HQ, D, dtype=DT, device=DEVICE)
        self.out = torch.empty_like(self.q)
        self.mode, self.bs, self.ctx, self.n = mode, bs, ctx, n
        if mode == "verify":
            blocks = [random_tree_mask(n, gen) if tree else torch.ones(n, n, dtype=torch.bool).tril() for _ in range(bs)]
            self.mask = torch.cat([b.flatten() for b in blocks]).to(torch.uint8).to(DEVICE)
            self.mask_indptr = (torch.arange(bs + 1) * n * n).to(DEVICE)

    def library(self, i):
        if self.mode == "decode":
            decode_attention(self.q, self.k[i], self.v[i], self.kv_indptr, self.kv_indices, self.out,
                             sm_scale=SCALE, max_kv_len=self.ctx + 1)
        else:
            extend_attention(self.q, self.k[i], self.v[i], self.qo_indptr, self.kv_indptr, self.kv_indices,
                             self.mask, self.mask_indptr, self.out, sm_scale=SCALE, max_q_len=self.n,
                             max_prefix_len=self.ctx)

    def variant(self, cfg):
        """A launcher of one layer's call under ``cfg`` (buffers allocated here, outside the timing)."""
        rows = self.q.shape[0]
        if self.mode == "decode":
            total, grid_z = cfg["splits"], cfg["splits"]
            kernel_args = lambda i, partial, lse: (  # noqa: E731
                self.q, self.k[i], self.v[i], partial, lse, self.kv_indptr, self.kv_indices, SCALE * LOG2E)
            consts = dict(GROUP=GROUP, HEAD_DIM=D, BLOCK_D=head_dim_block(D), BLOCK_H=16, BLOCK_N=cfg["block_n"])
            kernel = _decode_kernel
        else:
            total = cfg["splits"] + int(cfg["new_split"])
            grid_z = triton.cdiv(self.n * GROUP, cfg["block_m"]) * total
            kernel_args = lambda i, partial, lse: (  # noqa: E731
                self.q, self.k[i], self.v[i], partial, lse, self.qo_indptr, self.kv_indptr, self.kv_indices,
                self.mask, self.mask_indptr, SCALE * LOG2E, total)
            consts = dict(GROUP=GROUP, HEAD_DIM=D, BLOCK_D=head_dim_block(D), BLOCK_M=cfg["block_m"],
                          BLOCK_N=cfg["block_n"], HAS_MASK=True, NEW_SPLIT=cfg["new_split"],
                          BLOCK_NEW=cfg["block_n"] if cfg.get("wide_new", True) else new_block_n(self.n, cfg["block_n"]))
            kernel = _extend_kernel
        direct = total == 1
        if direct:
            partial, lse = self.out.unsqueeze(2), self.out
        else:
            partial = torch.empty(rows, HQ, total, D, dtype=torch.float32, device=DEVICE)
            lse = torch.empty(rows, HQ, total, dtype=torch.float32, device=DEVICE)
        grid = (HKV, self.bs, grid_z) if cfg["heads_first"] else (self.bs, HKV, grid_z)
        strides = (self.q.stride(0), self.q.stride(1), self.k[0].stride(0), self.k[0].stride(1),
                   self.v[0].stride(0), self.v[0].stride(1), partial.stride(0), partial.stride(1), partial.stride(2),
                   lse.stride(0), lse.stride(1))

        def call(i):
            kernel[grid](*kernel_args(i, partial, lse), *strides, **consts, DIRECT=direct,
                         DOT_PRECISION=dot_precision(DT, self.q.device), HEADS_FIRST=cfg["heads_first"],
                         num_warps=cfg["warps"], num_stages=cfg["stages"])
            if not direct:
                merge_partials(partial, lse, self.out)
        return call

    def time_us(self, call) -> float:
        if DEVICE == "cpu":  # --dry-run: the wiring only
            call(0)
            return 0.0
        def all_layers():
            for i in range(self.layers):
                call(i)
        return 1e3 * graph_ms(all_layers, warmup=5, iters=30) / self.layers


def run_case(name, args, bandwidth):
    mode, bs, ctx, n, tree, cfgs = CASES[name]
    gen = torch.Generator().manual_seed(0)
    row = {"case": name, "mode": mode, "bs": bs, "ctx": ctx, "rows_per_seq": n, "tree": tree}
    for shuffled in (False, True):
        inp = Inputs(mode, bs, ctx, n, tree, shuffled, gen)
        row["floor_us"] = inp.kv_bytes / bandwidth * 1e6
        inp.library(0)
        ref = inp.out.clone()
        key = "shuffled" if shuffled else "contiguous"
        row[f"auto_{key}_us"] = inp.time_us(inp.library)
        if shuffled:  # the sweep runs on the contiguous layout only
            break
        results = []
        t0 = time.time()
        for cfg in cfgs():
            try:
                call = inp.variant(cfg)
                inp.out.zero_()
                call(0)
                err = (inp.out.float() - ref.float()).abs().max().item()
                us = inp.time_us(call) if err < 2e-2 else None
            except Exception as e:  # noqa: BLE001 - out of shared memory, registers: recorded, skipped
                err, us = None, None
                cfg = {**cfg, "error": str(e).splitlines()[0][:120]}
            results.append({**cfg, "us": us, "max_err": err})
        row["variants"] = results
        row["sweep_s"] = time.time() - t0
        del inp
        torch.cuda.empty_cache()
    ok = [r for r in row["variants"] if r["us"] is not None]
    row["best"] = min(ok, key=lambda r: r["us"]) if ok else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--dry-run", action="store_true", help="CPU (TRITON_INTERPRET=1), tiny sizes, 2 variants")
    args = parser.parse_args()
    if args.dry_run:
        global DEVICE
        DEVICE = "cpu"
        for name, (mode, bs, ctx, n, tree, cfgs) in list(CASES.items()):
            CASES[name] = (mode, min(bs, 2), 48, min(n, 8), tree,
                           lambda cfgs=cfgs: itertools.islice(cfgs(), 2))
    args.out.mkdir(parents=True, exist_ok=True)
    bandwidth = 1e12 if args.dry_run else copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    with open(args.out / "mb_attn_tiles.jsonl", "a") as f:
        for name in args.cases.split(","):
            row = run_case(name, args, bandwidth)
            row["bandwidth"] = bandwidth
            f.write(json.dumps(row) + "\n")
            f.flush()
            errors = [r["error"] for r in row["variants"] if "error" in r]
            print(f"{name}: floor {row['floor_us']:.1f} auto {row['auto_contiguous_us']:.1f} "
                  f"(shuffled {row['auto_shuffled_us']:.1f}) best {row['best']} ({row['sweep_s']:.0f} s, "
                  f"{len(row['variants'])} variants, {len(errors)} failed{': ' + errors[0] if errors else ''})",
                  flush=True)


if __name__ == "__main__":
    main()
