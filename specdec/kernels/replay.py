"""The synthetic benchmark's replay of recorded draft trees (not sgl_kernel ops; ``specdec.eagle.replay``
holds the trace and what these steps mean).

A trace row is what a real draft head did at one verify step. The tables these ops read, T rows,
S recorded depths, top-K children:

    probs      [T, S, K + 1, K] fp32   probs[t, d, s]: the top-K children's probabilities of frontier
                                       slot s at depth d (d = 0: the root, in slot 0); slot K is the
                                       sentinel for a node the recording never expanded (all 0)
    next_slot  [T, S, K + 1, K] int64  the slot at depth d + 1 of child c of slot s (K: not recorded)
    path_ranks [T, S] int64            the rank of the target's next token among its path node's
                                       children at each depth (-1: none of the K)
    row_table  [H] int64               the trace row of each hash value (H a power of two: the
                                       hash's low bits index it)

On CUDA each step is one launch: ``replay_rows`` picks each request's row, ``replay_root`` reads the
root's children and the depth-1 frontier's slots and children, ``replay_advance`` follows each later
frontier into the trace, and ``replay_accept_cdf`` gives the verify each row's recorded path. Each
reference is a few torch gathers.
"""

from __future__ import annotations

import torch

from specdec.kernels.common import check_tensor, matches
from specdec.kernels.dispatch import select_impl
from specdec.kernels.position_hash import hash_key


def _check_tables(probs: torch.Tensor, next_slot: torch.Tensor, device: torch.device) -> None:
    if matches(probs, torch.float32, None, device) and matches(next_slot, torch.int64, tuple(probs.shape), device):
        return
    check_tensor("probs", probs, dtype=torch.float32, dim=4, device=device)
    check_tensor("next_slot", next_slot, dtype=torch.int64, shape=tuple(probs.shape), device=device)


def replay_rows(
    keys: torch.Tensor,  # [bs] int64 each request's key (the synthetic engine's: its verify steps so far)
    row_table: torch.Tensor,  # [H] int64 trace rows, H a power of two
    rows: torch.Tensor,  # [bs] int64, written
    *,
    seed: int,
) -> None:
    """The trace row each request replays (see the ref)."""
    device = _device_of("keys", keys)
    if not (matches(keys, torch.int64, None, device) and keys.dim() == 1
            and matches(row_table, torch.int64, None, device) and matches(rows, torch.int64, tuple(keys.shape),
                                                                          device)):
        check_tensor("keys", keys, dtype=torch.int64, dim=1)
        check_tensor("row_table", row_table, dtype=torch.int64, dim=1, device=device)
        check_tensor("rows", rows, dtype=torch.int64, shape=tuple(keys.shape), device=device)
    size = row_table.shape[0]
    if size < 1 or size & (size - 1):
        raise ValueError(f"row_table: expected a power-of-two length, got {size}")
    select_impl("replay_rows", replay_rows_ref, device)(keys, row_table, rows, seed=int(seed))


def replay_rows_ref(keys: torch.Tensor, row_table: torch.Tensor, rows: torch.Tensor, *, seed: int) -> None:
    """Specification of ``replay_rows``: request b replays ``row_table[h]``, h the low bits of the
    ``hash_key`` of (seed, b, keys[b]): the same (seed, batch row, key) always replays the same row."""
    rows.copy_(row_table[hash_key(keys, seed) & (row_table.shape[0] - 1)])


