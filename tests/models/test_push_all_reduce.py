"""The push all-reduce (``specdec.models.all_reduce.PushAllReduce``, kernels in
``specdec.models.ops.all_reduce_kernels``) on CPU: two and three ranks as processes running Triton's
interpreter over shared-memory buffers, a sequence of messages of changing sizes (so each program's
epoch and parity move on unevenly), against the sum over ranks in rank order; and its fused
all-reduce + add_rms_norm, mixed with plain all-reduces, against the two run one after the other;
with three ranks, two-shot calls mixed with one-shot ones, and the two modes' bits compared. On
GPUs: tests/e2e/test_gpu_custom_all_reduce.py."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from ..triton_env import import_kernels, rand

kernels = import_kernels("specdec.models.ops.all_reduce_kernels")
norm_kernels = import_kernels("specdec.models.ops.triton_kernels")

from . import push_all_reduce_ranks as ranks  # noqa: E402

pytestmark = [pytest.mark.usefixtures("triton_interpreter"),
              pytest.mark.skipif(not kernels.INTERPRETED, reason="triton was imported compiled (GPU test instead)")]

MAX_BYTES = 4 * 5000  # 5,000 fp32 elements: three programs of 2,048


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_the_sum_in_rank_order(world):
    """Messages of 1 element to the limit, in an order where programs 0-2 make different numbers of
    calls (their epochs part) and two calls of one size follow each other (both parities); fp32, so
    the kernel's fp32 sum in rank order is exactly the reference's."""
    sizes = [1, 100, 4097, 5000, 3, 2048, 2049, 4096, 4096, 7, 5000]
    data, flags = ranks.shared_buffers(world, MAX_BYTES, torch.float32)
    messages = [[rand(n, seed=100 * r + i).share_memory_() for i, n in enumerate(sizes)] for r in range(world)]
    results = [[torch.full((n,), float("nan")).share_memory_() for n in sizes] for _ in range(world)]
    mp.spawn(ranks.rank_main, args=(world, MAX_BYTES, data, flags, messages, results), nprocs=world, join=True)
    for i, n in enumerate(sizes):
        want = messages[0][i].clone()
        for r in range(1, world):
            want += messages[r][i]
        for r in range(world):
            assert torch.equal(results[r][i], want), (world, n, r)
    calls = [sum(1 for n in sizes if n > p * kernels.BLOCK) for p in range(3)]  # each program's calls
    for r in range(world):
        got = flags[r].view(-1, world)[:3]  # [program, source rank]: the epoch each peer last signalled
        for s in range(world):
            assert got[:, s].tolist() == ([0, 0, 0] if s == r else calls), (r, s)


@pytest.mark.parametrize("world", [2, 3])
def test_fused_norm_equals_the_all_reduce_then_add_rms_norm(world):
    """Fused calls of 1-5 rows (the most this buffer's flags allow) and of widths that change from call
    to call (each row keeps its part of the slots: 992 elements here, 5,000 / 5 rounded down to a
    multiple of 16), between plain all-reduces (the two channels keep their own epochs): normed rows
    and stream equal the plain all-reduce's sum in rank order followed by ``add_rms_norm``'s kernel,
    bit for bit."""
    shapes = [("norm", 1, 40), ("sum", 4097), ("norm", 5, 992), ("norm", 3, 7), ("sum", 2048), ("norm", 5, 991),
              ("norm", 2, 640), ("norm", 4, 992)]
    data, flags = ranks.shared_buffers(world, MAX_BYTES, torch.float32)
    calls, results = _calls(world, shapes, torch.float32)
    mp.spawn(ranks.rank_main_mixed, args=(world, MAX_BYTES, data, flags, None, calls, results), nprocs=world,
             join=True)
    _check_sums_and_norms(calls, results, shapes)


def test_two_shot_calls_mixed_with_one_shot_calls():
    """Three ranks, messages on both sides of ``two_shot_min_bytes`` (2,048 bytes: 512 fp32 elements)
    one after the other on the same channels, so a program's calls change mode (two-shot, one-shot,
    two-shot twice in a row for both parities): plain sums of 3 to 5,000 elements, fused calls of one
    row (rank 0 owns it alone), of five (owners 0, 1, 2, 0, 1) and narrow one-shot ones. Every rank
    holds the sum in rank order, and the fused calls that sum followed by ``add_rms_norm``, bit for bit."""
    world, min_bytes = 3, 2048
    shapes = [("sum", 5000), ("sum", 100), ("norm", 5, 992), ("sum", 4097), ("sum", 4097), ("norm", 3, 7),
              ("norm", 1, 640), ("sum", 3), ("norm", 2, 992), ("norm", 2, 992), ("sum", 5000), ("norm", 4, 100)]
    data, flags = ranks.shared_buffers(world, MAX_BYTES, torch.float32)
    calls, results = _calls(world, shapes, torch.float32)
    mp.spawn(ranks.rank_main_mixed, args=(world, MAX_BYTES, data, flags, None, calls, results, min_bytes),
             nprocs=world, join=True)
    _check_sums_and_norms(calls, results, shapes)


def test_two_shot_gives_the_one_shot_bits():
    """Three ranks, bf16: the same calls all two-shot and all one-shot (each mode on buffers of its
    own) give the same bits on every rank, plain and fused (so the choice of mode is one of speed
    alone), the plain sum the fp32 sum in rank order rounded once to bf16; and the two-shot calls'
    flags show that every program passed through its owner only."""
    world = 3
    shapes = [("sum", 10000), ("norm", 4, 1000), ("sum", 3001), ("norm", 5, 2000)]
    modes = {"two-shot": 0, "one-shot": MAX_BYTES + 1}
    groups = [(*ranks.shared_buffers(world, MAX_BYTES, torch.bfloat16), min_bytes) for min_bytes in modes.values()]
    calls, _ = _calls(world, shapes, torch.bfloat16)
    results = [_calls(world, shapes, torch.bfloat16)[1] for _ in modes]
    mp.spawn(ranks.rank_main_modes, args=(world, MAX_BYTES, groups, calls, results), nprocs=world, join=True)
    two_shot, one_shot = results
    flags = groups[0][1]  # the two-shot buffers' flags: program p's pass through its owner, rank p % 3
    calls_made = [2, 2, 1, 1, 1]  # each program's plain calls: 10,000 and 3,001 elements
    for r in range(world):
        got = flags[r].view(-1, world)[:5]  # [program, source rank], the plain channel
        for p, n in enumerate(calls_made):
            owner = p % world
            assert got[p].tolist() == [n if r != s and owner in (r, s) else 0 for s in range(world)], (r, p)
    for i, (kind, *shape) in enumerate(shapes):
        for r in range(world):
            for got, expected in zip(two_shot[r][i], one_shot[0][i]):
                assert torch.equal(got, expected), (i, kind, shape, r)
        if kind == "sum":  # NOTE: one rounding of the fp32 sum: toward zero in the interpreter, to nearest on GPUs
            exact = sum(calls[r][i][1].float() for r in range(world))  # 0 + x0 + x1 + x2 in fp32, as the kernel
            assert ((one_shot[0][i][0].float() - exact).abs() <= exact.abs() * 2 ** -7).all(), (i, shape)


def _calls(world: int, shapes: list, dtype: torch.dtype) -> tuple[list, list]:
    """Every rank's calls of ``shapes`` (``rank_main_mixed``'s format: fresh inputs, the residual and
    weight the same on every rank, as a model's are) and their outputs (NaN until written)."""
    calls, results = [], []
    for r in range(world):
        mine, outs = [], []
        for i, (kind, *shape) in enumerate(shapes):
            x = rand(*shape, seed=100 * r + i, dtype=dtype).share_memory_()
            if kind == "sum":
                mine.append(("sum", x))
            else:
                residual, weight = rand(*shape, seed=1000 + i, dtype=dtype), rand(shape[1], seed=2000 + i, dtype=dtype)
                mine.append(("norm", x, residual, weight, 1e-6))
            outs.append([torch.full_like(x, float("nan")).share_memory_() for _ in range(1 if kind == "sum" else 2)])
        calls.append(mine)
        results.append(outs)
    return calls, results


