"""Run the three attention launches issue #16's open cells hinge on, a few times each, for ncu:
A chain verify (N = 4 masked) at bs 64, ctx 1 k; B plain decode at bs 64, ctx 1 k; C a 32-node
tree verify at bs 1, ctx 4 k. Prints each one's CUDA-graph time per call first (32 calls over
rotating KV copies, > L2)."""
import math, sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd() / "benchmarks"))
from bench_attention import random_tree_mask  # noqa: E402
from specdec.attention.triton_kernels.decode import decode_attention  # noqa: E402
from specdec.attention.triton_kernels.extend import extend_attention  # noqa: E402

HQ, HKV, D = 32, 8, 128


def setup(bs, ctx, n, copies, chain):
    gen = torch.Generator().manual_seed(0)
    slots = bs * (ctx + n)
    kvs = [(torch.randn(slots, HKV, D, device="cuda", dtype=torch.bfloat16),
            torch.randn(slots, HKV, D, device="cuda", dtype=torch.bfloat16)) for _ in range(copies)]
    table = torch.randperm(slots, generator=gen).to(torch.int32).cuda()
    kv_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device="cuda") * (ctx + n)
    qo_indptr = torch.arange(0, bs + 1, dtype=torch.int32, device="cuda") * n
    one = torch.ones(n, n).tril() if chain else None
    mask = torch.cat([(one if chain else random_tree_mask(n, gen)).flatten() for _ in range(bs)]).to(torch.uint8).cuda()
    mask_indptr = torch.arange(0, bs + 1, dtype=torch.int64, device="cuda") * n * n
    q = torch.randn(bs * n, HQ, D, device="cuda", dtype=torch.bfloat16)
    return kvs, table, kv_indptr, qo_indptr, mask, mask_indptr, q, torch.empty_like(q)


def launcher(case):
    bs, ctx, n, kind = case
    kv_bytes = bs * (ctx + n) * HKV * D * 2 * 2
    kvs, table, kv_indptr, qo_indptr, mask, mask_indptr, q, out = setup(
        bs, ctx, n, max(2, min(16, math.ceil(120e6 / kv_bytes))), chain=kind == "chain")
    if kind == "decode":
        def fn(i):
            k, v = kvs[i % len(kvs)]
            decode_attention(q, k, v, kv_indptr, table, out, sm_scale=D ** -0.5, max_kv_len=ctx + 64)
    else:
        def fn(i):
            k, v = kvs[i % len(kvs)]
            extend_attention(q, k, v, qo_indptr, kv_indptr, table, mask, mask_indptr, out, sm_scale=D ** -0.5,
                             max_q_len=n, max_prefix_len=ctx + 64)
    return fn, kv_bytes


if __name__ == "__main__":
    CASES = {"A": (64, 1024, 4, "chain"), "B": (64, 1024, 1, "decode"), "C": (1, 4096, 32, "tree")}
    for name in sys.argv[1:] or CASES:
        fn, kv_bytes = launcher(CASES[name])
        for i in range(3):
            fn(i)
        torch.cuda.synchronize()
        if "--time" in sys.argv or True:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(32):
                    fn(i)
            g.replay(); torch.cuda.synchronize()
            ts = []
            for _ in range(11):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); g.replay(); b.record(); b.synchronize()
                ts.append(a.elapsed_time(b) * 1e3 / 32)
            print(f"{name} {CASES[name]}: {sorted(ts)[5]:.1f} us a call, KV floor {kv_bytes / 3.0e6:.1f} us", flush=True)
        torch.cuda.nvtx.range_push(f"case{name}")
        for i in range(3):
            fn(i)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