def replay_root(
    rows: torch.Tensor,  # [bs] int64 trace rows
    probs: torch.Tensor,  # [T, S, K + 1, K] fp32
    next_slot: torch.Tensor,  # [T, S, K + 1, K] int64
    root_p: torch.Tensor,  # [bs, k] fp32, written
    slots: torch.Tensor,  # [bs, k] int64, written
    child_p: torch.Tensor | None,  # [bs * k, k] fp32, written (None: the draft takes one step)
) -> None:
    """The root's top-k children and the depth-1 frontier's slots and children (see the ref)."""
    device = _device_of("rows", rows)
    _check_tables(probs, next_slot, device)
    bs, k = rows.shape[0], _last_dim(root_p)
    if not (matches(rows, torch.int64, (bs,), device) and matches(root_p, torch.float32, (bs, k), device)
            and matches(slots, torch.int64, (bs, k), device)
            and (child_p is None or matches(child_p, torch.float32, (bs * k, k), device))):
        check_tensor("rows", rows, dtype=torch.int64, dim=1, device=device)
        check_tensor("root_p", root_p, dtype=torch.float32, dim=2, device=device)
        check_tensor("slots", slots, dtype=torch.int64, shape=tuple(root_p.shape), device=device)
        if child_p is not None:
            check_tensor("child_p", child_p, dtype=torch.float32, shape=(bs * k, k), device=device)
    _check_k(k, probs, child_p is not None)
    select_impl("replay_root", replay_root_ref, device)(rows, probs, next_slot, root_p, slots, child_p)


def replay_root_ref(rows, probs, next_slot, root_p, slots, child_p) -> None:
    """Specification of ``replay_root``: root_p[b] = probs[rows[b], 0, 0, :k], slots[b] =
    next_slot[rows[b], 0, 0, :k]; child_p[b * k + j] = probs[rows[b], 1, slots[b, j], :k]."""
    k = root_p.shape[1]
    root_p.copy_(probs[rows, 0, 0, :k])
    slots.copy_(next_slot[rows, 0, 0, :k])
    if child_p is not None:
        child_p.copy_(probs[rows[:, None], 1, slots, :k].reshape(-1, k))


def replay_advance(
    rows: torch.Tensor,  # [bs] int64 trace rows
    slots: torch.Tensor,  # [bs, k] int64 the depth-d frontier's recorded slots
    parents: torch.Tensor,  # [bs, k] int64 the new frontier, as select_frontier names it
    probs: torch.Tensor,  # [T, S, K + 1, K] fp32
    next_slot: torch.Tensor,  # [T, S, K + 1, K] int64
    new_slots: torch.Tensor,  # [bs, k] int64, written: the depth d + 1 frontier's slots (not ``slots``)
    child_p: torch.Tensor,  # [bs * k, k] fp32, written: their children's probabilities
    *,
    depth: int,
    parent_offset: int,
) -> None:
    """Follow the draft's new frontier into the trace and read its children (see the ref)."""
    device = _device_of("rows", rows)
    _check_tables(probs, next_slot, device)
    bs, k = rows.shape[0], _last_dim(slots)
    if not (matches(rows, torch.int64, (bs,), device) and all(
            matches(t, torch.int64, (bs, k), device) for t in (slots, parents, new_slots))
            and matches(child_p, torch.float32, (bs * k, k), device)):
        check_tensor("rows", rows, dtype=torch.int64, dim=1, device=device)
        check_tensor("slots", slots, dtype=torch.int64, dim=2, device=device)
        for name, t in (("parents", parents), ("new_slots", new_slots)):
            check_tensor(name, t, dtype=torch.int64, shape=(bs, k), device=device)
        check_tensor("child_p", child_p, dtype=torch.float32, shape=(bs * k, k), device=device)
    if new_slots.data_ptr() == slots.data_ptr():
        raise ValueError("new_slots: must not alias slots")
    if not 1 <= depth < probs.shape[1] - 1:
        raise ValueError(f"depth: expected 1 <= depth < {probs.shape[1] - 1} (a recorded depth with children), "
                         f"got {depth}")
    _check_k(k, probs, True)
    select_impl("replay_advance", replay_advance_ref, device)(rows, slots, parents, probs, next_slot, new_slots,
                                                             child_p, depth=int(depth),
                                                             parent_offset=int(parent_offset))


