"""KV-slot bookkeeping ops the EAGLE worker needs on the GPU without host syncs: slots written
into request rows, a verify's accepted nodes compacted, the draft's scratch slots. The KV lists
attention reads from those rows are ``kv_indices``.

Each public op checks its inputs and dispatches like the tree ops (Triton on CUDA, or on CPU under
TRITON_INTERPRET=1; the reference otherwise); ``*_ref`` is the specification (host loops).

Glossary: a request *row* is its row of ``req_to_token`` ([max_reqs, max_context] KV slot of each
position); bs = requests; N = num_draft_tokens; num_spec = depth + 1 = accept_index.shape[1];
K = topk; S = num_steps; page_size = slots per KV page. Errors in the references raise
ValueError naming the argument; the Triton versions raise the same on CPU and, on CUDA, keep
their error flag on the device (see ``specdec.kernels.triton``).
"""

from __future__ import annotations

import torch

from specdec.kernels.common import INDEX_DTYPES, check_rows, check_tensor, matches, table_row
from specdec.kernels.dispatch import select_impl

# --------------------------------------------------------------------------- assign_req_to_token
def assign_req_to_token(
    req_to_token: torch.Tensor,  # [max_reqs, max_context] int32, written
    req_pool_indices: torch.Tensor,  # [bs]
    start_offsets: torch.Tensor,  # [bs]
    end_offsets: torch.Tensor,  # [bs]
    out_cache_loc: torch.Tensor,  # [sum(end - start)] slots, packed request by request
) -> None:
    """Write each request's slots into its row over positions [start, end) (see the ref)."""
    lens = {"start_offsets": start_offsets, "end_offsets": end_offsets}
    _, device = check_rows(req_to_token, req_pool_indices, lens)
    check_tensor("out_cache_loc", out_cache_loc, dtype=INDEX_DTYPES, dim=1, device=device)
    impl = select_impl("assign_req_to_token", assign_req_to_token_ref, device)
    impl(req_to_token, req_pool_indices, start_offsets, end_offsets, out_cache_loc)


