"""The all-reduce strategies without GPUs: which path a message takes (one-shot, staged one-shot,
NCCL), when the one-shot path is off, and --speculative-draft-tp's rule. The kernels themselves
run in tests/e2e/test_gpu_custom_all_reduce.py (two GPUs)."""

import pytest
import torch

from specdec.models.all_reduce import (DistAllReduce, OneShotAllReduce, choose_all_reduce, exchanges_behind,
                                       one_shot_unavailable, register_group, store_timeout)
from specdec.models.config import LlamaConfig
from specdec.models.parallel import SINGLE, TPGroup, draft_head_group

MAX_BYTES = 1024


class TwoRanks:
    """Stands in for torch.ops.symm_mem on two ranks holding the same message: the sum is 2x; records
    each call's op name and the number of elements it reduced."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def one_shot_all_reduce_copy(self, buf, local, op, group):
        assert op == "sum" and group == "g" and buf.numel() == local.numel()
        buf.copy_(local)
        self.calls.append(("copy", buf.numel()))
        return buf * 2

    def one_shot_all_reduce(self, buf, op, group):
        assert buf.numel() * buf.element_size() % 16 == 0  # the kernel's alignment
        self.calls.append(("staged", buf.numel()))
        return buf * 2


class Fallback:
    name = "nccl"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return x.mul_(2)


def _one_shot():
    buffers = {d: torch.full((MAX_BYTES // d.itemsize,), float("nan"), dtype=d)
               for d in (torch.bfloat16, torch.float32)}
    ops, fallback = TwoRanks(), Fallback()
    return OneShotAllReduce("g", buffers, fallback=fallback, max_bytes=MAX_BYTES, ops=ops), ops, fallback


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("numel", [1, 3, 7, 8, 17, 100, 256])
def test_one_shot_routes_by_size_and_alignment(dtype, numel):
    reduce, ops, fallback = _one_shot()
    x = torch.randn(numel, dtype=dtype)
    want = x * 2
    limit = MAX_BYTES // dtype.itemsize
    got = reduce(x.clone())
    assert torch.equal(got, want) and got.shape == x.shape
    if numel > limit:
        assert fallback.calls == 1 and not ops.calls
    elif numel * dtype.itemsize % 16 == 0:
        assert ops.calls == [("copy", numel)]
    else:  # staged, reduced up to the next 16 bytes; the NaN tail never reaches the result
        assert ops.calls == [("staged", -(-numel * dtype.itemsize // 16) * 16 // dtype.itemsize)]


def test_one_shot_leaves_other_messages_to_nccl():
    reduce, ops, fallback = _one_shot()
    cases = [torch.randn(8, dtype=torch.float16),  # no one-shot kernel for fp16
             torch.randn(16, 4)[:, 0],  # not contiguous
             torch.randn(20)[1:9]]  # an offset that breaks the fused copy's alignment: staged, not NCCL
    for x in cases[:2]:
        assert torch.equal(reduce(x), x)  # NCCL's sums in place
    assert fallback.calls == 2 and not ops.calls
    x = cases[2]
    assert torch.equal(reduce(x), x * 2) and ops.calls == [("staged", 8)]


def test_cpu_and_disabled_groups_use_torch_distributed():
    for enabled, device, size in [(True, "cpu", 2), (False, "cuda:0", 2), (True, "cuda:0", 1)]:
        reducer = choose_all_reduce(None, device, size=size, enabled=enabled, single_host=True, peers=[0, 1])
        assert isinstance(reducer, DistAllReduce)
    assert TPGroup(rank=0, size=2).all_reduce_name == "torch.distributed"
    assert TPGroup(rank=0, size=2, reducer=_one_shot()[0]).all_reduce_name == "one-shot"
    assert one_shot_unavailable("cpu", size=2, single_host=True, peers=[]) == "not on CUDA (gloo)"
    assert "several nodes" in one_shot_unavailable("cuda:0", size=2, single_host=False, peers=[0, 1])


def test_tp_group_runs_its_reducer():
    seen = []
    tp = TPGroup(rank=0, size=2, reducer=lambda x: seen.append(x) or x + 1)
    x = torch.zeros(3)
    assert torch.equal(tp.all_reduce(x), torch.ones(3)) and seen == [x]
    assert TPGroup(rank=0, size=1, reducer=lambda x: 1 / 0).all_reduce(x) is x  # one rank: nothing to sum


def _head(hidden: int, heads: int = 32, kv: int = 8, inter: int | None = None) -> LlamaConfig:
    return LlamaConfig(vocab_size=1000, hidden_size=hidden, intermediate_size=inter or 3 * hidden, num_hidden_layers=1,
                       num_attention_heads=heads, num_key_value_heads=kv, head_dim=hidden // heads)


class SymmMem:
    """Stands in for torch.distributed._symmetric_memory: its registry, and the registration deprecated or not."""

    def __init__(self, deprecated: bool) -> None:
        self.registered: list[str] = []

        def enable_symm_mem_for_group(name: str) -> None:
            self.registered.append(name)

        if deprecated:
            enable_symm_mem_for_group.__deprecated__ = "no need to call this function anymore"
        self.enable_symm_mem_for_group = enable_symm_mem_for_group

    def is_symm_mem_enabled_for_group(self, name: str) -> bool:
        return name in self.registered


def test_group_registered_only_where_torch_needs_it():
    """A deprecated registration is never made (it outlives the group: the next engine of the process,
    whose group has the same name, hung on four H200s); a needed one is made once, and a second group
    of the same name is refused, so choose_all_reduce falls back to NCCL instead of waiting for ever."""
    newer = SymmMem(deprecated=True)
    register_group(newer, "0")
    register_group(newer, "0")  # the next engine's group
    assert newer.registered == []
    older = SymmMem(deprecated=False)
    register_group(older, "0")
    assert older.registered == ["0"]
    with pytest.raises(RuntimeError, match="earlier process group"):
        register_group(older, "0")


def test_draft_head_group_rule():
    tp2 = TPGroup(rank=1, size=2)
    assert draft_head_group("auto", _head(4096), tp2) is tp2  # an 8B model's head: sharded
    assert draft_head_group("auto", _head(2048, 16), tp2) is SINGLE  # too small to pay for the collectives
    assert draft_head_group("auto", _head(4096, 33, 3), tp2) is SINGLE  # heads do not split two ways
    assert draft_head_group("replicate", _head(4096), tp2) is SINGLE
    assert draft_head_group("shard", _head(64, 4, 2), tp2) is tp2
    assert draft_head_group("shard", _head(4096), SINGLE) is SINGLE
    with pytest.raises(ValueError, match="num_attention_heads"):
        draft_head_group("shard", _head(4096, 33, 3), tp2)
    with pytest.raises(ValueError, match="expected one of"):
        draft_head_group("split", _head(4096), tp2)


def test_draft_tp_flag_refuses_a_draft_without_head():
    from specdec.engine.args import EngineArgs

    with pytest.raises(ValueError, match="no draft head"):
        EngineArgs(model_path="m", device="cpu", speculative_algorithm="NGRAM", speculative_draft_tp="shard")
    assert EngineArgs(model_path="m", device="cpu").disable_custom_all_reduce is False  # on by default


# ---------------------------------------------------------------- torch's store-exchange sequence
def test_exchanges_behind_worked_example():
    """The second tp-2 engine of a process: rank 0's process rendezvoused twice for the first engine
    (bf16 and fp32 buffers), its new worker never."""
    assert [exchanges_behind([2, 0], r) for r in (0, 1)] == [0, 2]
    assert [exchanges_behind([4, 4, 1], r) for r in (0, 1, 2)] == [0, 0, 3]
    with pytest.raises(RuntimeError, match="rank 1's process failed midway"):
        exchanges_behind([2, -1], 0)


def test_rendezvous_ledger_counts_and_forgets_on_failure(monkeypatch):
    import torch.distributed._symmetric_memory as symm_mem

    from specdec.models import all_reduce

    monkeypatch.setattr(all_reduce._LEDGER, "count", 0)
    monkeypatch.setattr(symm_mem, "rendezvous", lambda buf, name: None)
    all_reduce._counted_rendezvous(torch.zeros(1), "0")
    all_reduce._counted_rendezvous(torch.zeros(1), "0")
    assert all_reduce._LEDGER.count == 2

    def fails(buf, name):
        raise RuntimeError("store timeout")

    monkeypatch.setattr(symm_mem, "rendezvous", fails)
    with pytest.raises(RuntimeError):
        all_reduce._counted_rendezvous(torch.zeros(1), "0")
    assert all_reduce._LEDGER.count is None  # how far torch's sequence got is unknown


def test_store_timeout_bounds_a_wait_then_restores():
    import datetime
    import time

    import torch.distributed as dist

    inner = dist.HashStore()
    store = dist.PrefixStore("0/", dist.PrefixStore("default_pg/", inner))
    before = store.timeout
    start = time.monotonic()
    with store_timeout(store, datetime.timedelta(milliseconds=200)):
        with pytest.raises(dist.DistStoreError):
            store.multi_get(["CUDASymmetricMemory/4/1"])  # a key no rank writes
    assert time.monotonic() - start < 30
    assert store.timeout == before and inner.timeout == before


def _peer(port: int, done: int, out) -> None:
    """Rank 1, a new process per group (as a tensor-parallel worker is): catches up with rank 0."""
    import torch.distributed as dist

    from specdec.models import all_reduce

    made = []
    all_reduce._fresh_block = lambda numel, dtype, device: torch.empty(numel, dtype=dtype)
    all_reduce._counted_rendezvous = lambda buf, name: made.append(name)
    all_reduce._LEDGER.count = done
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
    try:
        all_reduce._align_exchanges(dist.group.WORLD, torch.device("cpu"))
        dist.barrier()
        out.put((len(made), len(set(made)), dist.group.WORLD.group_name))
    finally:
        dist.destroy_process_group()


def test_second_group_of_a_process_catches_new_ranks_up(monkeypatch):
    """Two process groups one after the other in this process (rank 0), each with a new rank-1
    process: both groups are named "0", and the second group's new rank makes the two rendezvous
    this process made for the first group, alone (a group of its own), before the group's own."""
    import socket

    import torch.distributed as dist
    import torch.multiprocessing as mp

    from specdec.models import all_reduce

    monkeypatch.setattr(all_reduce, "_LEDGER", all_reduce._Ledger())
    ctx = mp.get_context("spawn")
    seen = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = ctx.Queue()
        peer = ctx.Process(target=_peer, args=(port, 0, out), daemon=True)
        peer.start()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
        try:
            all_reduce._align_exchanges(dist.group.WORLD, torch.device("cpu"))  # rank 0 is never behind
            dist.barrier()
            seen.append(out.get(timeout=60))
        finally:
            dist.destroy_process_group()
            peer.join(30)
        all_reduce._LEDGER.count += 2  # this group's rendezvous: the bf16 and the fp32 buffer
    assert seen[0] == (0, 0, "0")
    made, names, group_name = seen[1]
    assert (made, names, group_name) == (2, 1, "0")


