"""The push all-reduce (``specdec.models.all_reduce.PushAllReduce``, kernel in
``specdec.models.ops.all_reduce_kernels``) on CPU: two and three ranks as processes running Triton's
interpreter over shared-memory buffers, a sequence of messages of changing sizes (so each program's
epoch and parity move on unevenly), against the sum over ranks in rank order. On GPUs:
tests/e2e/test_gpu_custom_all_reduce.py."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from ..triton_env import import_kernels, rand

kernels = import_kernels("specdec.models.ops.all_reduce_kernels")

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