def _check_sums_and_norms(calls: list, results: list, shapes: list) -> None:
    """Every rank's outputs: the sum over ranks in rank order (fp32: exact), and for fused calls
    ``add_rms_norm`` of it (normed rows and stream), bit for bit."""
    world = len(calls)
    for i, (kind, *shape) in enumerate(shapes):
        total = calls[0][i][1].clone()
        for r in range(1, world):
            total += calls[r][i][1]
        want = [total] if kind == "sum" else list(norm_kernels.add_rms_norm(total, *calls[0][i][2:]))
        for r in range(world):
            for got, expected in zip(results[r][i], want):
                assert torch.equal(got, expected), (world, i, kind, shape, r)


def test_the_fused_norm_declines_what_it_cannot_fuse():
    """None (the caller then all-reduces and norms apart) for more rows than its flags hold or the GPU
    has SMs (a program each, all resident), rows longer than a row's part of a slot, another dtype, a
    weight of another dtype, a residual of another shape or a strided view."""
    data, flags = ranks.shared_buffers(1, MAX_BYTES, torch.float32)
    reducer = ranks._reducer(0, 1, MAX_BYTES, data, flags, None)
    x, w = torch.zeros(2, 8), torch.ones(8)
    assert reducer.max_programs == 5  # a flag per program of the largest bf16 message: 10,000 / 2,048 blocks
    assert reducer.add_rms_norm(torch.zeros(5, 8), torch.zeros(5, 8), w, 1e-6) is not None
    small_gpu = ranks._reducer(0, 1, MAX_BYTES, data, flags, 2)
    assert small_gpu.add_rms_norm(x, x, w, 1e-6) is not None
    assert small_gpu.add_rms_norm(torch.zeros(3, 8), torch.zeros(3, 8), w, 1e-6) is None
    assert reducer.add_rms_norm(torch.zeros(1, 992), torch.zeros(1, 992), torch.ones(992), 1e-6) is not None
    assert reducer.add_rms_norm(torch.zeros(1, 993), torch.zeros(1, 993), torch.ones(993), 1e-6) is None  # 16-aligned
    for args in [(torch.zeros(6, 8), torch.zeros(6, 8), w), (x.double(), x.double(), w.double()),
                 (x, x, w.double()), (x, torch.zeros(2, 4), w), (torch.zeros(2, 16)[:, ::2], x, w)]:
        assert reducer.add_rms_norm(*args, 1e-6) is None


def test_messages_stay_within_what_the_gpu_holds_at_once():
    """A call's programs must all be resident (a program waits for its peers' program of its number):
    an H200 (132 SMs of 2,048 threads) holds 2,112 of 128 threads, so the 4 MiB limit (1,024) stands;
    a GPU of 20 such SMs holds 320, so its messages stop at 320 x 2,048 bf16 elements."""
    from types import SimpleNamespace

    from specdec.models.all_reduce import PUSH_MAX_BYTES, push_resident_bytes

    h200 = SimpleNamespace(multi_processor_count=132, max_threads_per_multi_processor=2048)
    small = SimpleNamespace(multi_processor_count=20, max_threads_per_multi_processor=2048)
    assert kernels.resident_programs(h200) == 2112
    assert push_resident_bytes(h200) == PUSH_MAX_BYTES
    assert push_resident_bytes(small) == 320 * kernels.BLOCK * 2
