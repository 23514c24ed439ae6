"""KV-slot bookkeeping ops the EAGLE worker needs on the GPU without host syncs.

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

from specdec.kernels.common import check_tensor, matches
from specdec.kernels.dispatch import select_impl

_INDEX = (torch.int32, torch.int64)


def _check_rows(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, lens: dict[str, torch.Tensor]
) -> tuple[int, torch.device]:
    """req_to_token [max_reqs, max_context], req_pool_indices [bs] and each of ``lens`` [bs], int32
    or int64 on one device; returns (bs, device). Fast path first (see ``matches``), like every
    check below."""
    if (isinstance(req_to_token, torch.Tensor) and req_to_token.dim() == 2
            and isinstance(req_pool_indices, torch.Tensor) and req_pool_indices.dim() == 1):
        device, bs = req_to_token.device, req_pool_indices.shape[0]
        if matches(req_to_token, _INDEX, None, device) and matches(req_pool_indices, _INDEX, None, device):
            for t in lens.values():  # a loop: all(<generator>) costs 0.3 µs more
                if not matches(t, _INDEX, (bs,), device):
                    break
            else:
                return bs, device
    check_tensor("req_to_token", req_to_token, dtype=_INDEX, dim=2)
    device = req_to_token.device
    check_tensor("req_pool_indices", req_pool_indices, dtype=_INDEX, dim=1, device=device)
    bs = req_pool_indices.shape[0]
    for name, t in lens.items():
        check_tensor(name, t, dtype=_INDEX, shape=(bs,), device=device)
    return bs, device


def _check_flat(
    indptr: torch.Tensor, start_idx: torch.Tensor | None, indices: torch.Tensor, *, kind: str, bs: int,
    device: torch.device,
) -> None:
    """The gathers' ``<kind>_indptr`` [>= bs + 1] and flat ``<kind>_indices`` (kind "kv" or "page"),
    and kv_start_idx [bs] or None; int32 or int64."""
    if (matches(indptr, _INDEX, None, device) and indptr.dim() == 1 and indptr.shape[0] > bs
            and (start_idx is None or matches(start_idx, _INDEX, (bs,), device))
            and matches(indices, _INDEX, None, device) and indices.dim() == 1):
        return
    check_tensor(f"{kind}_indptr", indptr, dtype=_INDEX, dim=1, device=device)
    if indptr.shape[0] < bs + 1:
        raise ValueError(f"{kind}_indptr: expected at least bs + 1 = {bs + 1} entries, got {indptr.shape[0]}")
    if start_idx is not None:
        check_tensor("kv_start_idx", start_idx, dtype=_INDEX, shape=(bs,), device=device)
    check_tensor(f"{kind}_indices", indices, dtype=_INDEX, dim=1, device=device)


def _row(req_to_token: torch.Tensor, row: int, b: int) -> torch.Tensor:
    if not 0 <= row < req_to_token.shape[0]:
        raise ValueError(f"req_pool_indices: request {b} has row {row} outside [0, {req_to_token.shape[0]})")
    return req_to_token[row]


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
    _, device = _check_rows(req_to_token, req_pool_indices, lens)
    check_tensor("out_cache_loc", out_cache_loc, dtype=_INDEX, dim=1, device=device)
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
        table = _row(req_to_token, row, b)
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
        if (shape[0] == bs and shape[1] >= 1 and matches(accept_index, _INDEX, None, device)
                and matches(src_locs, torch.int64, shape, device) and matches(dst_locs, torch.int64, shape, device)
                and matches(positions, torch.int64, shape, device)):
            return
    check_tensor("accept_index", accept_index, dtype=_INDEX, dim=2, device=device)
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
    bs, device = _check_rows(req_to_token, req_pool_indices, {"seq_lens": seq_lens, "accept_length": accept_length})
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
    """Specification of ``compact_accepted_kv_locs`` (EAGLEWorker._commit_kv without host syncs).

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
        table = _row(req_to_token, row, b).tolist()
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
        if (0 <= step < max(num_steps - 1, 1) and matches(parent_branch, _INDEX, None, device)
                and matches(ancestors_in, torch.int64, None, device) and ancestors_in.dim() == 2
                and matches(ancestors_out, torch.int64, None, device) and ancestors_out.dim() == 2
                and matches(slots_out, torch.int64, (rows,), device)
                and ancestors_in.shape[0] == rows and ancestors_in.shape[1] >= step
                and ancestors_out.shape[0] == rows and ancestors_out.shape[1] >= step + 1):
            return device
    check_tensor("parent_branch", parent_branch, dtype=_INDEX, dim=2)
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


