"""Exploration: cuBLAS default vs TunableOp-tuned vs cuBLASLt-preferred for the 8B's linear shapes."""
import json, sys, os
import torch
import torch.nn.functional as F
import torch.cuda.tunable as tunable

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096), "d_lm": (32000, 4096), "d_fc": (4096, 12288)}
MS = [int(m) for m in sys.argv[1].split(",")] if len(sys.argv) > 1 else [8, 16, 32, 64, 128, 256, 512]
dev = "cuda"
copies = 3
out = {}


def graph_time(fn, reps=10):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    return sorted(ts)[2]


tunable.set_filename("/tmp/tunableop_results.csv")
tunable.set_max_tuning_duration(20)
tunable.set_max_tuning_iterations(50)
for name, (n, k) in SHAPES.items():
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    for m in MS:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        floor_us = n * k * 2 / 3.0e12 * 1e6
        flop_us = 2 * m * n * k / 989e12 * 1e6
        state = {"i": 0}

        def fn():
            state["i"] = (state["i"] + 1) % copies
            return F.linear(x, ws[state["i"]])
        # rotate by capturing each copy in turn
        def fn_all():
            for w in ws:
                F.linear(x, w)
        tunable.enable(False)
        torch.backends.cuda.preferred_blas_library("cublas")
        t_def = graph_time(fn_all) / copies
        torch.backends.cuda.preferred_blas_library("cublaslt")
        t_lt = graph_time(fn_all) / copies
        torch.backends.cuda.preferred_blas_library("cublas")
        tunable.enable(True); tunable.tuning_enable(True)
        fn_all()
        torch.cuda.synchronize()
        tunable.tuning_enable(False)
        t_tun = graph_time(fn_all) / copies
        tunable.enable(False)
        row = dict(m=m, n=n, k=k, default_us=t_def, cublaslt_us=t_lt, tunableop_us=t_tun,
                   weight_floor_us=floor_us, flop_floor_us=flop_us)
        out[f"{name}/{m}"] = row
        print(f"{name:8s} M={m:4d}  default {t_def:7.1f}  lt {t_lt:7.1f}  tuned {t_tun:7.1f}  "
              f"floor {max(floor_us, flop_us):6.1f} us  best/default {min(t_lt, t_tun)/t_def:.3f}", flush=True)
    del ws
tunable.write_file()
json.dump(out, open(os.environ.get("OUTJ", "/tmp/gemm_explore.json"), "w"), indent=1)
