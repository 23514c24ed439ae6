"""Probe: verify-sized bf16 GEMMs (M = bs x draft tokens) of the 8B target, cuBLAS vs cuBLASLt, us and
fraction of the roofline floor max(weight bytes / bw, flops / 989e12)."""
import json, os, sys
import torch
import torch.nn.functional as F

BW = 3.35e12 * 0.9  # practical copy bw ~ 3.0 TB/s
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "head_fc": (4096, 12288)}
dev = "cuda"
out = {}
for lib in ["cublas", "cublaslt"]:
    torch.backends.cuda.preferred_blas_library(lib)
    for name, (n, k) in SHAPES.items():
        copies = max(2, int(200e6 // (n * k * 2)) + 1)
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for m in [64, 128, 192, 256, 320, 384, 512]:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            for w in ws:
                torch.mm(x, w.t(), out=y)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            reps = 4
            with torch.cuda.graph(g):
                for _ in range(reps):
                    for w in ws:
                        torch.mm(x, w.t(), out=y)
            g.replay(); torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            best = 1e9
            for _ in range(5):
                s.record(); g.replay(); e.record(); e.synchronize()
                best = min(best, s.elapsed_time(e) * 1e3 / (reps * copies))
            floor = max(n * k * 2 / BW, 2 * m * n * k / 989e12) * 1e6
            out[f"{lib} {name} M={m}"] = {"us": best, "floor_us": floor}
            print(f"{lib:9s} {name:8s} M={m:4d} {best:8.1f} us  floor {floor:6.1f}  ratio {best / floor:5.2f}", flush=True)
        del ws
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "gemm_probe.json"), "w"), indent=1)
