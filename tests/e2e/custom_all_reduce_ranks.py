"""N ranks, one GPU each (NCCL): the one-shot all-reduce (``--kernel`` torch's or our push kernel)
against NCCL's on the same random messages, eagerly and replayed from a captured CUDA graph. Run by
test_gpu_custom_all_reduce.py:

    python tests/e2e/custom_all_reduce_ranks.py --world-size 2 --kernel push --output result.json

Writes rank 0's record: which all-reduce the group chose, and per case (dtype, elements, eager or
graph; the push kernel's fused all-reduce + add_rms_norm too, against NCCL's sum then ``add_rms_norm``)
whether the sums equal NCCL's bit for bit, whether every rank holds the same bits, and the
largest difference from the exact sum (fp64) against a bound of rounding. Two ranks sum a + b once,
in either order the same float, so "equal" is exact there; more ranks round in another order than
NCCL's ring, so there the sum must be within ``ranks`` roundings of the exact one.
"""

from __future__ import annotations

import argparse
import json
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from specdec.models.all_reduce import choose_all_reduce
from specdec.models.ops import add_rms_norm

DTYPES = (torch.bfloat16, torch.float32)
# 1 element up to the threshold: odd sizes (staged), aligned sizes (the fused copy), decode-step sizes
SIZES = (1, 2, 3, 5, 8, 15, 16, 17, 31, 64, 127, 1000, 4095, 4096, 4097, 8192, 65535, 65536, 131071)


def _message(n: int, dtype: torch.dtype, rank: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(1000 * seed + rank)
    return (torch.randn(n, generator=gen, device="cuda") * 3).to(dtype)


def _same_on_every_rank(x: torch.Tensor) -> bool:
    gathered = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, x.contiguous())
    return all(torch.equal(g, gathered[0]) for g in gathered)


def _case(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor, magnitude: torch.Tensor, **what) -> dict:
    """``exact``: the sum in fp64; ``magnitude``: the sum of |message| over ranks (fp64), which bounds
    each partial sum, so ranks - 1 additions round off at most (ranks - 1) x eps x magnitude, plus the
    final rounding to the dtype."""
    eps = torch.finfo(got.dtype).eps
    error = (got.double() - exact).abs()
    bound = dist.get_world_size() * eps * magnitude + 1e-30
    return {**what, "equal": bool(torch.equal(got, want)), "same_on_every_rank": _same_on_every_rank(got),
            "max_abs_diff": float((got.float() - want.float()).abs().max()) if got.numel() else 0.0,
            "within_rounding": bool((error <= bound).all()),
            "max_error_over_bound": float((error / bound).max()) if got.numel() else 0.0}


