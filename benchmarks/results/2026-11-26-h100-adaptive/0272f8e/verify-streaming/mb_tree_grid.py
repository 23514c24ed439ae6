"""Microbench: triton extend_attention for a tree verify at small batch over long prefixes (bs 1-2, 32-64
nodes, ctx 1-4 k), the grid ../../../2026-11-26-h100-tree-attention-4k/mb_tree4k.py left out: 64-row query
tiles with 64- and 32-entry KV tiles of 4 warps (no spills) against more prefix splits, per call (merge included), CUDA
graph of 32 calls over rotating KV buffers (> L2). Every variant's output is checked against the
planner's. Writes JSON to argv[1]."""
import json, math, sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd() / "benchmarks"))
from bench_attention import random_tree_mask  # noqa: E402
from specdec.attention.triton_kernels import extend as E  # noqa: E402
from specdec.attention.triton_kernels.common import LaunchConfig  # noqa: E402

HQ, HKV, D = 32, 8, 128
CASES = [(1, 4096, 32), (1, 4096, 64), (1, 2048, 32), (1, 1024, 32), (2, 4096, 32)]
orig_cfg, orig_bm = E.launch_config, E.extend_block_m


def setup(bs, ctx, n, copies):
    gen = torch.Generator().manual_seed(0)
    slots = bs * (ctx + n)
    kvs = [(torch.randn(slots, HKV, D, device="cuda", dtype=torch.bfloat16),
            torch.randn(slots, HKV, D, device="cuda", dtype=torch.bfloat16)) for _ in range(copies)]
    table = torch.randperm(slots, generator=gen).to(torch.int32).cuda()
    kv_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device="cuda") * (ctx + n)
    qo_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device="cuda") * n
    mask = torch.cat([random_tree_mask(n, gen).flatten() for _ in range(bs)]).to(torch.uint8).cuda()
    mask_indptr = torch.arange(0, bs + 1, dtype=torch.int64, device="cuda") * n * n
    q = torch.randn(bs * n, HQ, D, device="cuda", dtype=torch.bfloat16)
    return kvs, table, kv_indptr, qo_indptr, mask, mask_indptr, q, torch.empty_like(q)


def run(ctx, n, variant, data, reps=32):
    kvs, table, kv_indptr, qo_indptr, mask, mask_indptr, q, out = data
    if variant.get("cfg"):
        E.launch_config = lambda *a, **k: variant["cfg"]
    if variant.get("bm"):
        E.extend_block_m = lambda *a, **k: variant["bm"]
    kw = dict(sm_scale=D ** -0.5, max_q_len=n, max_prefix_len=ctx + 64, num_splits=variant.get("splits"),
              new_split=variant.get("new"))

    def fn(i):
        k, v = kvs[i % len(kvs)]
        E.extend_attention(q, k, v, qo_indptr, kv_indptr, table, mask, mask_indptr, out, **kw)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(2):
                fn(i)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(reps):
                fn(i)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        ts = []
        for _ in range(15):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); g.replay(); b.record(); b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3 / reps)
        ts.sort()
        fn(0); torch.cuda.synchronize()
        return ts[len(ts) // 2], out.clone()
    finally:
        E.launch_config, E.extend_block_m = orig_cfg, orig_bm


VARIANTS = {"main": {}}
for bm in (128, 64):
    for bn, w, st in [(128, 8, 3), (64, 8, 3), (64, 4, 3), (64, 4, 2), (32, 4, 3)]:
        for sp in (None, 7, 11, 15, 23, 31):
            if bm == 128 and (bn, w, st) == (128, 8, 3) and sp is None:
                continue
            v = {"cfg": LaunchConfig(bn, w, st), "bm": bm}
            if sp is not None:
                v.update(splits=sp, new=True)
            VARIANTS[f"bm{bm}_n{bn}w{w}s{st}_sp{sp or 'auto'}"] = v

rows = []
for bs, ctx, n in CASES:
    kv_bytes = bs * (ctx + n) * HKV * D * 2 * 2
    data = setup(bs, ctx, n, max(2, min(16, math.ceil(120e6 / kv_bytes))))
    row = {"bs": bs, "ctx": ctx, "n": n, "floor_us": kv_bytes / 3.0e6, "us": {}}
    ref = None
    for name, v in VARIANTS.items():
        try:
            us, o = run(ctx, n, v, data)
        except Exception as e:  # a config that does not compile or fit
            row["us"][name] = f"ERR {type(e).__name__}: {str(e).splitlines()[0][:80]}"
            continue
        if ref is None:
            ref = o
        err = (o.float() - ref.float()).abs().max().item()
        row["us"][name] = round(us, 2) if err < 2e-2 else f"WRONG {err:.3g}"
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
for row in rows:
    timed = {k: v for k, v in row["us"].items() if isinstance(v, float)}
    best = sorted(timed.items(), key=lambda kv: kv[1])[:4]
    print(f"bs {row['bs']} ctx {row['ctx']} n {row['n']}: main {row['us']['main']}, best {best}", flush=True)
