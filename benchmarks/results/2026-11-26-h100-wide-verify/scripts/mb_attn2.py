"""Microbench: triton extend_attention (tree verify) with smaller query tiles (BLOCK_M 32 / 64), per call, CUDA graph of 32 calls over
rotating KV buffers (> L2). Writes JSON to argv[1]."""
import json, math, sys
import torch
from specdec.attention.triton_kernels import extend as E
from specdec.attention.triton_kernels.common import LaunchConfig

HQ, HKV, D = 32, 8, 128
CASES = [(1, 1024, 32), (1, 1024, 48), (1, 1024, 64), (1, 1024, 8), (1, 4096, 32), (1, 4096, 64), (2, 1024, 32),
         (4, 1024, 32), (8, 1024, 8), (16, 1024, 4), (64, 1024, 4), (64, 4096, 4), (128, 1024, 4)]
orig_cfg = E.launch_config
orig_bm = E.max_block_m

def tree_mask(n, gen):
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            m[i, j] = True; j = parents[j]
    return m

def setup(bs, ctx, n, copies):
    gen = torch.Generator().manual_seed(0)
    slots_total = bs * (ctx + n)
    kvs = [(torch.randn(slots_total, HKV, D, device="cuda", dtype=torch.bfloat16),
            torch.randn(slots_total, HKV, D, device="cuda", dtype=torch.bfloat16)) for _ in range(copies)]
    table = torch.randperm(slots_total, generator=gen).to(torch.int32).cuda()
    kv_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device="cuda") * (ctx + n)
    qo_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device="cuda") * n
    mask = torch.cat([tree_mask(n, gen).flatten() for _ in range(bs)]).to(torch.uint8).cuda()
    mask_indptr = torch.arange(0, bs + 1, dtype=torch.int64, device="cuda") * n * n
    q = torch.randn(bs * n, HQ, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    return kvs, table, kv_indptr, qo_indptr, mask, mask_indptr, q, out

def run(bs, ctx, n, variant, data, reps=32):
    kvs, table, kv_indptr, qo_indptr, mask, mask_indptr, q, out = data
    cfg = variant.get("cfg")
    E.launch_config = (lambda *a, **k: cfg) if cfg else orig_cfg
    E.max_block_m = (lambda d, bm=variant["bm"]: bm) if variant.get("bm") else orig_bm
    kw = dict(sm_scale=D ** -0.5, max_q_len=n, max_prefix_len=ctx + 64, num_splits=variant.get("splits"),
              new_split=variant.get("new", False))
    calls = []
    def fn(i):
        k, v = kvs[i % len(kvs)]
        E.extend_attention(q, k, v, qo_indptr, kv_indptr, table, mask, mask_indptr, out, **kw)
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(2): fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps): fn(i)
    for _ in range(3): g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3 / reps)
    ts.sort()
    E.launch_config = orig_cfg
    E.max_block_m = orig_bm
    return ts[len(ts) // 2], out.clone()

VARIANTS = {
    "main": {"new": None},
    "bm64": {"bm": 64, "new": None}, "bm64_w4": {"bm": 64, "new": None, "cfg": LaunchConfig(128, 4, 2)},
    "bm64_n64": {"bm": 64, "new": None, "cfg": LaunchConfig(64, 4, 2)},
    "bm32": {"bm": 32, "new": None, "cfg": LaunchConfig(128, 4, 2)},
    "bm64_sp16": {"bm": 64, "new": True, "splits": 16},
}
rows = []
for bs, ctx, n in CASES:
    kv_bytes = bs * (ctx + n) * HKV * D * 2 * 2
    copies = max(2, min(16, math.ceil(120e6 / kv_bytes)))
    data = setup(bs, ctx, n, copies)
    row = {"bs": bs, "ctx": ctx, "n": n, "kv_bytes": kv_bytes}
    ref = None
    for name, v in VARIANTS.items():
        if v.get("cfg") and v["cfg"].num_warps == 8 and bs * n * 4 < 128:
            v = dict(v, cfg=v["cfg"]._replace(num_warps=4))
        try:
            us, o = run(bs, ctx, n, v, data)
            if ref is None: ref = o
            err = (o.float() - ref.float()).abs().max().item()
            row[name] = round(us, 2); row[name + "_err"] = err
        except Exception as e:
            row[name] = None; print(bs, ctx, n, name, "ERR", str(e)[:300])
    rows.append(row)
    print(" ".join(f"{k}={v}" for k, v in row.items() if not k.endswith("_err")), flush=True)
    del data; torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
