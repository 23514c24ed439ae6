"""Microbench: extend_attention (chain / tree verify) with the decode kernel's streaming tiles and
other launch configs, µs a call (merge included), CUDA graph of 32 calls over rotating KV copies
(> L2); each variant's output checked against main's."""
import json, math, sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path.cwd() / "benchmarks"))
from ncu_attn import setup, HKV, D  # noqa: E402
from specdec.attention.triton_kernels import extend as E  # noqa: E402
from specdec.attention.triton_kernels.common import LaunchConfig  # noqa: E402

orig = E.launch_config
CASES = [(64, 1024, 4, "chain"), (32, 1024, 4, "chain"), (128, 1024, 4, "chain"), (64, 4096, 4, "chain"),
         (64, 1024, 8, "tree"), (16, 1024, 4, "chain"), (128, 1024, 3, "chain"), (64, 1024, 3, "chain")]
VARIANTS = {"main": None}
for bn, w, st in [(64, 2, 3), (64, 2, 2), (64, 2, 4), (64, 4, 3), (32, 2, 3), (128, 2, 2), (128, 2, 3)]:
    VARIANTS[f"n{bn}w{w}s{st}"] = LaunchConfig(bn, w, st)


def timed(fn, reps=32):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
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
    return sorted(ts)[7]


rows = []
for bs, ctx, n, kind in CASES:
    kv_bytes = bs * (ctx + n) * HKV * D * 2 * 2
    kvs, table, kv_indptr, qo_indptr, mask, mask_indptr, q, out = setup(
        bs, ctx, n, max(2, min(16, math.ceil(120e6 / kv_bytes))), chain=kind == "chain")
    row = {"bs": bs, "ctx": ctx, "n": n, "kind": kind, "floor_us": round(kv_bytes / 3.0e6, 1), "us": {}}
    ref = None
    for name, cfg in VARIANTS.items():
        E.launch_config = orig if cfg is None else (lambda *a, cfg=cfg, **k: cfg)

        def fn(i):
            k, v = kvs[i % len(kvs)]
            E.extend_attention(q, k, v, qo_indptr, kv_indptr, table, mask, mask_indptr, out, sm_scale=D ** -0.5,
                               max_q_len=n, max_prefix_len=ctx + 64)
        try:
            us = timed(fn)
            fn(0); torch.cuda.synchronize()
            o = out.clone()
        except Exception as e:
            row["us"][name] = f"ERR {type(e).__name__}: {str(e).splitlines()[0][:60]}"
            continue
        finally:
            E.launch_config = orig
        if ref is None:
            ref = o
        err = (o.float() - ref.float()).abs().max().item()
        row["us"][name] = round(us, 2) if err < 2e-2 else f"WRONG {err:.3g}"
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
