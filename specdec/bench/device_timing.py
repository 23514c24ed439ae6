"""GPU timing for the benchmarks: event-timed medians, CUDA-graph replays, and the copy-bandwidth floor.

One place for what every microbenchmark (``benchmarks/bench_*.py``) and the synthetic sweep measure
with, so that their figures are comparable:
- ``event_us``: the median over ``reps`` calls of ``fn``, each between two CUDA events (host launch
  overhead included when ``fn`` is eager);
- ``graph_us``: ``fn`` captured ``calls`` times back to back in one CUDA graph and replayed; the
  median replay divided by ``calls`` (the GPU time without host launches, the graph launch's own
  latency spread over ``calls``);
- ``copy_bandwidth``: bytes read + written per second by a large device-to-device copy, the
  practical memory-bandwidth floor the results divide by.
"""

from __future__ import annotations

import statistics

import torch


def event_us(fn, *, reps: int, warmup: int = 3) -> float:
    """Median microseconds of one call of ``fn`` on the current CUDA stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def graph_us(fn, *, reps: int, calls: int = 1, warmup: int = 3) -> float:
    """Microseconds per call of ``fn`` replayed from a CUDA graph of ``calls`` back-to-back calls
    (RuntimeError if ``fn`` cannot be captured). ``fn`` first runs ``warmup`` times on a side stream
    (Triton compilation, cuBLAS workspaces), outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return event_us(graph.replay, reps=reps) / calls


def copy_bandwidth(device: str = "cuda", *, num_bytes: int = 1 << 30, reps: int = 10) -> float:
    """Bytes per second read + written by a ``num_bytes`` device-to-device copy (median of ``reps``);
    NaN off CUDA."""
    if not str(device).startswith("cuda"):
        return float("nan")
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    with torch.cuda.device(src.device):
        us = event_us(lambda: dst.copy_(src), reps=reps)
    return 2 * num_bytes / (us * 1e-6)