# --------------------------------------------------------------------------- create_kv_indices
def create_kv_indices(
    req_to_token: torch.Tensor,  # [max_reqs, max_context]
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs] prefix tokens to list per request
    kv_indptr: torch.Tensor,  # [>= bs + 1] request b's slots start at kv_indptr[b]
    kv_start_idx: torch.Tensor | None,  # [bs] first position to list, or None for 0
    kv_indices: torch.Tensor,  # [>= sum(seq_lens)], written
) -> None:
    """FlashInfer-style flattening of each request's prefix slots (see the ref)."""
    bs, device = _check_rows(req_to_token, req_pool_indices, {"seq_lens": seq_lens})
    _check_flat(kv_indptr, kv_start_idx, kv_indices, kind="kv", bs=bs, device=device)
    impl = select_impl("create_kv_indices", create_kv_indices_ref, device)
    impl(req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_start_idx, kv_indices)


def create_kv_indices_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
) -> None:
    """Specification of ``create_kv_indices`` (SGLang's create_flashinfer_kv_indices_triton).

    ``kv_indices[kv_indptr[b] + i] = req_to_token[row_b, start_b + i]`` for i < seq_len_b. Example:
    rows [1, 0], seq_lens [2, 3], kv_indptr [0, 2, 5], start None::

        kv_indices = [r2t[1, 0], r2t[1, 1], r2t[0, 0], r2t[0, 1], r2t[0, 2]]
    """
    _gather_ref(req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_start_idx, kv_indices, page_size=1)


def create_kv_page_indices(
    req_to_token: torch.Tensor,  # [max_reqs, max_context]
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs]
    page_indptr: torch.Tensor,  # [>= bs + 1] request b's pages start at page_indptr[b]
    page_indices: torch.Tensor,  # [>= sum(ceil(seq_len / page_size))], written
    *,
    page_size: int,
) -> None:
    """Each request's page table, FlashInfer's paged layout (see the ref)."""
    bs, device = _check_rows(req_to_token, req_pool_indices, {"seq_lens": seq_lens})
    _check_flat(page_indptr, None, page_indices, kind="page", bs=bs, device=device)
    if page_size < 1:
        raise ValueError(f"page_size: expected >= 1, got {page_size}")
    impl = select_impl("create_kv_page_indices", create_kv_page_indices_ref, device)
    impl(req_to_token, req_pool_indices, seq_lens, page_indptr, page_indices, page_size=int(page_size))


def create_kv_page_indices_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_indptr: torch.Tensor,
    page_indices: torch.Tensor,
    *,
    page_size: int,
) -> None:
    """Specification of ``create_kv_page_indices``.

    ``page_indices[page_indptr[b] + i] = req_to_token[row_b, i * page_size] // page_size`` for
    i < ceil(seq_len_b / page_size): position i*ps is the first of the request's i-th page, and
    PagedKVMemory keeps a page's slots consecutive. Example, page_size 4, row slots
    [28 29 30 31 | 8 9 10 11 | 20], seq_len 9 -> pages [7, 2, 5].
    """
    _gather_ref(req_to_token, req_pool_indices, seq_lens, page_indptr, None, page_indices, page_size=page_size)