def assign_req_to_token_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    start_offsets: torch.Tensor,
    end_offsets: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Specification of ``assign_req_to_token`` (SGLang's assign_req_to_token_pool).

    Example: rows [2, 0], start [3, 0], end [5, 1], out_cache_loc [40, 41, 7]::

        req_to_token[2, 3:5] = [40, 41]      req_to_token[0, 0:1] = [7]
    """
    offset = 0
    rows, starts, ends = req_pool_indices.tolist(), start_offsets.tolist(), end_offsets.tolist()
    for b, (row, start, end) in enumerate(zip(rows, starts, ends)):
        table = table_row(req_to_token, row, b)
        if not 0 <= start <= end <= table.shape[0]:
            raise ValueError(f"start_offsets/end_offsets: request {b} = [{start}, {end}) is outside [0, {table.shape[0]}]")
        if offset + end - start > out_cache_loc.numel():
            raise ValueError(f"out_cache_loc: request {b} needs entries up to {offset + end - start}, "
                             f"got {out_cache_loc.numel()}")
        table[start:end] = out_cache_loc[offset : offset + end - start].to(req_to_token.dtype)
        offset += end - start


# --------------------------------------------------------------------------- compact_accepted_kv_locs
def _check_accepted(
    accept_index: torch.Tensor,
    src_locs: torch.Tensor,
    dst_locs: torch.Tensor,
    positions: torch.Tensor,
    *,
    bs: int,
    device: torch.device,
) -> None:
    """accept_index [bs, num_spec >= 1] int32 or int64, and the int64 outputs of its shape."""
    if isinstance(accept_index, torch.Tensor) and accept_index.dim() == 2:
        shape = accept_index.shape
        if (shape[0] == bs and shape[1] >= 1 and matches(accept_index, INDEX_DTYPES, None, device)
                and matches(src_locs, torch.int64, shape, device) and matches(dst_locs, torch.int64, shape, device)
                and matches(positions, torch.int64, shape, device)):
            return
    check_tensor("accept_index", accept_index, dtype=INDEX_DTYPES, dim=2, device=device)
    shape = tuple(accept_index.shape)  # [bs, num_spec]
    if shape[0] != bs or shape[1] < 1:
        raise ValueError(f"accept_index: expected shape ({bs}, num_spec >= 1), got {shape}")
    for name, t in (("src_locs", src_locs), ("dst_locs", dst_locs), ("positions", positions)):
        check_tensor(name, t, dtype=torch.int64, shape=shape, device=device)


def compact_accepted_kv_locs(
    req_to_token: torch.Tensor,  # [max_reqs, max_context]
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs] tokens in KV before the verify forward
    accept_index: torch.Tensor,  # [bs, num_spec] int32 global node index b*N + t, root first
    accept_length: torch.Tensor,  # [bs] accepted draft tokens k
    src_locs: torch.Tensor,  # [bs, num_spec] int64, written
    dst_locs: torch.Tensor,  # [bs, num_spec] int64, written
    positions: torch.Tensor,  # [bs, num_spec] int64, written
    *,
    num_draft_tokens: int,
) -> None:
    """Slots to move the accepted nodes' KV from and to, and their positions (see the ref)."""
    bs, device = check_rows(req_to_token, req_pool_indices, {"seq_lens": seq_lens, "accept_length": accept_length})
    _check_accepted(accept_index, src_locs, dst_locs, positions, bs=bs, device=device)
    if num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens: expected >= 1, got {num_draft_tokens}")
    impl = select_impl("compact_accepted_kv_locs", compact_accepted_kv_locs_ref, device)
    impl(req_to_token, req_pool_indices, seq_lens, accept_index, accept_length, src_locs, dst_locs, positions,
         num_draft_tokens=int(num_draft_tokens))


def compact_accepted_kv_locs_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    accept_index: torch.Tensor,
    accept_length: torch.Tensor,
    src_locs: torch.Tensor,
    dst_locs: torch.Tensor,
    positions: torch.Tensor,
    *,
    num_draft_tokens: int,
) -> None:
    """Specification of ``compact_accepted_kv_locs`` (``verify_step.commit_accepted_kv`` without host syncs).

    Node t of request b was verified at position seq_len + t; its i-th accepted node (root = 0th)
    belongs at seq_len + i. For i <= k: src = row[seq_len + t_i], dst = row[seq_len + i],
    position = seq_len + i. Padding (i > k): src = dst = row[seq_len] (a self-copy, so a fixed-shape
    ``KVCache.move(src, dst)`` skips it), position = -1. Example, N = 4,
    seq_len 10, row[10:14] = [50, 51, 52, 53], accept_index [0, 2, -1] (k = 1)::

        src [50, 52, 50]   dst [50, 51, 50]   positions [10, 11, -1]
    """
    n, num_spec = num_draft_tokens, accept_index.shape[1]
    rows, lens, ks = req_pool_indices.tolist(), seq_lens.tolist(), accept_length.tolist()
    accepted = accept_index.tolist()
    for b, (row, base, k) in enumerate(zip(rows, lens, ks)):
        table = table_row(req_to_token, row, b).tolist()
        if not 0 <= base <= base + n <= len(table):
            raise ValueError(f"seq_lens: request {b} has seq_len {base}; seq_len + N must be within [0, {len(table)}]")
        if not 0 <= k < num_spec:
            raise ValueError(f"accept_length: request {b} has {k} accepted, expected [0, {num_spec})")
        src, dst, pos = [table[base]] * num_spec, [table[base]] * num_spec, [-1] * num_spec
        for i in range(k + 1):
            node = accepted[b][i] - b * n
            if not 0 <= node < n:
                raise ValueError(f"accept_index: request {b} entry {i} = {accepted[b][i]} is not one of its nodes")
            src[i], dst[i], pos[i] = table[base + node], table[base + i], base + i
        src_locs[b] = torch.tensor(src)
        dst_locs[b] = torch.tensor(dst)
        positions[b] = torch.tensor(pos)


