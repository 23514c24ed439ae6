"""Microbench: GEMMs of 128-512 tokens (chain verify at bs 32-128) against the 8B's weights, per
call, CUDA graph over rotating weight copies (> L2). cuBLAS against Triton TMA kernels: one tile
per program (tokens-major order, so the programs sharing a weight tile run together) and
persistent (one program per SM walking the tiles), plain [M, K] x [K, N] tiles and swap-AB
(W [BN, BK] x x^T). Writes JSON to argv[1]."""
import itertools
import json
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

INTERP = not torch.cuda.is_available()
DEV = "cpu" if INTERP else "cuda"
torch.manual_seed(0)
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096), "fc": (4096, 12288)}
MS = [256, 128, 512]
if INTERP:
    SHAPES, MS = {"tiny": (256, 128)}, [64]
COPIES = 1 if INTERP else 3
NUM_SMS = 5 if INTERP else torch.cuda.get_device_properties(0).multi_processor_count


@triton.jit
def _tile_kernel(x_desc, w_desc, o_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 SWAP: tl.constexpr):
    # programs sharing a weight tile (same n) are adjacent: m fastest
    pid = tl.program_id(0)
    m_tiles = tl.cdiv(M, BM)
    pm = pid % m_tiles
    pn = pid // m_tiles
    m0 = pm * BM
    n0 = pn * BN
    if SWAP:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = x_desc.load([m0, k0])
        w = w_desc.load([n0, k0])
        if SWAP:
            acc = tl.dot(w, x.T, acc)
        else:
            acc = tl.dot(x, w.T, acc)
    if SWAP:
        o_desc.store([m0, n0], acc.T.to(o_desc.dtype))
    else:
        o_desc.store([m0, n0], acc.to(o_desc.dtype))


@triton.jit
def _persistent_kernel(x_desc, w_desc, o_desc, M, N, K, NUM_PROGS: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, BK: tl.constexpr, FLATTEN: tl.constexpr):
    start = tl.program_id(0)
    m_tiles = tl.cdiv(M, BM)
    num_tiles = m_tiles * tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    tile = start - NUM_PROGS
    ki = -1
    m0 = 0
    n0 = 0
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    my_tiles = tl.cdiv(num_tiles - start, NUM_PROGS)
    for _ in tl.range(0, k_tiles * my_tiles, flatten=FLATTEN):
        ki = tl.where(ki == k_tiles - 1, 0, ki + 1)
        if ki == 0:
            tile += NUM_PROGS
            m0 = (tile % m_tiles) * BM
            n0 = (tile // m_tiles) * BN
        x = x_desc.load([m0, ki * BK])
        w = w_desc.load([n0, ki * BK])
        acc = tl.dot(x, w.T, acc)
        if ki == k_tiles - 1:
            o_desc.store([m0, n0], acc.to(o_desc.dtype))
            acc = tl.zeros([BM, BN], dtype=tl.float32)


def make_call(kind, cfg, x, w, out):
    bm, bn, bk, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
    o_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    if kind in ("tile", "swap"):
        return lambda: _tile_kernel[(tiles,)](x_desc, w_desc, o_desc, m, n, k, BM=bm, BN=bn, BK=bk,
                                              SWAP=kind == "swap", num_warps=warps, num_stages=stages)
    progs = min(NUM_SMS, tiles)
    flatten = kind == "pflat"
    return lambda: _persistent_kernel[(progs,)](x_desc, w_desc, o_desc, m, n, k, NUM_PROGS=progs, BM=bm, BN=bn,
                                                BK=bk, FLATTEN=flatten, num_warps=warps, num_stages=stages)


def time_us(fns, reps=18):
    """Median µs of one call; ``fns`` rotate over the weight copies."""
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


def variants(m):
    out = {"cublas": ("cublas", None)}
    tile_cfgs = [(64, 128, 64, 4, 5), (64, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
                 (128, 256, 64, 8, 3), (128, 64, 64, 4, 6), (256, 128, 64, 8, 3), (128, 128, 128, 8, 3),
                 (256, 64, 64, 8, 4), (64, 64, 128, 4, 5)]
    for c in tile_cfgs:
        if c[0] <= m:
            out["tile_" + "_".join(map(str, c))] = ("tile", c)
    swap_cfgs = [(128, 128, 64, 8, 4), (256, 128, 64, 8, 3), (64, 128, 64, 4, 5), (128, 64, 64, 4, 6),
                 (256, 64, 64, 8, 4), (128, 128, 64, 4, 4)]
    for c in swap_cfgs:  # (BM tokens, BN weight rows, ...): W's rows are the MMA's M side
        if c[0] <= m:
            out["swap_" + "_".join(map(str, c))] = ("swap", c)
    for c, kind in itertools.product([(128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (64, 128, 64, 4, 5),
                                      (128, 64, 64, 4, 6)], ["pers", "pflat"]):
        if c[0] <= m:
            out[kind + "_" + "_".join(map(str, c))] = (kind, c)
    if INTERP:
        out = {k: v for i, (k, v) in enumerate(out.items()) if i < 4 or k.startswith(("swap_64", "pers_64", "pflat_64"))}
        out = {k: (kind, (min(c[0], 32), min(c[1], 32), min(c[2], 32), c[3], c[4]) if c else c)
               for k, (kind, c) in out.items()}
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
            for vname, (kind, cfg) in variants(m).items():
                try:
                    if kind == "cublas":
                        fns = [lambda w=w, o=o: torch.matmul(x, w.t(), out=o) for w, o in zip(ws, outs)]
                    else:
                        fns = [make_call(kind, cfg, x, w, o) for w, o in zip(ws, outs)]
                    outs[0].zero_()
                    fns[0]()
                    err = ((outs[0].double() - ref).abs().max() / ref.abs().max()).item()
                    if err > 2e-2:
                        raise RuntimeError(f"wrong result: rel err {err:.3g}")
                    line[vname] = round(time_us(fns), 2)
                except Exception as e:  # noqa: BLE001
                    line[vname] = None
                    print(name, m, vname, "ERR", str(e).splitlines()[0][:200] if str(e) else type(e), flush=True)
            best = sorted((v, kk) for kk, v in line.items() if kk.split("_")[0] in ("cublas", "tile", "swap", "pers", "pflat") and v)
            line["best"] = best[:5]
            print(name, m, f"floor w {line['weight_us']:.1f} flop {line['flop_us_989']:.1f}", "cublas", line.get("cublas"),
                  "best", best[:5], flush=True)
            rows.append(line)
            json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