def test_push_group_wiring_without_gpus(monkeypatch):
    """choose_all_reduce's push path on one simulated rank of two, the GPU calls replaced: each dtype's
    buffer and the flags get the element offsets of their own rendezvous handle (peer 1's buffers
    4 KiB above ours), the flags are zeroed int64, and the messages are sized to the 4 MiB limit."""
    import torch.distributed as dist
    from types import SimpleNamespace

    from specdec.models import all_reduce as ar

    class Handle:
        def __init__(self, buf):
            self.buffer_ptrs = [buf.data_ptr(), buf.data_ptr() + 4096]

    monkeypatch.setattr(ar, "one_shot_unavailable", lambda *a, **k: None)
    monkeypatch.setattr(ar, "register_group", lambda *a: None)
    monkeypatch.setattr(ar, "_fresh_block", lambda n, dtype, device: torch.full((n,), 7, dtype=dtype))
    monkeypatch.setattr(ar, "_align_exchanges", lambda *a: None)
    monkeypatch.setattr(ar, "_counted_rendezvous", lambda buf, name: Handle(buf))
    monkeypatch.setattr(ar, "_every_rank", lambda ok, *a: ok)
    # the other rank's GPU has fewer SMs: the group takes the least
    monkeypatch.setattr(ar, "_least_on_every_rank",
                        lambda values, *a: [min(v, w) for v, w in zip(values, [1 << 40, 100])])
    monkeypatch.setattr(dist.distributed_c10d, "_get_process_group_store", lambda group: SimpleNamespace(
        timeout=None, set_timeout=lambda t: None))
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(
        multi_processor_count=132, max_threads_per_multi_processor=2048))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    reducer = choose_all_reduce(SimpleNamespace(group_name="g"), "cuda:0", size=2, enabled=True, single_host=True,
                                peers=[0, 1], kernel="push")
    assert isinstance(reducer, ar.PushAllReduce) and reducer.max_bytes == ar.PUSH_MAX_BYTES
    data_bytes, flag_count = ar.push_buffer_sizes(ar.PUSH_MAX_BYTES, 2)
    for dtype, buf in reducer.buffers.items():
        assert buf.numel() * dtype.itemsize == data_bytes
        assert reducer.deltas[dtype].tolist() == [0, 4096 // dtype.itemsize]
    assert reducer.flags.dtype == torch.int64 and reducer.flags.numel() == flag_count
    assert not reducer.flags.any() and reducer.flag_deltas.tolist() == [0, 4096 // 8]
    assert reducer.max_rows == 100  # a fused call's rows: the least SMs of the group
