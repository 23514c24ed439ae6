"""Microbench: GEMMs of 192-256 tokens (chain verify at bs 48-64) against the 8B's weights, per call,
CUDA graph over rotating weight copies (> L2). cuBLAS, cuBLASLt, torch._grouped_mm (CUTLASS sm90,
one group) and Triton split-K (fp32 partials + a reduce kernel, both timed). Writes JSON to argv[1]."""
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

INTERP = not torch.cuda.is_available()
DEV = "cpu" if INTERP else "cuda"
torch.manual_seed(0)
SHAPES = {"down": (4096, 14336), "o": (4096, 4096), "qkv": (6144, 4096), "fc": (4096, 12288),
          "gate_up": (28672, 4096), "lm_head": (128256, 4096)}
MS = [256, 192]
if INTERP:
    SHAPES, MS = {"tiny": (128, 256)}, [64]
COPIES = 1 if INTERP else 3


@triton.jit
def _splitk_kernel(x_desc, w_desc, p_ptr, M, N, K, K_PER: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr):
    # grid (m_tiles * n_tiles, split): programs sharing a weight tile adjacent (m fastest)
    pid = tl.program_id(0)
    s = tl.program_id(1)
    m_tiles = tl.cdiv(M, BM)
    m0 = (pid % m_tiles) * BM
    n0 = (pid // m_tiles) * BN
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(s * K_PER, s * K_PER + K_PER, BK):
        x = x_desc.load([m0, k0])
        w = w_desc.load([n0, k0])
        acc = tl.dot(x, w.T, acc)
    rm = m0 + tl.arange(0, BM)
    rn = n0 + tl.arange(0, BN)
    ptrs = p_ptr + s * M * N + rm[:, None] * N + rn[None, :]
    tl.store(ptrs, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _reduce_kernel(p_ptr, o_ptr, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(p_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(o_ptr + offs, acc.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _splitk_atomic_kernel(x_desc, w_desc, p_ptr, M, N, K, K_PER: tl.constexpr, BM: tl.constexpr,
                          BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    s = tl.program_id(1)
    m_tiles = tl.cdiv(M, BM)
    m0 = (pid % m_tiles) * BM
    n0 = (pid // m_tiles) * BN
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(s * K_PER, s * K_PER + K_PER, BK):
        x = x_desc.load([m0, k0])
        w = w_desc.load([n0, k0])
        acc = tl.dot(x, w.T, acc)
    rm = m0 + tl.arange(0, BM)
    rn = n0 + tl.arange(0, BN)
    tl.atomic_add(p_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N), sem="relaxed")


def splitk_call(cfg, x, w, out, atomic=False):
    bm, bn, bk, warps, stages, split = cfg
    m, k = x.shape
    n = w.shape[0]
    assert k % (split * bk) == 0
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    block = 1024
    if atomic:
        part = torch.empty(m, n, device=x.device, dtype=torch.float32)

        def run():
            part.zero_()
            _splitk_atomic_kernel[(tiles, split)](x_desc, w_desc, part, m, n, k, K_PER=k // split, BM=bm, BN=bn,
                                                  BK=bk, num_warps=warps, num_stages=stages)
            out.copy_(part)
        return run
    part = torch.empty(split, m, n, device=x.device, dtype=torch.float32)

    def run():
        _splitk_kernel[(tiles, split)](x_desc, w_desc, part, m, n, k, K_PER=k // split, BM=bm, BN=bn, BK=bk,
                                       num_warps=warps, num_stages=stages)
        _reduce_kernel[(triton.cdiv(m * n, block),)](part, out, m * n, SPLIT=split, BLOCK=block, num_warps=4)
    return run


def time_us(fns, reps=18):
    if INTERP:
        fns[0]()
        return 0.0
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fns[i % len(fns)]()
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


def variants(n, k):
    out = {"cublas": ("cublas", None), "cublaslt": ("cublaslt", None), "grouped_mm": ("grouped", None)}
    tiles = [(128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (128, 64, 64, 4, 6), (64, 128, 64, 4, 5),
             (128, 256, 64, 8, 3), (256, 128, 64, 8, 3)]
    splits = [2, 3, 4] if n <= 8192 else [2]
    for t in tiles:
        for s in splits:
            if k % (s * t[2]) == 0:
                out["splitk_" + "_".join(map(str, t + (s,)))] = ("splitk", t + (s,))
    for t in [(128, 128, 64, 8, 4), (128, 64, 64, 4, 6)]:
        if n <= 8192 and k % (2 * t[2]) == 0:
            out["atomic_" + "_".join(map(str, t + (2,)))] = ("atomic", t + (2,))
    if INTERP:
        out = {kk: (kind, (32, 32, 32) + c[3:] if c else c) for kk, (kind, c) in out.items()
               if kind in ("cublas", "splitk", "atomic")}
        out = dict(list(out.items())[:4])
    return out


def main():
    dtype = torch.bfloat16 if not INTERP else torch.float32
    rows = []
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device=DEV, dtype=dtype) * k ** -0.5 for _ in range(COPIES)]
        for m in MS:
            x = torch.randn(m, k, device=DEV, dtype=dtype)
            outs = [torch.empty(m, n, device=DEV, dtype=dtype) for _ in range(COPIES)]
            ref = x.double() @ ws[0].double().t()
            line = {"shape": name, "n": n, "k": k, "m": m,
                    "weight_us": n * k * 2 / 3.0e6, "flop_us_989": 2 * m * n * k / 989e6}
            for vname, (kind, cfg) in variants(n, k).items():
                try:
                    if kind == "cublas":
                        fns = [lambda w=w, o=o: torch.matmul(x, w.t(), out=o) for w, o in zip(ws, outs)]
                    elif kind == "cublaslt":
                        def lt(w, o):
                            torch.backends.cuda.preferred_blas_library("cublaslt")
                            try:
                                torch.matmul(x, w.t(), out=o)
                            finally:
                                torch.backends.cuda.preferred_blas_library("cublas")
                        fns = [lambda w=w, o=o: lt(w, o) for w, o in zip(ws, outs)]
                    elif kind == "grouped":
                        x3 = x.unsqueeze(0)
                        fns = [lambda w=w, o=o: o.copy_(torch._grouped_mm(x3, w.t().unsqueeze(0))[0])
                               for w, o in zip(ws, outs)]
                        fns_nocopy = [lambda w=w: torch._grouped_mm(x3, w.t().unsqueeze(0)) for w in ws]
                    else:
                        fns = [splitk_call(cfg, x, w, o, atomic=kind == "atomic") for w, o in zip(ws, outs)]
                    outs[0].zero_()
                    fns[0]()
                    err = ((outs[0].double() - ref).abs().max() / ref.abs().max()).item()
                    if err > 2e-2:
                        raise RuntimeError(f"wrong result: rel err {err:.3g}")
                    line[vname] = round(time_us(fns), 2)
                    if kind == "grouped":
                        line["grouped_mm_nocopy"] = round(time_us(fns_nocopy), 2)
                except Exception as e:  # noqa: BLE001
                    line[vname] = None
                    print(name, m, vname, "ERR", str(e).splitlines()[0][:200] if str(e) else type(e), flush=True)
            best = sorted((v, kk) for kk, v in line.items() if kk.split("_")[0] in
                          ("cublas", "cublaslt", "grouped", "splitk", "atomic") and v)
            line["best"] = best[:6]
            print(name, m, f"floor w {line['weight_us']:.1f} flop {line['flop_us_989']:.1f}", "cublas", line.get("cublas"),
                  "best", best[:6], flush=True)
            rows.append(line)
            json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