# --------------------------------------------------------------------------- move_kv_slots
MAX_MOVE_WIDTH = 256  # slots one group may move (a verify's accepted path is num_steps + 1)


def move_kv_slots(
    k_cache: torch.Tensor,  # [num_layers, num_slots, num_kv_heads, head_dim], written
    v_cache: torch.Tensor,  # [num_layers, num_slots, num_kv_heads, head_dim], written
    src_locs: torch.Tensor,  # [groups, width] int64 slots to read
    dst_locs: torch.Tensor,  # [groups, width] int64 slots to write
) -> None:
    """Copy every layer's K and V from ``src_locs`` to ``dst_locs``, group by group (see the ref):
    the commit of a tree verify, one group per request, in one launch."""
    device = k_cache.device if isinstance(k_cache, torch.Tensor) else None
    if not (isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4 and k_cache.is_contiguous()
            and matches(v_cache, k_cache.dtype, tuple(k_cache.shape), device)
            and matches(src_locs, torch.int64, None, device) and src_locs.dim() == 2
            and matches(dst_locs, torch.int64, tuple(src_locs.shape), device)):
        check_tensor("k_cache", k_cache, dim=4)
        check_tensor("v_cache", v_cache, dtype=k_cache.dtype, shape=tuple(k_cache.shape), device=device)
        check_tensor("src_locs", src_locs, dtype=torch.int64, dim=2, device=device)
        check_tensor("dst_locs", dst_locs, dtype=torch.int64, shape=tuple(src_locs.shape), device=device)
    if src_locs.shape[1] > MAX_MOVE_WIDTH:
        raise ValueError(f"src_locs: a group moves at most {MAX_MOVE_WIDTH} slots, got {src_locs.shape[1]}")
    impl = select_impl("move_kv_slots", move_kv_slots_ref, device)
    impl(k_cache, v_cache, src_locs, dst_locs)


def move_kv_slots_ref(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    src_locs: torch.Tensor,
    dst_locs: torch.Tensor,
) -> None:
    """Specification of ``move_kv_slots``.

    For every layer, slot ``dst_locs[g, i]`` of K and of V gets what slot ``src_locs[g, i]`` held
    before the call. Within a group every source is read before any destination is written, so a
    group may move slots onto each other (compacting accepted tree nodes towards the prefix); a
    group's destinations are distinct and different groups touch disjoint slots. An entry with
    src == dst is a no-op (a verify's root and padding). Example, one layer, slots holding
    [a, b, c, d], src [[0, 2, 3]], dst [[0, 1, 2]]: the slots then hold [a, c, d, d].
    """
    for g, (src, dst) in enumerate(zip(src_locs.tolist(), dst_locs.tolist())):
        for name, slots in (("src_locs", src), ("dst_locs", dst)):
            if any(not 0 <= s < k_cache.shape[1] for s in slots):
                raise ValueError(f"{name}: group {g} has a slot outside [0, {k_cache.shape[1]})")
        moves = [(s, d) for s, d in zip(src, dst) if s != d]
        if moves:
            src_g, dst_g = (torch.tensor(col, device=k_cache.device) for col in zip(*moves))
            for buf in (k_cache, v_cache):
                buf[:, dst_g] = buf[:, src_g]  # the gather reads every source first