def replay_advance_ref(rows, slots, parents, probs, next_slot, new_slots, child_p, *, depth: int,
                       parent_offset: int) -> None:
    """Specification of ``replay_advance``. New frontier node j is child c of branch p of the depth-d
    frontier, where parents[b, j] - parent_offset = p * k + c (``select_frontier``'s score index);
    its slot is next_slot[rows[b], d, slots[b, p], c] and its children's probabilities
    probs[rows[b], d + 1, that slot, :k]. Example, k = 2: slots [[0, 2]], parents - offset [[1, 2]]
    (branch 0's child 1, branch 1's child 0) -> next_slot[row, d, 0, 1] and next_slot[row, d, 2, 0],
    the latter K, the sentinel: slot 2 was never expanded."""
    k = slots.shape[1]
    key = parents - parent_offset  # [bs, k]
    row = rows[:, None]
    new_slots.copy_(next_slot[row, depth, slots.gather(1, key // k), key % k])
    child_p.copy_(probs[row, depth + 1, new_slots, :k].reshape(-1, k))


def replay_accept_cdf(
    rows: torch.Tensor,  # [bs] int64 trace rows
    path_ranks: torch.Tensor,  # [T, S] int64
    cdf: torch.Tensor,  # [bs, S' + 1, 1, k] fp32, written (S' <= S)
) -> None:
    """Each request's 0/1 cdf of the child rank each depth's node accepts (see the ref)."""
    device = _device_of("rows", rows)
    bs = rows.shape[0]
    if not (matches(rows, torch.int64, (bs,), device) and matches(path_ranks, torch.int64, None, device)
            and matches(cdf, torch.float32, None, device) and cdf.dim() == 4 and cdf.shape[:1] == (bs,)):
        check_tensor("rows", rows, dtype=torch.int64, dim=1, device=device)
        check_tensor("path_ranks", path_ranks, dtype=torch.int64, dim=2, device=device)
        check_tensor("cdf", cdf, dtype=torch.float32, dim=4, device=device)
    if cdf.shape[0] != bs or cdf.shape[2] != 1 or not 1 <= cdf.shape[1] <= path_ranks.shape[1] + 1:
        raise ValueError(f"cdf: expected [bs = {bs}, S' + 1 <= {path_ranks.shape[1] + 1}, 1, k], "
                         f"got {tuple(cdf.shape)}")
    select_impl("replay_accept_cdf", replay_accept_cdf_ref, device)(rows, path_ranks, cdf)


def replay_accept_cdf_ref(rows: torch.Tensor, path_ranks: torch.Tensor, cdf: torch.Tensor) -> None:
    """Specification of ``replay_accept_cdf``: cdf[b, d, 0, r] = 1 where r >= path_ranks[rows[b], d] >= 0,
    else 0; depth S' (the leaves) is all 0. A step at the recorded rank: ``simulate_target_predict``
    then draws that rank whatever its uniform, and no child where the rank is -1 or past k."""
    depths, k = cdf.shape[1], cdf.shape[3]
    ranks = path_ranks[rows, : depths - 1]  # [bs, S']
    leaves = torch.full((rows.shape[0], 1), -1, dtype=ranks.dtype, device=rows.device)
    ranks = torch.cat([ranks, leaves], 1)[..., None]  # [bs, S' + 1, 1]
    r = torch.arange(k, device=rows.device)
    cdf.copy_(((ranks >= 0) & (r >= ranks)).float()[:, :, None])


def _device_of(name: str, t: object) -> torch.device:
    """The device of a [bs] tensor argument (a ValueError naming it for anything else)."""
    if not (isinstance(t, torch.Tensor) and t.dim() == 1):
        check_tensor(name, t, dtype=torch.int64, dim=1)
    return t.device


def _last_dim(t: object) -> int:
    """k of a [bs, k] tensor argument; -1 for anything else (its check names it)."""
    return t.shape[1] if isinstance(t, torch.Tensor) and t.dim() == 2 else -1


def _check_k(k: int, probs: torch.Tensor, children: bool) -> None:
    if not 1 <= k <= probs.shape[3]:
        raise ValueError(f"k: expected 1 <= k <= the trace's top-{probs.shape[3]}, got {k}")
    if probs.shape[2] != probs.shape[3] + 1:
        raise ValueError(f"probs: expected [T, S, K + 1, K], got {tuple(probs.shape)}")
    if children and probs.shape[1] < 2:
        raise ValueError("child_p: the trace records one depth, no children below it")
