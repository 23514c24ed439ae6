"""How a tensor-parallel group sums its partial outputs (``TPGroup.all_reduce``), chosen once per
group at start-up (``choose_all_reduce``) and then called blindly from every row-parallel layer.

    DistAllReduce      torch.distributed.all_reduce: NCCL on CUDA, gloo on CPU. NCCL's ring costs
                       ~6 us a call on two H200s for the decode step's small messages (bs x hidden
                       bf16: 8 KB - 1 MB for an 8B model), 11-20 % of a tp-2 decode step.
    OneShotAllReduce   messages up to ``max_bytes`` over peer memory (torch's symmetric memory:
                       buffers of one size on every GPU of the host, each rank's mapped into the
                       others' address space through CUDA IPC). One kernel per call: copy this
                       rank's message into its own buffer, meet the other ranks at a barrier, read
                       every rank's buffer and sum (``torch.ops.symm_mem.one_shot_all_reduce_copy``).
                       Larger messages, other dtypes and misaligned views go to NCCL.
    PushAllReduce      the default (``PEER_KERNEL``): messages up to 4 MiB over the same kind of
                       buffers with our Triton kernel (``specdec.models.ops.all_reduce_kernels``):
                       each rank pushes its message into the others' buffers, one handshake, then
                       sums what arrived locally; double buffered, so no second barrier. Its
                       ``add_rms_norm`` fuses the residual add and RMSNorm after a row-parallel
                       layer into the same kernel (``TPGroup.all_reduce_add_rms_norm``). From three
                       ranks on, messages of ``TWO_SHOT_MIN_BYTES`` or more go two-shot: each block
                       is summed at one rank, which pushes the sum back (the same bits, fewer bytes).

Equality: every rank sums ranks 0, 1, ..., tp-1 in that order, so all ranks hold the same bits.
With two ranks the one sum a + b is the same float as NCCL's (addition commutes exactly); with
more, the order of roundings can differ from NCCL's ring, within bf16 rounding.

CUDA graphs: the buffers are allocated and exchanged (``rendezvous``, a collective) here, before any
capture; a call only looks its buffer up on the host and launches one kernel, whose barrier flags
reset themselves, so a captured call replays as often as needed. The ranks must call in the same
order, which tensor parallelism already guarantees (every rank runs the same forwards).

NOTE [one store-exchange sequence per process]: torch's CUDA symmetric memory meets the other ranks
in a rendezvous through the group's store, under keys "CUDASymmetricMemory/<seq>/<rank>", where seq
counts the exchanges this *process* has made (a static ``StoreExchange`` in CUDASymmetricMemory.cu,
``++seq_id_`` in CUDASymmetricMemoryUtils.hpp; pytorch#196082), not the group's. Rank 0 lives as long
as the user's process, its workers are new processes per engine: for the second tensor-parallel
engine of a process rank 0 wrote and waited at seq 4 while the fresh workers waited at seq 0, each
for keys the other never wrote, until the store's timeout (seen on two H200s, torch 2.11: every
engine after the first hung at start-up; a new group name cannot help, the keys hold no name). So
the ranks first compare how many rendezvous their processes have made (``_LEDGER``) and a rank
behind catches up by rendezvousing scratch blocks alone (a group of itself); and a rendezvous that
still does not meet gives up after ``RENDEZVOUS_TIMEOUT`` and the group falls back to NCCL. Each
buffer is a block of its own (not torch's implicit pool, which packs buffers into shared blocks and
serves a later engine a block it rendezvoused for an earlier group of the same name), so every
rendezvous makes the same exchanges on every rank.

NOTE: NVLink multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1, set here before the first
allocation): the one-shot kernels reach peers' buffers through their unicast mappings only, never
the multicast address (no ``multimem_*`` op), and creating multicast objects can take a shared
host's GPUs out of service.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import importlib.util
import os
import warnings
from typing import Any, Callable, Iterator

import torch

__all__ = ["AllReduce", "DistAllReduce", "OneShotAllReduce", "PushAllReduce", "ONE_SHOT_MAX_BYTES",
           "PEER_KERNEL", "PUSH_MAX_BYTES", "RENDEZVOUS_TIMEOUT", "TWO_SHOT_MIN_BYTES", "choose_all_reduce",
           "exchanges_behind", "one_shot_unavailable", "push_buffer_sizes", "register_group", "store_timeout"]

# Messages up to this size take torch's one-shot kernel. 1 MiB covers an 8B model's decode step up to
# bs 128 (128 x 4096 x 2 bytes) and its verify step up to 128 tree tokens; past ~1 MB the one-shot
# kernel's 24 blocks read peer memory slower than NCCL's ring moves it (benchmarks/bench_allreduce.py
# measures the crossover). The buffer is this size too: the largest message a decode, verify or
# draft graph all-reduces (bs_max x num_tokens x hidden) is at least this for every model served
# on a GPU (256 x 2048 x 2 bytes), and anything larger goes to NCCL anyway.
ONE_SHOT_MAX_BYTES = 1 << 20
# The push kernel's limit: it is twice as fast as NCCL up to 4 MiB (a verify of 4 tokens at bs 128), level at 8
PUSH_MAX_BYTES = 4 << 20
# From three ranks on, messages of at least this many bytes take the push kernel's two-shot mode (each
# GPU pushes 2 (W - 1) / W x the message instead of W - 1 x, behind two handshakes instead of one; the
# same bits). Four H200s, bf16, graph-replayed (benchmarks/results/2026-11-30-h200x4-scale): two-shot
# 9.7 us at 256 KiB (one-shot 9.6), 11.0 at 512 KiB (12.6), 16.8 at 1 MiB (22.6), 34.7 at 4 MiB (59.0)
TWO_SHOT_MIN_BYTES = 512 << 10
# torch's one-shot kernel dispatches on these (AT_DISPATCH_FLOAT_AND_BFLOAT16)
ONE_SHOT_DTYPES = (torch.bfloat16, torch.float32)
_ALIGN = 16  # bytes: the kernel's widest vector; the fused copy needs message and view aligned to it
_MULTICAST_ENV = "TORCH_SYMM_MEM_DISABLE_MULTICAST"
# the peer-memory kernel ``choose_all_reduce`` takes: "torch" (OneShotAllReduce) or "push" (PushAllReduce).
# Two H200s, bf16, graph-replayed (benchmarks/results/2026-11-29-h200x2-push-all-reduce): push 3.7 us at 8 KiB
# (torch's 6.7, NCCL's 10.1), 7.8 at 1 MiB (15.3, 18.2), 17.9 at 4 MiB (36.2, 35.8), NCCL's time at 8 MiB
PEER_KERNEL = "push"
# how long a rendezvous may wait for the other ranks' keys (it takes well under a second once they
# have met at the all-reduce before it); then the group falls back to NCCL
RENDEZVOUS_TIMEOUT = datetime.timedelta(seconds=60)


class _Ledger:
    """The rendezvous this process has made (every one on a fresh block: the same store exchanges on
    every rank); None once one failed midway (how far torch's sequence got is unknown)."""

    count: int | None = 0


_LEDGER = _Ledger()  # NOTE: per process, as torch's sequence is; see the module docstring

AllReduce = Callable[[torch.Tensor], torch.Tensor]


class DistAllReduce:
    """torch.distributed's all-reduce, in place."""

    name = "torch.distributed"

    def __init__(self, group: Any = None) -> None:
        self.group = group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x


class OneShotAllReduce:
    """Small messages over peer memory, NCCL (``fallback``) for the rest; see the module docstring.
    ``buffers``: per dtype, [max_bytes / itemsize] allocated by ``symm_mem.empty`` and rendezvoused
    over the group (``choose_all_reduce`` builds them)."""

    name = "one-shot"

    def __init__(self, group_name: str, buffers: dict[torch.dtype, torch.Tensor], *, fallback: AllReduce,
                 max_bytes: int, ops: Any = None) -> None:
        """``ops``: the namespace holding ``one_shot_all_reduce(_copy)`` (default ``torch.ops.symm_mem``)."""
        self.group_name, self.buffers, self.fallback, self.max_bytes = group_name, buffers, fallback, max_bytes
        self.device = next(iter(buffers.values())).device
        self.ops = ops if ops is not None else torch.ops.symm_mem
        # the fused copy-in (torch >= 2.8); without it every message is staged by a copy kernel first
        self.fused = hasattr(self.ops, "one_shot_all_reduce_copy")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, a new tensor (``x`` is left as it was); NCCL's in place beyond the limits."""
        buf = self.buffers.get(x.dtype)
        size = x.element_size()
        if buf is None or x.numel() * size > self.max_bytes or not x.is_contiguous() or x.device != self.device:
            return self.fallback(x)
        n = x.numel()
        if self.fused and (n * size) % _ALIGN == 0 and (x.storage_offset() * size) % _ALIGN == 0:
            return self.ops.one_shot_all_reduce_copy(buf[:n], x.view(-1), "sum", self.group_name).view_as(x)
        # an odd size (or no fused op): stage it, and reduce up to the next aligned length (the tail
        # is never read)
        padded = -(-n * size // _ALIGN) * _ALIGN // size
        buf[:n].copy_(x.view(-1))
        return self.ops.one_shot_all_reduce(buf[:padded], "sum", self.group_name)[:n].view_as(x)


class PushAllReduce:
    """Small messages pushed over peer memory by one Triton kernel (module docstring), NCCL
    (``fallback``) for the rest. ``buffers``: per dtype, this rank's symmetric data; ``flags``: its
    symmetric int64 flags, zeros at the start (sizes: ``push_buffer_sizes``); ``deltas`` /
    ``flag_deltas``: every rank's address of them minus this rank's, in elements (``choose_all_reduce``
    builds them all).

    Two channels share the buffers, each with its own part of data, flags and epochs, so each keeps
    the kernel's one-handshake protocol to itself: ``CHANNEL_BLOCKS`` (``__call__``: a program per
    block of elements) and ``CHANNEL_ROWS`` (``add_rms_norm``: a program per row, which the norm needs
    whole; the two would map programs to different elements). From three ranks on, messages of at
    least ``two_shot_min_bytes`` take the kernels' two-shot mode (the same bits, less pushed); the two
    modes share a channel's epochs and flags (the kernels' docstring says why that is safe): every
    rank picks the same mode for a call, as it sees the same sizes."""

    name = "push"
    CHANNEL_BLOCKS, CHANNEL_ROWS = 0, 1

    def __init__(self, buffers: dict[torch.dtype, torch.Tensor], flags: torch.Tensor,
                 deltas: dict[torch.dtype, torch.Tensor], flag_deltas: torch.Tensor, *, rank: int, world: int,
                 fallback: AllReduce, max_bytes: int, num_sms: int | None = None,
                 two_shot_min_bytes: int = TWO_SHOT_MIN_BYTES) -> None:
        """``num_sms``: the GPU's SMs (the least of the ranks'), the most rows a fused call takes, a
        program each (None: the flags' limit alone, the interpreter's); each row owns 1 / max_rows
        of a slot, the longest row a fused call takes. ``two_shot_min_bytes``: the smallest message
        of the two-shot mode, from three ranks on (NOTE: the same on every rank)."""
        from specdec.models.ops import all_reduce_kernels  # NOTE: imports triton

        self.kernels = all_reduce_kernels
        self.buffers, self.flags, self.deltas, self.flag_deltas = buffers, flags, deltas, flag_deltas
        self.rank, self.world, self.fallback, self.max_bytes = rank, world, fallback, max_bytes
        # with two ranks the two-shot mode pushes as many bytes as the one-shot, behind two handshakes
        self.two_shot_min_bytes = two_shot_min_bytes if world >= 3 else None
        self.device = flags.device
        self.max_programs = flags.numel() // (_PUSH_CHANNELS * world)
        self.max_rows = min(self.max_programs, num_sms or self.max_programs)  # a fused call's: a flag and an SM a row
        self.epochs = torch.zeros(_PUSH_CHANNELS * self.max_programs, dtype=torch.int64, device=self.device)  # local
        # NOTE: each channel's kernel arguments made once (views: a few microseconds a call on the host)
        self._args = {(channel, dtype): self._channel(channel, dtype)
                      for channel in (self.CHANNEL_BLOCKS, self.CHANNEL_ROWS) for dtype in buffers}

    def _channel(self, channel: int, dtype: torch.dtype) -> dict[str, Any]:
        """The kernel arguments of ``channel`` for messages of ``dtype``: its views of the buffers."""
        buf, programs = self.buffers[dtype], self.max_programs
        data = buf.numel() // _PUSH_CHANNELS
        flags = programs * self.world
        region = self.max_bytes // dtype.itemsize
        args = dict(data=buf[channel * data:(channel + 1) * data],
                    flags=self.flags[channel * flags:(channel + 1) * flags],
                    epochs=self.epochs[channel * programs:(channel + 1) * programs], data_deltas=self.deltas[dtype],
                    flag_deltas=self.flag_deltas, rank=self.rank, world=self.world, region=region)
        if channel == self.CHANNEL_ROWS:
            # the longest row a fused call takes; rows start 16-byte aligned (all_reduce_kernels.DELTA_ALIGN)
            align = self.kernels.DELTA_ALIGN
            args["row_stride"] = region // self.max_rows // align * align
        return args

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, a new tensor (``x`` is left as it was); NCCL's in place beyond the limits."""
        buf = self.buffers.get(x.dtype)
        if buf is None or x.numel() * x.element_size() > self.max_bytes or not x.is_contiguous() \
                or x.device != self.device:
            return self.fallback(x)
        out = self.kernels.push_all_reduce(x.view(-1), two_shot=self._two_shot(x),
                                           **self._args[self.CHANNEL_BLOCKS, x.dtype])
        return out.view_as(x)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``add_rms_norm(self(x), residual, weight, eps)`` in one kernel, the same bits; None where
        the fused kernel does not apply (the caller then runs the two)."""
        args = self._args.get((self.CHANNEL_ROWS, x.dtype))
        if args is None or x.dim() != 2 or x.shape[0] > self.max_rows or x.shape[1] > args["row_stride"] \
                or not (x.is_contiguous() and residual.is_contiguous()) or x.device != self.device \
                or residual.shape != x.shape or residual.dtype != x.dtype or weight.dtype != x.dtype:
            return None
        return self.kernels.push_all_reduce_add_rms_norm(x, residual, weight, eps, two_shot=self._two_shot(x),
                                                         **args)

    def _two_shot(self, x: torch.Tensor) -> bool:
        """Whether ``x`` (the whole message: rows x cols of a fused call) takes the two-shot mode."""
        return self.two_shot_min_bytes is not None and x.numel() * x.element_size() >= self.two_shot_min_bytes


_PUSH_CHANNELS = 2  # PushAllReduce's: blocks and rows


def push_resident_bytes(props: Any) -> int:
    """The largest bf16 message whose push programs a GPU (its properties) holds all at once, a
    multiple of the kernel's block."""
    from specdec.models.ops import all_reduce_kernels as k

    return min(k.MAX_PROGRAMS, k.resident_programs(props)) * k.BLOCK * 2


def push_buffer_sizes(max_bytes: int, world: int) -> tuple[int, int]:
    """(data bytes a dtype, flag count) of ``PushAllReduce``'s symmetric buffers: for each of its
    channels, both parities of a slot per rank, and a handshake per program of the largest bf16
    message per rank."""
    from specdec.models.ops import all_reduce_kernels

    programs = all_reduce_kernels.programs(max_bytes // 2)
    if programs > all_reduce_kernels.MAX_PROGRAMS:
        raise ValueError(f"push all-reduce: max_bytes={max_bytes} needs {programs} programs a call, more than "
                         f"{all_reduce_kernels.MAX_PROGRAMS}")
    return _PUSH_CHANNELS * 2 * world * max_bytes, _PUSH_CHANNELS * programs * world


def one_shot_unavailable(device: Any, *, size: int, single_host: bool, peers: list[int]) -> str | None:
    """Why the one-shot path cannot run on this rank (None: it can). ``peers``: the CUDA device
    indices of the group's ranks on this host."""
    device = torch.device(device)
    if size < 2:
        return "one rank"
    if device.type != "cuda":
        return "not on CUDA (gloo)"
    if not single_host:
        return "ranks on several nodes: peer memory reaches the GPUs of one host only"
    try:
        importlib.import_module("torch.distributed._symmetric_memory")
    except ImportError:
        return f"torch {torch.__version__} has no symmetric memory"
    if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
        return f"torch {torch.__version__} has no symm_mem.one_shot_all_reduce"
    if torch.cuda.get_device_capability(device) < (8, 0):
        return "GPU older than sm_80 (bf16 adds)"
    me = device.index if device.index is not None else torch.cuda.current_device()
    blocked = [p for p in peers if p != me and not torch.cuda.can_device_access_peer(me, p)]
    if blocked:
        return f"cuda:{me} cannot access the memory of cuda:{blocked[0]} (no peer access)"
    return None


def choose_all_reduce(group: Any, device: Any, *, size: int, enabled: bool, single_host: bool,
                      peers: list[int], max_bytes: int | None = None, kernel: str = PEER_KERNEL,
                      two_shot_min_bytes: int = TWO_SHOT_MIN_BYTES) -> AllReduce:
    """The group's all-reduce: one-shot over peer memory (``kernel``: "torch" or "push", module
    docstring; messages up to ``max_bytes``, by default the kernel's ``ONE_SHOT_MAX_BYTES`` or
    ``PUSH_MAX_BYTES``; ``two_shot_min_bytes``: ``PushAllReduce``'s) where every rank can run it, else
    torch.distributed's (with a warning saying why). Call on every rank at once, after the process
    group exists and before any CUDA graph is captured. The ranks agree over NCCL after each step that
    can fail on its own (the checks, the allocations, the catching up, the rendezvous), so no rank
    waits in a collective that the others skip; a rendezvous that does not meet gives up after
    ``RENDEZVOUS_TIMEOUT``."""
    fallback = DistAllReduce(group)
    if not enabled or size < 2 or torch.device(device).type != "cuda":
        return fallback  # the same on every rank: nothing to agree on
    props = torch.cuda.get_device_properties(torch.device(device))
    if max_bytes is None:
        max_bytes = PUSH_MAX_BYTES if kernel == "push" else ONE_SHOT_MAX_BYTES
        if kernel == "push":  # NOTE: every program of a call resident at once (all_reduce_kernels.MAX_PROGRAMS)
            max_bytes = min(max_bytes, push_resident_bytes(props))
    # NOTE: the least of every rank's (a collective): the ranks must make the same calls (GPUs may differ)
    max_bytes, num_sms = _least_on_every_rank([max_bytes, props.multi_processor_count], group, device)
    if max_bytes <= 0 or max_bytes % _ALIGN:
        raise ValueError(f"custom all-reduce: max_bytes={max_bytes} must be a positive multiple of {_ALIGN}")
    if kernel not in ("torch", "push"):
        raise ValueError(f"custom all-reduce: kernel={kernel!r}, expected 'torch' or 'push'")
    import torch.distributed as dist

    group = group or dist.group.WORLD
    group_name, device = group.group_name, torch.device(device)
    reason = one_shot_unavailable(device, size=size, single_host=single_host, peers=peers)
    if reason is None and kernel == "push" and importlib.util.find_spec("triton") is None:
        reason = "the push kernel needs triton"
    buffers: dict[torch.dtype, torch.Tensor] = {}  # per dtype
    flags: list[torch.Tensor] = []  # the push kernel's handshake flags (one tensor)
    deltas: list[torch.Tensor] = []  # the push kernel's: per buffer, then the flags'

    def exchange() -> None:
        tensors = [*buffers.values(), *flags]
        handles = _rendezvous(tensors, group, group_name)
        if kernel == "push":  # NOTE: here, so that a failure is agreed on like the rendezvous's
            rank = dist.get_rank(group)
            deltas.extend(_deltas(t, h, rank, data=i < len(buffers)) for i, (t, h) in enumerate(zip(tensors, handles)))

    steps = (lambda: _allocate(buffers, flags, group_name, device, max_bytes,
                               push_world=size if kernel == "push" else 0),
             lambda: _align_exchanges(group, device),  # NOTE: a collective first, run by every rank
             exchange)
    for step in steps:
        if reason is None:
            try:
                step()
            except (RuntimeError, ValueError) as e:  # torch's errors, DistStoreError among them
                reason = f"symmetric memory failed: {e}"
        if not _every_rank(reason is None, group, device):
            warnings.warn(f"custom all-reduce off ({reason or 'another rank cannot run it'}): NCCL all-reduces "
                          "every message", stacklevel=2)
            return fallback
    if kernel == "torch":
        return OneShotAllReduce(group_name, buffers, fallback=fallback, max_bytes=max_bytes)
    return PushAllReduce(buffers, flags[0], dict(zip(buffers, deltas)), deltas[-1], rank=dist.get_rank(group),
                         world=size, fallback=fallback, max_bytes=max_bytes, num_sms=num_sms,
                         two_shot_min_bytes=two_shot_min_bytes)


def _deltas(buf: torch.Tensor, handle: Any, rank: int, *, data: bool) -> torch.Tensor:
    """Every rank's address of ``buf`` (the rendezvous ``handle``'s) minus this rank's, in elements;
    ``data``: the push kernel's data, whose deltas it assumes are multiples of ``DELTA_ALIGN`` elements."""
    from specdec.models.ops.all_reduce_kernels import DELTA_ALIGN

    ptrs = list(getattr(handle, "buffer_ptrs", None) or [])
    if len(ptrs) <= rank or ptrs[rank] != buf.data_ptr():
        raise RuntimeError("symmetric memory: the rendezvous mapped this rank's buffer at another address")
    unit = buf.element_size() * (DELTA_ALIGN if data else 1)
    if any((p - ptrs[rank]) % unit for p in ptrs):
        raise RuntimeError(f"symmetric memory: peers' buffers are not {unit}-byte aligned to this rank's")
    return torch.tensor([(p - ptrs[rank]) // buf.element_size() for p in ptrs], dtype=torch.int64, device=buf.device)


def _allocate(buffers: dict, flags: list, group_name: str, device: torch.device, max_bytes: int, *,
              push_world: int = 0) -> None:
    """This rank's buffers (local: may fail on one rank alone); for the push kernel (``push_world``
    ranks) twice a slot per rank, and its handshake flags (into ``flags``) zeroed before any rank can
    see them."""
    import torch.distributed._symmetric_memory as symm_mem

    os.environ[_MULTICAST_ENV] = "1"  # NOTE: before the first allocation; see the module docstring
    register_group(symm_mem, group_name)
    data_bytes, flag_count = push_buffer_sizes(max_bytes, push_world) if push_world else (max_bytes, 0)
    for dtype in ONE_SHOT_DTYPES:
        buffers[dtype] = _fresh_block(data_bytes // dtype.itemsize, dtype, device)
    if flag_count:
        flags.append(_fresh_block(flag_count, torch.int64, device).zero_())
        torch.cuda.synchronize(device)  # NOTE: zeros before the rendezvous publishes them to the peers


def _fresh_block(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A symmetric tensor in a block of its own, freed with it (not from torch's implicit pool; see
    the module docstring)."""
    from torch._C._distributed_c10d import _SymmetricMemory

    return _SymmetricMemory.empty_strided_p2p((numel,), (1,), dtype, device)


def register_group(symm_mem: Any, group_name: str) -> None:
    """Register the group for symmetric memory where torch needs it: older torch rendezvouses through a
    registration made once per process and group name (``enable_symm_mem_for_group``); newer torch
    resolves the live group itself and deprecates the call.

    NOTE: the deprecated call still registers (until the process ends, by name, with the group's
    store), and every engine's group is named "0" (torch names the default group so): the next
    tensor-parallel engine of the same process would rendezvous through the first engine's store and
    wait for ever (seen on four H200s: every engine after the first hung at start-up). So it is never
    made where deprecated; where it is needed, a name already registered means an earlier group of
    this process, and the caller falls back to NCCL (``RuntimeError``)."""
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is None or hasattr(enable, "__deprecated__"):
        return
    if symm_mem.is_symm_mem_enabled_for_group(group_name):
        raise RuntimeError(f"group {group_name!r} is registered to an earlier process group of this process "
                           f"(torch {torch.__version__} keeps the first registration)")
    enable(group_name)


def _rendezvous(buffers: list[torch.Tensor], group: Any, group_name: str) -> list:
    """Exchange the buffers' handles with the other ranks (collective), waiting at most
    ``RENDEZVOUS_TIMEOUT`` for them; the handles."""
    import torch.distributed as dist

    handles = []
    with store_timeout(dist.distributed_c10d._get_process_group_store(group), RENDEZVOUS_TIMEOUT):
        for buf in buffers:
            try:
                handles.append(_counted_rendezvous(buf, group_name))
            except dist.DistStoreError as e:
                raise RuntimeError(
                    f"the ranks did not meet in the rendezvous within {RENDEZVOUS_TIMEOUT.total_seconds():g} s "
                    f"(torch numbers its store exchanges per process, pytorch#196082: has this process "
                    f"rendezvoused for another group outside specdec?): {e}") from e
    return handles


def _counted_rendezvous(buf: torch.Tensor, group_name: str) -> Any:
    import torch.distributed._symmetric_memory as symm_mem

    done, _LEDGER.count = _LEDGER.count, None  # unknown until it returns
    handle = symm_mem.rendezvous(buf, group_name)
    _LEDGER.count = None if done is None else done + 1
    return handle


def exchanges_behind(counts: list[int], rank: int) -> int:
    """How many rendezvous ``rank``'s process must make alone to reach the process that has made
    the most (``counts``: each rank's ``_LEDGER.count``, -1 for unknown). Worked example, the second
    tp-2 engine of a process: rank 0 made 2 for the first engine, its new worker none:
    counts [2, 0] -> rank 0: 0, rank 1: 2."""
    unknown = [r for r, c in enumerate(counts) if c < 0]
    if unknown:
        raise RuntimeError(f"an earlier rendezvous of rank {unknown[0]}'s process failed midway, so its place "
                           "in torch's store-exchange sequence is unknown")
    return max(counts) - counts[rank]


def _align_exchanges(group: Any, device: torch.device) -> None:
    """Bring every rank's process to the same place in torch's store-exchange sequence (collective;
    see the module docstring): a rank behind rendezvouses scratch blocks on a group of its own."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    mine = torch.tensor([-1 if _LEDGER.count is None else _LEDGER.count], dtype=torch.int64, device=device)
    counts = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(counts, mine, group=group)
    behind = exchanges_behind([int(c.item()) for c in counts], dist.get_rank(group))
    if not behind:
        return
    alone = dist.new_group([dist.get_rank()], use_local_synchronization=True)
    try:
        register_group(symm_mem, alone.group_name)
        for _ in range(behind):
            _counted_rendezvous(_fresh_block(_ALIGN, torch.uint8, device), alone.group_name)
    finally:
        dist.destroy_process_group(alone)


@contextlib.contextmanager
def store_timeout(store: Any, timeout: datetime.timedelta) -> Iterator[None]:
    """``store`` and the stores under it (a PrefixStore wraps the group's TCPStore) wait at most
    ``timeout`` for a key inside the block; their own timeouts after it."""
    chain = [store]
    while hasattr(chain[-1], "underlying_store"):
        chain.append(chain[-1].underlying_store)
    before = [s.timeout for s in chain]
    try:
        for s in chain:
            s.set_timeout(timeout)
        yield
    finally:
        for s, t in zip(reversed(chain), reversed(before)):
            s.set_timeout(t)


def _least_on_every_rank(values: list[int], group: Any, device: Any) -> list[int]:
    """Each of ``values``' least over the group's ranks (a collective)."""
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return [int(v) for v in t.tolist()]


def _every_rank(ok: bool, group: Any, device: Any) -> bool:
    import torch.distributed as dist

    flag = torch.tensor([int(ok)], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())
