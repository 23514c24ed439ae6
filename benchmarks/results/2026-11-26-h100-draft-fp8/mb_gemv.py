"""Microbench: the skinny GEMM with 16-bit vs FP8 weights and several tilings, per call, CUDA graph
of rotating weight copies (> L2). Prints a table; writes JSON to argv[1]."""
import json, sys, itertools
import torch
from specdec.models.ops import gemv as G
from specdec.models.ops.gemv_kernels import GemvConfig, gemv

torch.manual_seed(0)
SHAPES = {"h_qkv": (6144, 8192), "h_o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "h_lm": (32000, 4096), "h_fc": (4096, 12288)}
MS = [1, 2, 4, 8, 16, 32]
COPIES = 4

def variants(m):
    base = G._config(G._bucket(m), 1, 1) if m > 2 else None
    out = {}
    if m == 1:
        out["bf16"] = ("bf16", None)
        out["fp8"] = ("fp8", None)
        out["fp8_k2048"] = ("fp8", "elem2048")
        out["fp8_k2048_pf"] = ("fp8", "elem2048pf")
    elif m == 2:
        out["bf16"] = ("bf16", None); out["fp8"] = ("fp8", None); out["fp8_k1024"] = ("fp8", "elem1024")
    else:
        out["bf16"] = ("bf16", None)
        out["fp8"] = ("fp8", None)
        for bk, st, bn in [(512, 4, 32), (512, 3, 32), (512, 4, 64), (256, 6, 32), (1024, 2, 32), (512, 2, 32)]:
            out[f"fp8_n{bn}k{bk}s{st}"] = ("fp8", GemvConfig(bn, bk, num_warps=4, num_stages=st, use_dot=True))
    return out

def cfg_for(m, n, k, spec):
    c = G._config(G._bucket(m), n, k)
    if spec is None: return c
    if isinstance(spec, GemvConfig): return spec
    if spec == "elem2048": return GemvConfig(c.block_n, 2048, num_warps=c.num_warps)
    if spec == "elem2048pf": return GemvConfig(c.block_n, 2048, num_warps=c.num_warps, prefetch=True)
    if spec == "elem1024": return GemvConfig(c.block_n, 1024, num_warps=c.num_warps)

def time_us(fn, reps=20):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps): fn()
    for _ in range(3): g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3 / reps)
    ts.sort(); return ts[len(ts) // 2]

rows = []
for name, (n, k) in SHAPES.items():
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(COPIES)]
    for w in ws: G.attach_fp8_copy_(w)
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        line = {"shape": name, "n": n, "k": k, "m": m}
        for vname, (dt, spec) in variants(m).items():
            cfg = cfg_for(m, n, k, spec)
            i = itertools.count()
            if dt == "bf16":
                fn = lambda i=i, cfg=cfg: gemv(x, ws[next(i) % COPIES], None, cfg)
                nbytes = n * k * 2
            else:
                def fn(i=i, cfg=cfg):
                    q, sc = ws[next(i) % COPIES].fp8_copy
                    return gemv(x, q, None, cfg, scale=sc)
                nbytes = n * k
            try:
                us = time_us(fn)
                line[vname] = round(us, 2)
                line[vname + "_TBs"] = round(nbytes / us / 1e6, 2)
            except Exception as e:
                line[vname] = None; print(name, m, vname, "ERR", str(e)[:200])
        rows.append(line)
        print(" ".join(f"{kk}={vv}" for kk, vv in line.items() if not kk.endswith("_TBs")), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