def _exact(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum over ranks in fp64, and the sum of magnitudes."""
    exact, magnitude = x.double(), x.double().abs()
    dist.all_reduce(exact)
    dist.all_reduce(magnitude)
    return exact, magnitude


def _eager_cases(reducer, rank: int) -> list[dict]:
    cases = []
    for dtype in DTYPES:
        limit = reducer.max_bytes // dtype.itemsize
        for n in SIZES + (limit - 1, limit, limit + 1):  # limit + 1: NCCL's, through the fallback
            x = _message(n, dtype, rank, n)
            want = x.clone()
            dist.all_reduce(want)
            cases.append(_case(reducer(x.clone()), want, *_exact(x), dtype=str(dtype), numel=n, mode="eager"))
    return cases


def _graph_cases(reducer, rank: int) -> list[dict]:
    """Two dependent all-reduces in one graph (the buffer reused back to back), replayed on new data."""
    cases = []
    for dtype, n in [(torch.bfloat16, 4096), (torch.bfloat16, 16 * 4096), (torch.bfloat16, 17),
                     (torch.float32, 1000), (torch.bfloat16, reducer.max_bytes // 2)]:
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
            want_b = a * 0.5 + static  # NOTE: from the graph's own first sum, so each case checks one all-reduce
            exact_b = _exact(want_b)
            dist.all_reduce(want_b)
            for name, got, want, exact in (("first", a, want_a, _exact(static)), ("second", b, want_b, exact_b)):
                cases.append(_case(got, want, *exact, dtype=str(dtype), numel=n, mode=f"graph-{name}-{trial}"))
    return cases


def _fused_case(reducer, got: tuple, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, **what) -> dict:
    """The fused call's (normed, stream) against NCCL's sum of ``x`` then ``add_rms_norm``: ``equal``
    bit for bit (two ranks: one sum a + b); ``equal_unfused``: against the push kernel's own sum then
    ``add_rms_norm`` (the same arithmetic, any number of ranks); ``within_rounding``: the stream against
    the exact sum plus the residual (fp64), within the sum's bound (``_case``) and the add's rounding."""
    total = x.clone()
    dist.all_reduce(total)
    want = add_rms_norm(total, residual, weight, 1e-5)
    unfused = add_rms_norm(reducer(x.clone()), residual, weight, 1e-5)
    exact, magnitude = _exact(x)
    eps = torch.finfo(x.dtype).eps
    error = (got[1].double() - (exact + residual.double())).abs()
    bound = dist.get_world_size() * eps * magnitude + eps * (magnitude + residual.double().abs()) + 1e-30
    return {**what, "equal": all(torch.equal(g, w) for g, w in zip(got, want)),
            "equal_unfused": all(torch.equal(g, w) for g, w in zip(got, unfused)),
            "same_on_every_rank": all(_same_on_every_rank(g) for g in got),
            "within_rounding": bool((error <= bound).all()), "max_error_over_bound": float((error / bound).max()),
            "max_abs_diff": max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want))}


def _fused_cases(reducer, rank: int) -> list[dict]:
    """``PushAllReduce.add_rms_norm``: decode and verify shapes (rows x hidden) eagerly, then two fused
    calls around a plain all-reduce in one graph, replayed on new data."""
    cases = []
    sms = torch.cuda.get_device_properties(rank).multi_processor_count  # the most rows it fuses
    for dtype, rows, cols in [(torch.bfloat16, 1, 4096), (torch.bfloat16, 16, 4096), (torch.bfloat16, sms, 4096),
                              (torch.bfloat16, 3, 576), (torch.bfloat16, sms - 1, 576), (torch.bfloat16, 2, 8192),
                              (torch.float32, 7, 1000)]:
        x = _message(rows * cols, dtype, rank, rows).view(rows, cols)
        residual = _message(rows * cols, dtype, 0, 99).view(rows, cols)  # the same on every rank
        weight = _message(cols, dtype, 0, 98)
        got = reducer.add_rms_norm(x, residual, weight, 1e-5)
        assert got is not None, (dtype, rows, cols)
        cases.append(_fused_case(reducer, got, x, residual, weight, dtype=str(dtype), numel=rows * cols,
                                 mode="fused-eager"))
    too_many = torch.zeros(sms + 1, 4096, dtype=torch.bfloat16, device="cuda")  # a program a row, all resident
    assert reducer.add_rms_norm(too_many, too_many, too_many[0], 1e-5) is None
    rows, cols, dtype = 64, 4096, torch.bfloat16
    static = _message(rows * cols, dtype, rank, 0).view(rows, cols)
    residual, weight = _message(rows * cols, dtype, 0, 97).view(rows, cols), _message(cols, dtype, 0, 96)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        reducer.add_rms_norm(static, residual, weight, 1e-5)
        reducer(static.clone())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        first = reducer.add_rms_norm(static, residual, weight, 1e-5)
        between = reducer(first[0] * 0.5)
        second = reducer.add_rms_norm(between * 0.25 + static, first[1], weight, 1e-5)
    for trial in range(3):
        static.copy_(_message(rows * cols, dtype, rank, 7 + trial).view(rows, cols))
        graph.replay()
        what = dict(dtype=str(dtype), numel=rows * cols)
        cases.append(_fused_case(reducer, first, static, residual, weight, mode=f"fused-graph-first-{trial}", **what))
        cases.append(_fused_case(reducer, second, between * 0.25 + static, first[1], weight,
                                 mode=f"fused-graph-second-{trial}", **what))
    return cases


def rank_main(rank: int, port: int, world_size: int, output: str, kernel: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    dist.all_reduce(torch.zeros(1, device="cuda"))  # the communicator, before any capture
    reducer = choose_all_reduce(None, f"cuda:{rank}", size=world_size, enabled=True, single_host=True,
                                peers=list(range(world_size)), kernel=kernel)
    record = {"world_size": world_size, "reducer": reducer.name, "fused_copy": getattr(reducer, "fused", None),
              "torch": torch.__version__, "cases": _eager_cases(reducer, rank) + _graph_cases(reducer, rank)}
    if kernel == "push":
        record["cases"] += _fused_cases(reducer, rank)
    torch.cuda.synchronize()
    if rank == 0:
        with open(output, "w") as f:
            json.dump(record, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--kernel", default="torch", choices=["torch", "push"])
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(port, args.world_size, args.output, args.kernel), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
