"""Two ranks, one GPU each (NCCL): the one-shot all-reduce against NCCL's on the same random
messages, eagerly and replayed from a captured CUDA graph. Run by test_gpu_custom_all_reduce.py:

    python tests/e2e/custom_all_reduce_ranks.py --output result.json

Writes rank 0's record: which all-reduce the group chose, and per case (dtype, elements, eager or
graph) whether the sums equal NCCL's bit for bit and the largest difference. Two ranks sum a + b
once, in either order the same float, so "equal" is exact.
"""

from __future__ import annotations

import argparse
import json
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from specdec.models.all_reduce import ONE_SHOT_MAX_BYTES, choose_all_reduce

DTYPES = (torch.bfloat16, torch.float32)
# 1 element up to the threshold: odd sizes (staged), aligned sizes (the fused copy), decode-step sizes
SIZES = (1, 2, 3, 5, 8, 15, 16, 17, 31, 64, 127, 1000, 4095, 4096, 4097, 8192, 65535, 65536, 131071)


def _message(n: int, dtype: torch.dtype, rank: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(1000 * seed + rank)
    return (torch.randn(n, generator=gen, device="cuda") * 3).to(dtype)


def _case(got: torch.Tensor, want: torch.Tensor, **what) -> dict:
    diff = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
    return {**what, "equal": bool(torch.equal(got, want)), "max_abs_diff": diff}


def _eager_cases(reducer, rank: int) -> list[dict]:
    cases = []
    for dtype in DTYPES:
        limit = ONE_SHOT_MAX_BYTES // dtype.itemsize
        for n in SIZES + (limit - 1, limit, limit + 1):  # limit + 1: NCCL's, through the fallback
            x = _message(n, dtype, rank, n)
            want = x.clone()
            dist.all_reduce(want)
            cases.append(_case(reducer(x.clone()), want, dtype=str(dtype), numel=n, mode="eager"))
    return cases


def _graph_cases(reducer, rank: int) -> list[dict]:
    """Two dependent all-reduces in one graph (the buffer reused back to back), replayed on new data."""
    cases = []
    for dtype, n in [(torch.bfloat16, 4096), (torch.bfloat16, 16 * 4096), (torch.bfloat16, 17),
                     (torch.float32, 1000), (torch.bfloat16, ONE_SHOT_MAX_BYTES // 2)]:
        static = _message(n, dtype, rank, 0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture
            reducer(static.clone())
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            a = reducer(static.clone())
            b = reducer(a * 0.5 + static)
        for trial in range(3):
            static.copy_(_message(n, dtype, rank, 7 + trial))
            graph.replay()
            want_a = static.clone()
            dist.all_reduce(want_a)
            want_b = want_a * 0.5 + static
            dist.all_reduce(want_b)
            for name, got, want in (("first", a, want_a), ("second", b, want_b)):
                cases.append(_case(got, want, dtype=str(dtype), numel=n, mode=f"graph-{name}-{trial}"))
    return cases


def rank_main(rank: int, port: int, output: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    dist.all_reduce(torch.zeros(1, device="cuda"))  # the communicator, before any capture
    reducer = choose_all_reduce(None, f"cuda:{rank}", size=2, enabled=True, single_host=True, peers=[0, 1])
    record = {"reducer": reducer.name, "fused_copy": getattr(reducer, "fused", None), "torch": torch.__version__,
              "cases": _eager_cases(reducer, rank) + _graph_cases(reducer, rank)}
    torch.cuda.synchronize()
    if rank == 0:
        with open(output, "w") as f:
            json.dump(record, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(port, args.output), nprocs=2, join=True)


if __name__ == "__main__":
    main()
