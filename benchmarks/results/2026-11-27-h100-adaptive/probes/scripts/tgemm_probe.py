"""Probe: a Triton bf16 GEMM y = x @ W^T for verify-sized M (128-512) against cuBLAS, 8B shapes."""
import itertools, json, os, time
import torch
import triton
import triton.language as tl


@triton.jit
def mm_kernel(A, B, C, M, N, K, sam, sbn, scm, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              GROUP_N: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    # m fastest: the programs sharing a weight tile run together (one HBM read, L2 for the rest)
    pid_m = pid % num_m
    pid_n = pid // num_m
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    a_ptrs = A + offs_m[:, None].to(tl.int64) * sam + offs_k[None, :]
    b_ptrs = B + offs_n[None, :].to(tl.int64) * sbn + offs_k[:, None]
    m_ok = offs_m[:, None] < M
    acc = tl.zeros([BM, BN], tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptrs, mask=m_ok, other=0.0)
        b = tl.load(b_ptrs)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += BK
    c_ptrs = C + offs_m[:, None].to(tl.int64) * scm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(tl.bfloat16), mask=m_ok)


@triton.jit
def mm_tma_kernel(A, B, C, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m = pid % num_m
    pid_n = pid // num_m
    a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(B, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    c_desc = tl.make_tensor_descriptor(C, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    acc = tl.zeros([BM, BN], tl.float32)
    for k in tl.range(0, K, BK, num_stages=STAGES):
        a = a_desc.load([pid_m * BM, k])
        b = b_desc.load([pid_n * BN, k])
        acc = tl.dot(a, b.T, acc)
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))


def alloc(size, alignment, stream):
    return torch.empty(size, device="cuda", dtype=torch.int8)


triton.set_allocator(alloc)


def run_ptr(x, w, y, cfg):
    bm, bn, bk, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    mm_kernel[grid](x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0), BM=bm, BN=bn, BK=bk, GROUP_N=1,
                    num_warps=warps, num_stages=stages)


def run_tma(x, w, y, cfg):
    bm, bn, bk, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    mm_tma_kernel[grid](x, w, y, m, n, k, BM=bm, BN=bn, BK=bk, STAGES=stages, num_warps=warps)


def timeit(fn, ws, reps=4):
    for w in ws:
        fn(w)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for w in ws:
                fn(w)
    g.replay(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 1e9
    for _ in range(5):
        s.record(); g.replay(); e.record(); e.synchronize()
        best = min(best, s.elapsed_time(e) * 1e3 / (reps * len(ws)))
    return best


SHAPES = {"gate_up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096), "o": (4096, 4096)}
CONFIGS = [(128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 128, 8, 3),
           (64, 128, 64, 4, 4), (128, 64, 128, 4, 4), (256, 64, 64, 8, 4), (64, 256, 64, 8, 4)]
out = {}
t_start = time.time()
for name, (n, k) in SHAPES.items():
    copies = max(2, int(200e6 // (n * k * 2)) + 1)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    for m in [128, 192, 256, 320, 384]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = x @ ws[0].t()
        res = {"cublas": timeit(lambda w: torch.mm(x, w.t(), out=y), ws)}
        for kind, runner in (("ptr", run_ptr), ("tma", run_tma)):
            for cfg in CONFIGS:
                try:
                    runner(x, ws[0], y, cfg)
                    err = (y.float() - ref.float()).abs().max().item()
                    if err > 0.05:
                        res[f"{kind}{cfg}"] = f"err {err}"
                        continue
                    res[f"{kind}{cfg}"] = timeit(lambda w: runner(x, w, y, cfg), ws)
                except Exception as ex:  # noqa
                    res[f"{kind}{cfg}"] = f"fail {type(ex).__name__}: {str(ex)[:80]}"
        times = {kk: v for kk, v in res.items() if isinstance(v, float)}
        best = min((v, kk) for kk, v in times.items() if kk != "cublas")
        print(f"{name:8s} M={m:4d} cublas {res['cublas']:7.1f}  best triton {best[0]:7.1f} {best[1]}", flush=True)
        out[f"{name} M={m}"] = res
    del ws
print("elapsed", time.time() - t_start)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "tgemm_probe.json"), "w"), indent=1)
