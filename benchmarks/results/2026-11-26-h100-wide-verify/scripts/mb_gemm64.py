"""Microbench: GEMMs of 33-64 tokens (M = 48, 64; trees of 48-64 nodes at bs 1, plain at bs 33-64) against the 8B's weights, per call, CUDA graph of
rotating weight copies (> L2). The shipped skinny kernel over a grid of tilings, a swap-AB kernel
(W as the MMA's M side: [BLOCK_N, BLOCK_K] x [BLOCK_K, M], wgmma-eligible) with pointer loads and
with TMA descriptor loads, cuBLAS, and the M = 1 GEMV for reference. Writes JSON to argv[1]."""
import itertools
import json
import sys

import torch
import triton
import triton.language as tl

from specdec.models.ops import gemv as G
from specdec.models.ops.gemv_kernels import GemvConfig, gemv

INTERP = not torch.cuda.is_available()
DEV = "cpu" if INTERP else "cuda"
torch.manual_seed(0)
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}
if INTERP:
    SHAPES = {"tiny": (256, 512)}
MS = [64, 48, 40] if not INTERP else [40, 5]
COPIES = 1 if INTERP else 4


@triton.jit
def _swap_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = (pid * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=(offs_n < N)[:, None], other=0.0,
                    eviction_policy="evict_first")
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=(offs_m < M)[:, None], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
    tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=(offs_m < M)[None, :] & (offs_n < N)[:, None])


@triton.jit
def _swap_tma_kernel(x_ptr, w_desc, out_ptr, M, N, K, stride_xm, stride_om,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    n0 = pid * BLOCK_N
    offs_n = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w = w_desc.load([n0, k0])
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=(offs_m < M)[:, None], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
    tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=(offs_m < M)[None, :] & (offs_n < N)[:, None])


def swap(x, w, bn, bk, warps, stages, tma=False, desc=None):
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    bm = max(16, triton.next_power_of_2(m)) if not INTERP else max(16, triton.next_power_of_2(m))
    grid = (triton.cdiv(n, bn),)
    if tma:
        _swap_tma_kernel[grid](x, desc, out, m, n, k, x.stride(0), out.stride(0), BLOCK_M=bm, BLOCK_N=bn,
                               BLOCK_K=bk, num_warps=warps, num_stages=stages)
    else:
        _swap_kernel[grid](x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0), BLOCK_M=bm, BLOCK_N=bn,
                           BLOCK_K=bk, num_warps=warps, num_stages=stages)
    return out


def time_us(fn, reps=20):
    if INTERP:
        fn()
        return 0.0
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    ts.sort()
    return ts[len(ts) // 2]


def variants():
    out = {"cublas": ("cublas", None), "ship": ("ship", None)}
    for bn, bk, w, s in itertools.product([64, 128, 256], [64, 128], [4, 8], [3, 4, 5]):
        if (bn == 256 and w == 4) or (bn == 64 and w == 8) or bn * bk * s * 2 + 64 * bk * s * 2 > 200 * 1024:
            continue
        out[f"sw_n{bn}k{bk}w{w}s{s}"] = ("swap", (bn, bk, w, s))
    for bn, bk, w, s in [(128, 128, 4, 4), (128, 64, 4, 5), (64, 128, 4, 5)]:
        out[f"tma_n{bn}k{bk}w{w}s{s}"] = ("tma", (bn, bk, w, s))
    if INTERP:
        out = {k: v for k, v in out.items() if k in ("cublas", "ship", "sw_n64k64w4s3", "tma_n64k128w4s5")}
    return out


def main():
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = []
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16 if not INTERP else torch.float32) * k ** -0.5
              for _ in range(COPIES)]
        x1 = torch.randn(1, k, device=DEV, dtype=ws[0].dtype)
        i = itertools.count()
        line1 = {"shape": name, "n": n, "k": k, "m": 1}
        if not INTERP:
            line1["ship"] = round(time_us(lambda: gemv(x1, ws[next(i) % COPIES], None, G._config(1, n, k))), 2)
            line1["ship_TBs"] = round(n * k * 2 / line1["ship"] / 1e6, 3)
            print(line1, flush=True)
        rows.append(line1)
        descs = {}
        for m in MS:
            x = torch.randn(m, k, device=DEV, dtype=ws[0].dtype)
            ref = (x.double() @ ws[0].double().t())
            line = {"shape": name, "n": n, "k": k, "m": m}
            for vname, (kind, spec) in variants().items():
                if kind == "cublas":
                    call = lambda w: torch.nn.functional.linear(x, w)  # noqa: E731
                elif kind == "ship":
                    call = lambda w: gemv(x, w, None, G._config(G._bucket(m), n, k))  # noqa: E731
                elif kind == "ab":
                    call = lambda w, c=spec: gemv(x, w, None, c)  # noqa: E731
                elif kind == "swap":
                    call = lambda w, s=spec: swap(x, w, *s)  # noqa: E731
                else:
                    bn, bk = spec[0], spec[1]
                    for c in range(COPIES):
                        descs.setdefault((c, bn, bk), TensorDescriptor.from_tensor(ws[c], [bn, bk]))
                    call = lambda w, s=spec: swap(x, w, *s, tma=True,  # noqa: E731
                                                  desc=descs[(next(iter([c for c in range(COPIES) if ws[c] is w])),
                                                              s[0], s[1])])
                try:
                    got = call(ws[0])
                    err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
                    if err > 2e-2:
                        raise RuntimeError(f"wrong result: rel err {err:.3g}")
                    j = itertools.count()
                    us = time_us(lambda: call(ws[next(j) % COPIES]))
                    line[vname] = round(us, 2)
                except Exception as e:  # noqa: BLE001
                    line[vname] = None
                    print(name, m, vname, "ERR", str(e).splitlines()[0][:160], flush=True)
            best = sorted((v, kk) for kk, v in line.items() if kk not in ("shape", "n", "k", "m") and v)
            line["best"] = best[:5]
            print(name, m, "cublas", line.get("cublas"), "ship", line.get("ship"), "best", best[:5], flush=True)
            rows.append(line)
            json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