# --------------------------------------------------------------------------- draft_scratch_slots
def _check_scratch(
    parent_branch: torch.Tensor,
    ancestors_in: torch.Tensor,
    ancestors_out: torch.Tensor,
    slots_out: torch.Tensor,
    *,
    num_steps: int,
    step: int,
) -> torch.device:
    """``draft_scratch_slots``' inputs (shapes at the op); returns the device."""
    if isinstance(parent_branch, torch.Tensor) and parent_branch.dim() == 2:
        device, rows = parent_branch.device, parent_branch.numel()  # bs * K
        if (0 <= step < max(num_steps - 1, 1) and matches(parent_branch, INDEX_DTYPES, None, device)
                and matches(ancestors_in, torch.int64, None, device) and ancestors_in.dim() == 2
                and matches(ancestors_out, torch.int64, None, device) and ancestors_out.dim() == 2
                and matches(slots_out, torch.int64, (rows,), device)
                and ancestors_in.shape[0] == rows and ancestors_in.shape[1] >= step
                and ancestors_out.shape[0] == rows and ancestors_out.shape[1] >= step + 1):
            return device
    check_tensor("parent_branch", parent_branch, dtype=INDEX_DTYPES, dim=2)
    device = parent_branch.device
    bs, k = parent_branch.shape
    if not 0 <= step < max(num_steps - 1, 1):
        raise ValueError(f"step: expected 0 <= step < num_steps - 1 = {num_steps - 1}, got {step}")
    check_tensor("ancestors_in", ancestors_in, dtype=torch.int64, dim=2, device=device)
    check_tensor("ancestors_out", ancestors_out, dtype=torch.int64, dim=2, device=device)
    check_tensor("slots_out", slots_out, dtype=torch.int64, shape=(bs * k,), device=device)
    if ancestors_in.shape[0] != bs * k or ancestors_in.shape[1] < step:
        raise ValueError(f"ancestors_in: expected shape ({bs * k}, >= {step}), got {tuple(ancestors_in.shape)}")
    if ancestors_out.shape[0] != bs * k or ancestors_out.shape[1] < step + 1:
        raise ValueError(f"ancestors_out: expected shape ({bs * k}, >= {step + 1}), got {tuple(ancestors_out.shape)}")
    return device


def draft_scratch_slots(
    parent_branch: torch.Tensor,  # [bs, K] frontier branch (0..K-1) each new node extends
    ancestors_in: torch.Tensor,  # [bs*K, >= step] int64 scratch slots of the previous frontier
    ancestors_out: torch.Tensor,  # [bs*K, >= step + 1] int64, columns [0, step] written
    slots_out: torch.Tensor,  # [bs*K] int64, written
    *,
    scratch_base: int,
    num_steps: int,
    step: int,
) -> None:
    """This draft step's scratch slots and every new node's ancestor slots (see the ref).

    NOTE: ancestors_in and ancestors_out must not overlap (rows are permuted).
    """
    device = _check_scratch(parent_branch, ancestors_in, ancestors_out, slots_out, num_steps=num_steps, step=step)
    impl = select_impl("draft_scratch_slots", draft_scratch_slots_ref, device)
    impl(parent_branch, ancestors_in, ancestors_out, slots_out, scratch_base=int(scratch_base),
         num_steps=int(num_steps), step=int(step))


def draft_scratch_slots_ref(
    parent_branch: torch.Tensor,
    ancestors_in: torch.Tensor,
    ancestors_out: torch.Tensor,
    slots_out: torch.Tensor,
    *,
    scratch_base: int,
    num_steps: int,
    step: int,
) -> None:
    """Specification of ``draft_scratch_slots`` (DraftRunner.expand's per-step slot bookkeeping).

    Node j of request b at this step gets scratch slot ``scratch_base + (b*(S-1) + step)*K + j`` and
    sees its parent branch's ancestors plus itself. Example, K = 2, S = 3, step 1, bs = 1,
    scratch_base 100, ancestors_in [[100], [101]], parent_branch [[1, 1]]::

        slots_out [102, 103]     ancestors_out [[101, 102], [101, 103]]
    """
    bs, k = parent_branch.shape
    branches = parent_branch.tolist()
    for b in range(bs):
        for j in range(k):
            if not 0 <= branches[b][j] < k:
                raise ValueError(f"parent_branch: request {b} node {j} has branch {branches[b][j]} outside [0, {k})")
            r, parent_row = b * k + j, b * k + branches[b][j]
            slot = scratch_base + (b * (num_steps - 1) + step) * k + j
            slots_out[r] = slot
            ancestors_out[r, :step] = ancestors_in[parent_row, :step]
            ancestors_out[r, step] = slot
