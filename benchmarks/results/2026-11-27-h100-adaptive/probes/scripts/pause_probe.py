"""Probe: does the device's host pause 10-40 ms at random without our engine? (1) a CUDA graph of ~8 ms
GPU work replayed and waited for, 2000 times; (2) ~8 ms of pure-Python work, 2000 times; (3) the same
with a second thread of Python work (the GIL contended). Per loop: p50, max, steps past twice the median."""
import json, os, threading, time
import numpy as np
import torch


def spread(ms):
    ms = np.asarray(ms)
    med = float(np.median(ms))
    over = ms[ms > 2 * med] - med
    return {"p50": med, "p99": float(np.quantile(ms, 0.99)), "max": float(ms.max()), "slow": int(over.size),
            "slow_excess_ms": float(over.sum()), "n": int(ms.size)}


def timed(fn, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return spread(out)


a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    b = a @ a  # cuBLAS's workspace before the capture
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for _ in range(60):
        b = a @ a
torch.cuda.synchronize()
t = time.perf_counter(); g.replay(); torch.cuda.synchronize(); print("graph ms", (time.perf_counter() - t) * 1e3)


def gpu_step():
    g.replay()
    torch.cuda.synchronize()


def cpu_step():
    x = 0
    for i in range(60000):
        x += i * i
    return x


res = {"gpu": timed(gpu_step, 2000), "cpu": timed(cpu_step, 2000)}
print(res, flush=True)
stop = False


def noise():
    while not stop:
        cpu_step()


th = threading.Thread(target=noise, daemon=True)
th.start()
res["gpu_with_thread"] = timed(gpu_step, 1000)
stop = True
th.join()
res["nproc"] = os.cpu_count()
res["loadavg"] = os.getloadavg()
print(res, flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "pause_probe.json"), "w"), indent=1)
