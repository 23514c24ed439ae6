"""Microbench: QuACK's CuTe-DSL Hopper GEMMs (quack-kernels 0.6.5, travels with FA4's wheels) against
cuBLAS at the 8B's weights, 64-512 rows (the chain's verify at bs 16-128), one GEMM a call, CUDA graph
over rotating weight copies (> L2). Also gate_up with its SwiGLU in QuACK's epilogue
(gemm_gated_out) against cuBLAS + specdec's silu_and_mul. Writes JSON to argv[1].

Needs PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages (scripts/gpu_fa4.sh install)."""
import json
import sys
import time

import torch

import quack.gemm_interface as qg
from specdec.models.ops import silu_and_mul

torch.manual_seed(0)
DEV = "cuda"
SHAPES = {"gate_up": (28672, 4096), "down": (4096, 14336), "qkv": (6144, 4096), "o": (4096, 4096),
          "lm_head": (128256, 4096), "fc": (4096, 12288)}
MS = [int(m) for m in sys.argv[2].split(",")] if len(sys.argv) > 2 else [256, 192, 128, 64, 512]
COPIES = 3


def time_us(fns, reps=18):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
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


def check(out, ref, what):
    err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
    if err > 2e-2:
        raise RuntimeError(f"{what}: wrong result, rel err {err:.3g}")


def main():
    rows = []
    weights = {name: [torch.randn(n, k, device=DEV, dtype=torch.bfloat16) * k ** -0.5 for _ in range(COPIES)]
               for name, (n, k) in SHAPES.items()}
    for m in MS:
        for name, (n, k) in SHAPES.items():
            ws = weights[name]
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
            outs = [torch.empty(m, n, device=DEV, dtype=torch.bfloat16) for _ in range(COPIES)]
            ref = x.double() @ ws[0].double().t()
            line = {"shape": name, "n": n, "k": k, "m": m, "weight_us": n * k * 2 / 3.0e6,
                    "flop_us_989": 2 * m * n * k / 989e6}
            variants = {
                "cublas": lambda w, o: torch.matmul(x, w.t(), out=o),
                "quack_tuned": lambda w, o: qg.gemm(x, w.t(), out=o, tuned=True),
                "quack_default": lambda w, o: qg.gemm(x, w.t(), out=o, tuned=False),
                "quack_dynamic": lambda w, o: qg.gemm(x, w.t(), out=o, tuned=True, dynamic_scheduler=True),
            }
            for vname, fn in variants.items():
                try:
                    t0 = time.time()
                    outs[0].zero_()
                    fn(ws[0], outs[0])  # compiles / autotunes, outside the graph
                    torch.cuda.synchronize()
                    check(outs[0], ref, vname)
                    line[vname] = round(time_us([lambda w=w, o=o: fn(w, o) for w, o in zip(ws, outs)]), 2)
                    line[vname + "_first_call_s"] = round(time.time() - t0, 1)
                except Exception as e:  # noqa: BLE001
                    line[vname] = None
                    print(name, m, vname, "ERR", (str(e).splitlines() or [type(e).__name__])[0][:300], flush=True)
            if name == "gate_up":
                inter = n // 2
                ref_act = torch.nn.functional.silu(ref[:, :inter]) * ref[:, inter:]
                acts = [torch.empty(m, inter, device=DEV, dtype=torch.bfloat16) for _ in range(COPIES)]

                def cublas_silu(w, o, a):
                    torch.matmul(x, w.t(), out=o)
                    a.copy_(silu_and_mul(o))

                gated = {
                    "cublas+silu_and_mul": cublas_silu,
                    "quack_gated_concat": lambda w, o, a: qg.gemm_gated_out(x, w.t(), None, a, activation="swiglu",
                                                                            concat_layout="B"),
                }
                for vname, fn in gated.items():
                    try:
                        fn(ws[0], outs[0], acts[0])
                        torch.cuda.synchronize()
                        check(acts[0], ref_act, vname)
                        line[vname] = round(time_us([lambda w=w, o=o, a=a: fn(w, o, a)
                                                     for w, o, a in zip(ws, outs, acts)]), 2)
                    except Exception as e:  # noqa: BLE001
                        line[vname] = None
                        print(name, m, vname, "ERR", (str(e).splitlines() or [type(e).__name__])[0][:300], flush=True)
            timed = {kk: v for kk, v in line.items() if isinstance(v, float) and not kk.endswith(("_us", "_us_989", "_s"))}
            print(name, m, f"floor w {line['weight_us']:.1f} flop {line['flop_us_989']:.1f}", timed, flush=True)
            rows.append(line)
            json.dump(rows, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
