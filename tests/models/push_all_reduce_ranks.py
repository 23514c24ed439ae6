"""Ranks of the push all-reduce on CPU for tests/models/test_push_all_reduce.py: one process each
(Triton's interpreter, TRITON_INTERPRET=1 inherited), the buffers in shared memory, every rank's
buffers mapped into every process as peer memory is on GPUs."""

from __future__ import annotations

import torch

from specdec.models.all_reduce import TWO_SHOT_MIN_BYTES, PushAllReduce, push_buffer_sizes


def _deltas(tensors: list[torch.Tensor], rank: int) -> torch.Tensor:
    mine = tensors[rank]
    return torch.tensor([(t.data_ptr() - mine.data_ptr()) // mine.element_size() for t in tensors], dtype=torch.int64)


def shared_buffers(world: int, max_bytes: int, dtype: torch.dtype) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's data and flags (zeros), in shared memory."""
    data_bytes, flag_count = push_buffer_sizes(max_bytes, world)
    data = [torch.zeros(data_bytes // dtype.itemsize, dtype=dtype).share_memory_() for _ in range(world)]
    flags = [torch.zeros(flag_count, dtype=torch.int64).share_memory_() for _ in range(world)]
    return data, flags


def _no_fallback(x: torch.Tensor) -> torch.Tensor:
    raise AssertionError(f"a message of {x.numel()} elements went to the fallback")


def _reducer(rank: int, world: int, max_bytes: int, data: list, flags: list, num_sms: int | None, *,
             two_shot_min_bytes: int = TWO_SHOT_MIN_BYTES) -> PushAllReduce:
    dtype = data[rank].dtype
    return PushAllReduce({dtype: data[rank]}, flags[rank], {dtype: _deltas(data, rank)}, _deltas(flags, rank),
                         rank=rank, world=world, fallback=_no_fallback, max_bytes=max_bytes, num_sms=num_sms,
                         two_shot_min_bytes=two_shot_min_bytes)


def rank_main(rank: int, world: int, max_bytes: int, data: list, flags: list, messages: list, results: list) -> None:
    """Rank ``rank``'s all-reduces of its ``messages`` in order, each result into ``results[rank]``."""
    reducer = _reducer(rank, world, max_bytes, data, flags, None)
    for i, x in enumerate(messages[rank]):
        results[rank][i].copy_(reducer(x))


def rank_main_mixed(rank: int, world: int, max_bytes: int, data: list, flags: list, num_sms: int | None, calls: list,
                    results: list, two_shot_min_bytes: int = TWO_SHOT_MIN_BYTES) -> None:
    """Rank ``rank``'s ``calls`` in order: ("sum", x) an all-reduce, ("norm", x, residual, weight, eps) a
    fused all-reduce + add_rms_norm (None where it does not apply); each call's outputs into
    ``results[rank][i]`` (a list of tensors). Messages of ``two_shot_min_bytes`` or more go two-shot
    (from three ranks on)."""
    reducer = _reducer(rank, world, max_bytes, data, flags, num_sms, two_shot_min_bytes=two_shot_min_bytes)
    _run(reducer, calls[rank], results[rank])


def rank_main_modes(rank: int, world: int, max_bytes: int, groups: list, calls: list, results: list) -> None:
    """Rank ``rank``'s ``calls`` (as ``rank_main_mixed``'s) once per group of ``groups``: (data, flags,
    two_shot_min_bytes), every group its own buffers and reducer; outputs into ``results[g][rank]``."""
    for g, (data, flags, min_bytes) in enumerate(groups):
        reducer = _reducer(rank, world, max_bytes, data, flags, None, two_shot_min_bytes=min_bytes)
        _run(reducer, calls[rank], results[g][rank])


def _run(reducer: PushAllReduce, calls: list, results: list) -> None:
    for i, (kind, *args) in enumerate(calls):
        out = (reducer(*args),) if kind == "sum" else reducer.add_rms_norm(*args)
        assert out is not None, f"call {i} ({kind}, {tuple(args[0].shape)}) did not run fused"
        for dst, src in zip(results[i], out):
            dst.copy_(src)
