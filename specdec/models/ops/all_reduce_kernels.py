"""Triton kernels behind ``specdec.models.all_reduce.PushAllReduce``: a one-shot all-reduce that pushes
each rank's message into every other rank's buffer (peer memory, CUDA IPC mappings of torch's
symmetric memory) and then sums locally, one kernel and one handshake a call; a two-shot mode of it
(below) that sums each block at one rank and pushes the sum back, for three ranks or more; and both
fused with the residual add and RMSNorm that follow a row-parallel layer (``add_rms_norm``'s arithmetic).

Per rank, symmetric (every rank allocates the same, and each sees the others' through their mapped
addresses):
    data   [2, W, R]  parity x source rank x R elements: rank s writes its message (two-shot: its
                      part or its sum) into slot [parity, s] of the other ranks' data
    flags  [P, W]     int64, program p's handshake: rank s stores the epoch it reached at [p, s] of
                      the other ranks' flags
and local to the rank: ``epochs`` [P] int64, the calls program p has made (zeros at the start).

Program p owns elements [p * BLOCK, (p + 1) * BLOCK) of the message, for every message size, and its
call number e = epochs[p] + 1 picks the parity e % 2. In the one-shot mode it
    1. writes its part of x into slot [e % 2, rank] of every other rank (NVLink stores, posted),
    2. waits for its threads (a CTA barrier), then stores e at flags[p, rank] of every other rank with
       release semantics at system scope: the data stores before it are visible to whoever sees e,
    3. spins, acquire at system scope, until flags[p, s] >= e on its own rank for every other rank s,
    4. sums ranks 0, 1, ..., W - 1 in that order in fp32 (its own part from registers, the others'
       from its own memory) and stores the result, rounded once, then records epochs[p] = e.

Why one handshake suffices: a rank writes slot [e % 2] of a peer again only in call e + 2, which
starts after it saw that peer's flag e + 1, which the peer stores only in its call e + 1, after its
call e read the slot (the calls are kernels in stream order). So the two parities keep a call's
reads apart from the next call's writes, and flags only grow (no reset, no wrap: int64). Every rank
makes the same calls in the same order with the same sizes (tensor parallelism runs the same
forwards), so program p's epoch is the same on every rank. All of a call's programs fit on the GPU at
once (``MAX_PROGRAMS``), so a spinning program never keeps a peer's program from running.

Equality: with two ranks the fp32 sum a + b rounded once is the bf16 sum NCCL computes, bit for bit;
with more, ranks are summed in rank order (every rank the same bits).

Two-shot mode (``two_shot``): the one-shot mode's time grows with the bytes each GPU pushes, (W - 1)
x the message (~145 GB/s a GPU on H200s: 1 MiB takes 7.1 us at 2 ranks, 22 at 4). In the two-shot
mode program p's block has an owner, rank o = p % W (owners take turns, so each rank pushes
2 (W - 1) / W x the message: 1.5 MiB instead of 3 for 1 MiB at 4 ranks), and
    1. a rank s != o writes its part into slot [e % 2, s] of rank o only, then (CTA barrier) stores e
       at flags[p, s] of rank o only (release, system scope),
    2. the owner acquires flags[p, s] >= e on its own rank for every s != o, sums ranks 0, ..., W - 1
       as step 4 does and rounds once, writes that into slot [e % 2, o] of every other rank, then
       stores e at flags[p, o] of every other rank,
    3. a rank s != o acquires flags[p, o] >= e on its own rank and reads the sum from its slot [e % 2, o].
Every rank ends with the one-shot mode's bits (the same sum in the same order, rounded once, then
copied), so the mode is a choice of speed alone; it waits for two handshakes in series instead of
one, so it pays for large messages only (``PushAllReduce`` picks it).

Why one handshake a step still suffices, in either mode and with the modes mixed call after call on
the same data, flags and epochs: in both, slot [q, t] and flags[p, t] of rank r are written by rank t
alone (its part, or as owner the sum, always into slot index t; its own epoch into flag index t) and
read by rank r alone, in the call that wrote them. Rank t writes slot [e % 2, t] of r again only in
call e + 2, after its call e + 1 saw a flag >= e + 1 that was stored after r's call e ended (stream
order): r's own flag (one-shot, or two-shot where t or r owns the block), or the owner o's, which o
stored after it saw r's (two-shot, t and r both not owners: release/acquire chains are transitive).
A read in call e waits for the writer's flag >= e, which the writer stores after that call's writes
(in any later call too). Flags only grow (each has one writer, in stream order); a flag a two-shot
call leaves behind (rank s's on a non-owner r stays at an older epoch) only makes a later acquire
wait for its own epoch, which only s's next call for that program stores. Every rank picks the same
mode for a call (the same calls with the same sizes), so a call's flags and slots match on every rank.

The fused kernel (``push_all_reduce_add_rms_norm``) keeps the protocol with a program per row
instead of per block (the norm needs a whole row), on its own data, flags and epochs
(``PushAllReduce``'s channels: two kernels mapping programs to different elements must not share
them; the two modes may). Row p owns the same elements of the slots in every call (a fixed
``row_stride``, whatever the row's length: draft and target rows may differ), as a block does in the
plain kernel, so the arguments above hold row by row; in the two-shot mode its owner is rank p % W,
only the rounded sum travels back, and every rank adds the residual and norms locally.
``PushAllReduce`` launches it for at most as many rows as the GPU has SMs, so every program is
resident whatever its registers (one per SM); more rows take the plain kernel and the norm (looping
rows inside a program measured slower: benchmarks/results/2026-11-30-h200x2-fused-norm). Each row
adds the residual and norms as ``add_rms_norm`` does: the same bits as the all-reduce followed by
that kernel.

Addresses: peers' buffers are reached from this rank's own (typed) buffer plus an element offset
(``data_deltas``, ``flag_deltas``: the peer's address minus this rank's, in elements), so the
kernel needs no integer-to-pointer casts and runs under TRITON_INTERPRET=1 on CPU buffers too
(tests run ranks as processes over shared memory).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.models.ops.launch import pdl_kwargs
from specdec.models.ops.triton_kernels import weighted_rms_norm

BLOCK = 2048  # elements a program owns: 4 KiB of bf16; an 8B model's decode step (4096 x bs) uses 2 x bs programs
NUM_WARPS = 4
# every peer's data address minus this rank's is a multiple of this many elements (symmetric memory's
# blocks are page-aligned; ``all_reduce._deltas`` checks), and so is a fused row's ``row_stride``: the
# kernels store 16 bytes at a time to peer memory (2-byte stores where Triton cannot prove it)
DELTA_ALIGN = 16
_DELTA_ALIGN = tl.constexpr(DELTA_ALIGN)  # the kernels' view of it
# at most this many programs a call (4 MiB of bf16), all resident at once on any GPU that runs this
# (an H200 holds 16 of them on each of 132 SMs): a program waits for its peers' program of the same
# number, which must not wait for a free SM behind programs that wait
MAX_PROGRAMS = 1024


@triton.jit
def _push_to(x, offs, mask, data_ptr, data_deltas_ptr, epoch, region, dst, RANK: tl.constexpr, WORLD: tl.constexpr):
    """``x`` into elements ``offs`` of slot [epoch % 2, RANK] of rank ``dst`` (another rank)."""
    slot = ((epoch % 2) * WORLD + RANK) * region
    delta = tl.multiple_of(tl.load(data_deltas_ptr + dst), _DELTA_ALIGN)  # 16-byte stores to the peer
    tl.store(data_ptr + delta + slot + offs, x, mask=mask)


@triton.jit
def _push(x, offs, mask, data_ptr, data_deltas_ptr, epoch, region, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Step 1: ``x`` into elements ``offs`` of slot [epoch % 2, RANK] of every other rank."""
    for r in tl.static_range(WORLD):
        if r != RANK:
            _push_to(x, offs, mask, data_ptr, data_deltas_ptr, epoch, region, r, RANK, WORLD)