def create_kv_layout(
    req_to_token: torch.Tensor,  # [max_reqs, max_context]
    req_pool_indices: torch.Tensor,  # [bs]
    prefix_lens: torch.Tensor,  # [bs] prefix tokens of each request
    own: torch.Tensor,  # [bs * branches, width] each attention sequence's own slots, after its prefix (rows may be strided)
    kv_indptr: torch.Tensor,  # [bs * branches + 1], written
    kv_indices: torch.Tensor,  # [>= sum over sequences of prefix + width], written
) -> None:
    """Every attention sequence's KV list and offsets in one launch (see the ref): the static
    (CUDA-graph) layout of a verify, a draft extend or a draft decode step."""
    bs, device = _check_rows(req_to_token, req_pool_indices, {"prefix_lens": prefix_lens})
    if not (isinstance(own, torch.Tensor) and own.dim() == 2 and own.dtype in _INDEX and own.device == device
            and (own.shape[1] <= 1 or own.stride(1) == 1)):  # NOTE: rows may be strided (a column slice)
        raise ValueError(f"own: expected a 2-D int32 / int64 tensor on {device} with unit stride along its rows, got "
                         + (f"{own.dtype} {tuple(own.shape)} strides {own.stride()} on {own.device}"
                            if isinstance(own, torch.Tensor) else type(own).__name__))
    if (bs == 0) != (own.shape[0] == 0) or (bs and own.shape[0] % bs):
        raise ValueError(f"own: expected a multiple of bs = {bs} rows (branches per request), got {own.shape[0]}")
    check_tensor("kv_indptr", kv_indptr, dtype=_INDEX, shape=(own.shape[0] + 1,), device=device)
    check_tensor("kv_indices", kv_indices, dtype=_INDEX, dim=1, device=device)
    impl = select_impl("create_kv_layout", create_kv_layout_ref, device)
    impl(req_to_token, req_pool_indices, prefix_lens, own, kv_indptr, kv_indices)


def create_kv_layout_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    own: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> None:
    """Specification of ``create_kv_layout``.

    Sequence ``s = b * branches + j`` (``branches = own.shape[0] // bs``) lists request b's prefix,
    ``req_to_token[row_b, :prefix_b]``, then ``own[s]``; sequences are packed in order and
    ``kv_indptr`` is their offsets. Example: rows [1, 0], prefix_lens [2, 1], own [[7], [8], [9], [5]]
    (2 branches, width 1)::

        kv_indptr  = [0, 3, 6, 8, 10]
        kv_indices = [r2t[1,0] r2t[1,1] 7 | r2t[1,0] r2t[1,1] 8 | r2t[0,0] 9 | r2t[0,0] 5]
    """
    num_seqs, width = own.shape
    branches = num_seqs // max(req_pool_indices.shape[0], 1)
    rows, prefix = req_pool_indices.repeat_interleave(branches), prefix_lens.repeat_interleave(branches)
    kv_indptr[0] = 0
    kv_indptr[1:] = torch.cumsum(prefix + width, 0)
    create_kv_indices_ref(req_to_token, rows, prefix, kv_indptr, None, kv_indices)
    own_pos = kv_indptr[:-1, None].long() + prefix[:, None] + torch.arange(width, device=own.device)  # [num_seqs, width]
    kv_indices.scatter_(0, own_pos.flatten(), own.flatten().to(kv_indices.dtype))


def _gather_ref(req_to_token, req_pool_indices, seq_lens, indptr, start_idx, out, *, page_size: int) -> None:
    rows, lens, offs = req_pool_indices.tolist(), seq_lens.tolist(), indptr.tolist()
    starts = start_idx.tolist() if start_idx is not None else [0] * len(rows)
    for b, (row, length, start) in enumerate(zip(rows, lens, starts)):
        table = _row(req_to_token, row, b)
        count = -(-length // page_size)
        if not (0 <= start and 0 <= length and start + length <= table.shape[0]):
            raise ValueError(f"seq_lens/kv_start_idx: request {b} lists positions [{start}, {start + length}) "
                             f"outside [0, {table.shape[0]})")
        if not 0 <= offs[b] <= offs[b] + count <= out.numel():
            raise ValueError(f"indptr: request {b} writes [{offs[b]}, {offs[b] + count}) of {out.numel()} entries")
        firsts = table[start : start + length : page_size]
        out[offs[b] : offs[b] + count] = (firsts // page_size).to(out.dtype)