@triton.jit
def _release_to(flags_ptr, flag_deltas_ptr, pid, epoch, dst, RANK: tl.constexpr, WORLD: tl.constexpr):
    """``epoch`` at flags[pid, RANK] of rank ``dst`` (another rank), release at system scope."""
    tl.atomic_xchg(flags_ptr + tl.load(flag_deltas_ptr + dst) + pid * WORLD + RANK, epoch, sem="release",
                   scope="sys")


@triton.jit
def _release(flags_ptr, flag_deltas_ptr, pid, epoch, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Step 2 (after a CTA barrier): ``epoch`` at flags[pid, RANK] of every other rank."""
    # NOTE: scalar atomics, one peer at a time (Triton 3.6's layout pass crashed on a vector of them in a loop)
    for r in tl.static_range(WORLD):
        if r != RANK:
            _release_to(flags_ptr, flag_deltas_ptr, pid, epoch, r, RANK, WORLD)


@triton.jit
def _acquire_from(flags_ptr, pid, epoch, src, WORLD: tl.constexpr):
    """Spin until rank ``src``'s flags[pid, src] here has reached ``epoch`` (acquire, system scope)."""
    seen = tl.atomic_add(flags_ptr + pid * WORLD + src, 0, sem="acquire", scope="sys")
    while seen < epoch:
        seen = tl.atomic_add(flags_ptr + pid * WORLD + src, 0, sem="acquire", scope="sys")


@triton.jit
def _acquire(flags_ptr, pid, epoch, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Step 3: spin until every other rank's flags[pid, r] here has reached ``epoch``."""
    for r in tl.static_range(WORLD):
        if r != RANK:
            _acquire_from(flags_ptr, pid, epoch, r, WORLD)


@triton.jit
def _sum(x, offs, mask, data_ptr, epoch, region, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Step 4 (after a CTA barrier): ranks 0, 1, ..., WORLD - 1 in that order, fp32, not rounded."""
    acc = tl.zeros(x.shape, dtype=tl.float32)
    for r in tl.static_range(WORLD):
        if r == RANK:
            acc += x.to(tl.float32)
        else:
            part = tl.load(data_ptr + ((epoch % 2) * WORLD + r) * region + offs, mask=mask, other=0.0,
                           cache_modifier=".cv")
            acc += part.to(tl.float32)
    return acc


@triton.jit
def _one_shot(x, offs, mask, data_ptr, flags_ptr, data_deltas_ptr, flag_deltas_ptr, pid, epoch, region,
              RANK: tl.constexpr, WORLD: tl.constexpr):
    """Steps 1-4 of the one-shot mode: the sum over ranks of ``x``, rounded once to its dtype."""
    _push(x, offs, mask, data_ptr, data_deltas_ptr, epoch, region, RANK, WORLD)
    tl.debug_barrier()  # every thread's stores issued before the release
    _release(flags_ptr, flag_deltas_ptr, pid, epoch, RANK, WORLD)
    _acquire(flags_ptr, pid, epoch, RANK, WORLD)
    tl.debug_barrier()  # the acquires before any thread reads the peers' parts
    return _sum(x, offs, mask, data_ptr, epoch, region, RANK, WORLD).to(x.dtype)


@triton.jit
def _two_shot(x, offs, mask, data_ptr, flags_ptr, data_deltas_ptr, flag_deltas_ptr, pid, epoch, region,
              RANK: tl.constexpr, WORLD: tl.constexpr):
    """The two-shot mode (module docstring): the same rounded sum, through program ``pid``'s owner."""
    owner = pid % WORLD  # NOTE: the same on every rank, a branch uniform over the program's threads
    if owner == RANK:
        _acquire(flags_ptr, pid, epoch, RANK, WORLD)  # every other rank's part has arrived here
        tl.debug_barrier()  # the acquires before any thread reads the parts
        total = _sum(x, offs, mask, data_ptr, epoch, region, RANK, WORLD).to(x.dtype)  # the one-shot mode's bits
        _push(total, offs, mask, data_ptr, data_deltas_ptr, epoch, region, RANK, WORLD)  # into slot index RANK
        tl.debug_barrier()  # every thread's stores of the sum issued before the release
        _release(flags_ptr, flag_deltas_ptr, pid, epoch, RANK, WORLD)
    else:
        _push_to(x, offs, mask, data_ptr, data_deltas_ptr, epoch, region, owner, RANK, WORLD)
        tl.debug_barrier()  # every thread's stores issued before the release
        _release_to(flags_ptr, flag_deltas_ptr, pid, epoch, owner, RANK, WORLD)
        _acquire_from(flags_ptr, pid, epoch, owner, WORLD)  # the owner's sum has arrived here
        tl.debug_barrier()  # the acquire before any thread reads the sum
        total = tl.load(data_ptr + ((epoch % 2) * WORLD + owner) * region + offs, mask=mask, other=0.0,
                        cache_modifier=".cv").to(x.dtype)
    return total


@triton.jit
def _all_reduce(x, offs, mask, data_ptr, flags_ptr, data_deltas_ptr, flag_deltas_ptr, pid, epoch, region,
                RANK: tl.constexpr, WORLD: tl.constexpr, TWO_SHOT: tl.constexpr):
    """Program ``pid``'s exchange of ``x`` (elements ``offs`` of the slots) in either mode: the sum
    over ranks in rank order, rounded once to x's dtype (the same bits in both)."""
    if TWO_SHOT:
        total = _two_shot(x, offs, mask, data_ptr, flags_ptr, data_deltas_ptr, flag_deltas_ptr, pid, epoch, region,
                          RANK, WORLD)
    else:
        total = _one_shot(x, offs, mask, data_ptr, flags_ptr, data_deltas_ptr, flag_deltas_ptr, pid, epoch, region,
                          RANK, WORLD)
    return total


@triton.jit
def _push_all_reduce_kernel(x_ptr, out_ptr, data_ptr, flags_ptr, epochs_ptr, data_deltas_ptr, flag_deltas_ptr,
                            n, region, RANK: tl.constexpr, WORLD: tl.constexpr, TWO_SHOT: tl.constexpr,
                            PDL: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if PDL:
        tl.extra.cuda.gdc_wait()  # x is the kernel before's output
        tl.extra.cuda.gdc_launch_dependents()
    epoch = tl.load(epochs_ptr + pid) + 1
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    total = _all_reduce(x, offs, mask, data_ptr, flags_ptr, data_deltas_ptr, flag_deltas_ptr, pid, epoch, region,
                        RANK, WORLD, TWO_SHOT)
    tl.store(out_ptr + offs, total, mask=mask)
    tl.store(epochs_ptr + pid, epoch)


@triton.jit
def _push_all_reduce_add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, normed_ptr, stream_ptr, data_ptr, flags_ptr,
                                         epochs_ptr, data_deltas_ptr, flag_deltas_ptr, n_cols, row_stride, region, eps,
                                         RANK: tl.constexpr, WORLD: tl.constexpr, TWO_SHOT: tl.constexpr,
                                         LIBDEVICE: tl.constexpr, PDL: tl.constexpr, BLOCK: tl.constexpr):
    """Program p owns row p: the exchange as above on elements [p * row_stride, p * row_stride +
    n_cols) of the slots, whatever the row's length, then ``add_rms_norm``'s arithmetic
    (``specdec.models.ops.triton_kernels``: rounded where it rounds)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    offs = row * n_cols + cols  # NOTE: int32: a message of at most MAX_PROGRAMS x BLOCK elements
    slot_offs = row * row_stride + cols
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    epoch = tl.load(epochs_ptr + row) + 1
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    # the all-reduce's result rounded once (in either mode: only it travels in the two-shot mode), plus
    # the residual, rounded again (all_reduce, then add_rms_norm)
    total = _all_reduce(x, slot_offs, mask, data_ptr, flags_ptr, data_deltas_ptr, flag_deltas_ptr, row, epoch,
                        region, RANK, WORLD, TWO_SHOT)
    r = tl.load(res_ptr + offs, mask=mask, other=0.0)
    stream = (total.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    tl.store(stream_ptr + offs, stream, mask=mask)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed = weighted_rms_norm(stream, w, n_cols, eps, True, LIBDEVICE)  # Llama's: rounded before the weight
    tl.store(normed_ptr + offs, normed.to(normed_ptr.dtype.element_ty), mask=mask)
    tl.store(epochs_ptr + row, epoch)


def programs(numel: int) -> int:
    return triton.cdiv(numel, BLOCK)


def row_block(n_cols: int) -> int:
    """Elements a program of the fused kernel spans: its row, to the next power of two."""
    return max(16, triton.next_power_of_2(n_cols))


def row_warps(n_cols: int) -> int:
    """Warps a program of the fused kernel runs: as ``add_rms_norm``'s, a warp per 512 columns (1-16)."""
    return min(max(row_block(n_cols) // 512, 1), 16)


def resident_programs(props) -> int:
    """How many programs of the plain kernel a GPU (``torch.cuda.get_device_properties``) holds at
    once, by threads: every SM's threads over a program's."""
    per_sm = getattr(props, "max_threads_per_multi_processor", 2048) // (NUM_WARPS * 32)
    return props.multi_processor_count * per_sm


def push_all_reduce(
    x: torch.Tensor,  # [n] contiguous, data's dtype
    data: torch.Tensor,  # [2 * world * region] this rank's symmetric data (its channel)
    flags: torch.Tensor,  # [max_programs * world] int64, this rank's symmetric flags (its channel)
    epochs: torch.Tensor,  # [max_programs] int64, local
    data_deltas: torch.Tensor,  # [world] int64: each rank's data address minus this rank's, in elements
    flag_deltas: torch.Tensor,  # [world] int64: the same for flags
    *,
    rank: int,
    world: int,
    region: int,  # elements a slot holds: the largest message
    two_shot: bool = False,  # through each block's owner (module docstring): the same bits, less pushed for W >= 3
) -> torch.Tensor:  # [n], the sum over ranks
    """Launch (no checks: ``PushAllReduce`` checks and dispatches)."""
    out = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return out
    _push_all_reduce_kernel[(programs(n),)](
        x, out, data, flags, epochs, data_deltas, flag_deltas, n, region, RANK=rank, WORLD=world, TWO_SHOT=two_shot,
        BLOCK=BLOCK, num_warps=NUM_WARPS, **pdl_kwargs(x.device))
    return out


def push_all_reduce_add_rms_norm(
    x: torch.Tensor,  # [T, H] contiguous, this rank's partial sums, data's dtype
    residual: torch.Tensor,  # [T, H] contiguous, x's dtype
    weight: torch.Tensor,  # [H] x's dtype
    eps: float,
    data: torch.Tensor, flags: torch.Tensor, epochs: torch.Tensor, data_deltas: torch.Tensor,
    flag_deltas: torch.Tensor, *, rank: int, world: int, region: int,  # as push_all_reduce's (another channel)
    row_stride: int,  # elements of a slot each row owns, in every call (H <= row_stride)
    two_shot: bool = False,  # as push_all_reduce's: each row through its owner
) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] normed, [T, H] stream = sum over ranks + residual)
    """``add_rms_norm(all_reduce(x), residual, weight, eps)`` in one kernel, a program per row
    (launch only: ``PushAllReduce.add_rms_norm`` checks)."""
    t, h = x.shape
    normed, stream = torch.empty_like(x), torch.empty_like(x)
    if t:
        _push_all_reduce_add_rms_norm_kernel[(t,)](
            x, residual, weight, normed, stream, data, flags, epochs, data_deltas, flag_deltas, h, row_stride, region,
            eps,
            RANK=rank, WORLD=world, TWO_SHOT=two_shot, LIBDEVICE=not INTERPRETED, BLOCK=row_block(h),
            num_warps=row_warps(h), enable_fp_fusion=False, **pdl_kwargs(x.device))
    return normed, stream


# True when triton was imported with TRITON_INTERPRET=1: the kernel then runs on CPU tensors only.
INTERPRETED = type(_push_all_reduce_kernel).__name__ == "InterpretedFunction"
