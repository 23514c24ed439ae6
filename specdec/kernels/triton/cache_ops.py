"""Triton versions of ``specdec.kernels.cache_ops`` and ``specdec.kernels.kv_indices``: one program
per request (per new node for ``draft_scratch_slots``), BLOCK positions per iteration, every access
masked to its tensor.

Error codes (``error_flag[b]``, 0 = fine): 1 = row outside req_to_token, 2 = positions outside the
row (or a bad accept_length / parent_branch), 3 = output or packed input range too small,
4 = an accept_index entry that is not one of the request's nodes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton._common import custom_op, error_flag_for, next_pow2, raise_on_cpu

_ERRORS = {
    1: "req_pool_indices: request {b} has a row outside req_to_token",
    2: "request {b}: positions (or lengths) outside their range",
    3: "request {b}: output / packed input too small",
    4: "accept_index: request {b} has an entry that is not one of its nodes",
}
_BLOCK = 128


def _check(flag: torch.Tensor, op: str) -> None:
    raise_on_cpu(flag, lambda b, code: f"{op}: " + _ERRORS[code].format(b=b))


# --------------------------------------------------------------------------- assign_req_to_token
@triton.jit(do_not_specialize=["loc_numel"])
def _assign_kernel(table_ptr, rows_ptr, start_ptr, end_ptr, loc_ptr, error_ptr, max_reqs, ctx, loc_numel,
                   BLOCK: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(rows_ptr + b).to(tl.int64)
    start = tl.load(start_ptr + b).to(tl.int64)
    end = tl.load(end_ptr + b).to(tl.int64)
    offset = row * 0  # packed offset: sum of the earlier requests' lengths
    for i0 in range(0, b, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        lo = tl.load(start_ptr + i, mask=i < b, other=0).to(tl.int64)
        hi = tl.load(end_ptr + i, mask=i < b, other=0).to(tl.int64)
        offset += tl.sum(tl.maximum(hi - lo, 0))
    err = tl.where((row < 0) | (row >= max_reqs), 1,
                   tl.where((start < 0) | (end < start) | (end > ctx), 2,
                            tl.where(offset + end - start > loc_numel, 3, 0)))
    tl.store(error_ptr + b, err)
    count = tl.where(err == 0, end - start, 0)
    for p0 in range(0, count, BLOCK):
        p = p0 + tl.arange(0, BLOCK)
        m = p < count
        loc = tl.load(loc_ptr + offset + p, mask=m, other=0)
        tl.store(table_ptr + row * ctx + start + p, loc.to(table_ptr.dtype.element_ty), mask=m)


@custom_op("assign_req_to_token", ("req_to_token", "error_flag"))
def _assign_op(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, start_offsets: torch.Tensor,
               end_offsets: torch.Tensor, out_cache_loc: torch.Tensor, error_flag: torch.Tensor) -> None:
    bs = req_pool_indices.shape[0]
    if bs:
        _assign_kernel[(bs,)](req_to_token, req_pool_indices, start_offsets, end_offsets, out_cache_loc, error_flag,
                              req_to_token.shape[0], req_to_token.shape[1], out_cache_loc.numel(), BLOCK=_BLOCK)


def assign_req_to_token(req_to_token, req_pool_indices, start_offsets, end_offsets, out_cache_loc, *,
                        error_flag: torch.Tensor | None = None) -> None:
    flag = error_flag_for(req_pool_indices.shape[0], req_to_token.device, error_flag)
    _assign_op(req_to_token, req_pool_indices, start_offsets, end_offsets, out_cache_loc, flag)
    _check(flag, "assign_req_to_token")


# --------------------------------------------------------------------------- compact_accepted_kv_locs
@triton.jit
def accepted_path(rows_ptr, seq_lens_ptr, accept_index_ptr, accept_length_ptr, b, max_reqs, ctx, n, num_spec,
                  BLOCK: tl.constexpr):
    """Request ``b``'s accepted path, checked (``compact_accepted_kv_locs`` and ``commit_step`` read it
    so): its row, seq_len, accept length k, error code (1: row outside req_to_token; 2: seq_len + n
    or k out of range; 4: an accepted entry not one of its n nodes), the lanes, which lanes are
    accepted (none on an error) and each accepted lane's node within the request (0 elsewhere)."""
    row = tl.load(rows_ptr + b).to(tl.int64)
    base = tl.load(seq_lens_ptr + b).to(tl.int64)
    k = tl.load(accept_length_ptr + b).to(tl.int64)
    err = tl.where((row < 0) | (row >= max_reqs), 1,
                   tl.where((base < 0) | (base + n > ctx) | (k < 0) | (k >= num_spec), 2, 0))
    # NOTE: request-level conditions enter masks as integer bounds (i < limit), never as a scalar
    # bool & a vector: Triton's interpreter mis-types that mask.
    i = tl.arange(0, BLOCK)
    accepted = i <= tl.where(err == 0, k, -1)
    node = tl.load(accept_index_ptr + b * num_spec + i, mask=accepted, other=0).to(tl.int64) - b * n
    bad_node = accepted & ((node < 0) | (node >= n))
    err = tl.where(err != 0, err, tl.where(tl.max(bad_node.to(tl.int32)) > 0, 4, 0))
    accepted = i <= tl.where(err == 0, k, -1)
    return row, base, k, err, i, accepted, tl.where(accepted, node, 0)


@triton.jit
def _compact_kernel(table_ptr, rows_ptr, seq_lens_ptr, accept_index_ptr, accept_length_ptr, src_ptr, dst_ptr,
                    pos_ptr, error_ptr, max_reqs, ctx, n, num_spec, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    row, base, k, err, i, accepted, node = accepted_path(rows_ptr, seq_lens_ptr, accept_index_ptr, accept_length_ptr,
                                                         b, max_reqs, ctx, n, num_spec, BLOCK)
    row_ptr = table_ptr + row * ctx + base
    home = tl.load(row_ptr, mask=err == 0, other=-1).to(tl.int64)
    src = tl.load(row_ptr + node, mask=accepted, other=0).to(tl.int64)
    dst = tl.load(row_ptr + i, mask=accepted, other=0).to(tl.int64)
    out = b * num_spec + i
    written = i < tl.where(err == 0, num_spec, 0)
    tl.store(src_ptr + out, tl.where(accepted, src, home), mask=written)
    tl.store(dst_ptr + out, tl.where(accepted, dst, home), mask=written)
    tl.store(pos_ptr + out, tl.where(accepted, base + i, -1), mask=written)
    tl.store(error_ptr + b, err)


@custom_op("compact_accepted_kv_locs", ("src_locs", "dst_locs", "positions", "error_flag"))
def _compact_op(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                accept_index: torch.Tensor, accept_length: torch.Tensor, src_locs: torch.Tensor,
                dst_locs: torch.Tensor, positions: torch.Tensor, error_flag: torch.Tensor,
                num_draft_tokens: int) -> None:
    bs, num_spec = accept_index.shape
    if bs:
        _compact_kernel[(bs,)](req_to_token, req_pool_indices, seq_lens, accept_index, accept_length, src_locs,
                               dst_locs, positions, error_flag, req_to_token.shape[0], req_to_token.shape[1],
                               num_draft_tokens, num_spec, BLOCK=max(16, triton.next_power_of_2(num_spec)))


def compact_accepted_kv_locs(req_to_token, req_pool_indices, seq_lens, accept_index, accept_length, src_locs,
                             dst_locs, positions, *, num_draft_tokens: int,
                             error_flag: torch.Tensor | None = None) -> None:
    flag = error_flag_for(req_pool_indices.shape[0], req_to_token.device, error_flag)
    _compact_op(req_to_token, req_pool_indices, seq_lens, accept_index, accept_length, src_locs, dst_locs,
                positions, flag, num_draft_tokens)
    _check(flag, "compact_accepted_kv_locs")


# --------------------------------------------------------------------------- move_kv_slots
@triton.jit
def _move_kv_kernel(k_ptr, v_ptr, src_ptr, dst_ptr, error_ptr, num_slots, width, row_size,
                    BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
    """Program (group g, layer, column chunk): the group's [width, BLOCK_C] slice of that layer's K
    and V rows, all loaded, then (after a barrier) stored."""
    g = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    i = tl.arange(0, BLOCK_W)
    src = tl.load(src_ptr + g * width + i, mask=i < width, other=0)
    dst = tl.load(dst_ptr + g * width + i, mask=i < width, other=0)
    outside = (i < width) & ((src < 0) | (src >= num_slots) | (dst < 0) | (dst >= num_slots))
    err = tl.where(tl.max(outside.to(tl.int32)) > 0, 2, 0)
    moved = (i < tl.where(err == 0, width, 0)) & (src != dst)  # [BLOCK_W]
    mask = moved[:, None] & (cols < row_size)[None, :]  # [BLOCK_W, BLOCK_C]
    layer_base = layer * num_slots * row_size
    src_offs = layer_base + src[:, None] * row_size + cols[None, :]
    dst_offs = layer_base + dst[:, None] * row_size + cols[None, :]
    k = tl.load(k_ptr + src_offs, mask=mask)
    v = tl.load(v_ptr + src_offs, mask=mask)
    tl.debug_barrier()  # NOTE: a destination may be another entry's source: every thread reads first
    tl.store(k_ptr + dst_offs, k, mask=mask)
    tl.store(v_ptr + dst_offs, v, mask=mask)
    tl.store(error_ptr + g, err)  # every program of the group stores the same code


@custom_op("move_kv_slots", ("k_cache", "v_cache", "error_flag"))
def _move_kv_op(k_cache: torch.Tensor, v_cache: torch.Tensor, src_locs: torch.Tensor, dst_locs: torch.Tensor,
                error_flag: torch.Tensor) -> None:
    groups, width = src_locs.shape
    num_layers, num_slots = k_cache.shape[:2]
    row_size = k_cache.shape[2] * k_cache.shape[3]  # num_kv_heads * head_dim (k_cache[0, 0] fails on an empty cache)
    block_w = next_pow2(width)
    block_c = min(next_pow2(row_size), max(16, 4096 // block_w))  # at most 4096 elements a tile
    if groups and width and num_layers:
        _move_kv_kernel[(groups, num_layers, triton.cdiv(row_size, block_c))](
            k_cache, v_cache, src_locs, dst_locs, error_flag, num_slots, width, row_size,
            BLOCK_W=block_w, BLOCK_C=block_c)


def move_kv_slots(k_cache, v_cache, src_locs, dst_locs, *, error_flag: torch.Tensor | None = None) -> None:
    groups, width = src_locs.shape
    flag = error_flag_for(groups, k_cache.device, error_flag)
    if not width or not k_cache.shape[0]:
        flag.zero_()  # no program runs to write it
    _move_kv_op(k_cache, v_cache, src_locs, dst_locs, flag)
    raise_on_cpu(flag, lambda g, code: f"move_kv_slots: group {g} has a slot outside [0, {k_cache.shape[1]})")


# --------------------------------------------------------------------------- draft_scratch_slots
@triton.jit
def _scratch_kernel(branch_ptr, anc_in_ptr, anc_out_ptr, slots_ptr, error_ptr, k, in_width, out_width,
                    scratch_base, num_steps, step, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)  # new node: request r // K, node r % K
    b = r // k
    branch = tl.load(branch_ptr + r).to(tl.int64)
    ok = (branch >= 0) & (branch < k)
    parent_row = b * k + tl.where(ok, branch, 0)
    slot = scratch_base + (b * (num_steps - 1) + step) * k + r % k
    tl.store(slots_ptr + r, slot)
    for c0 in range(0, step, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        m = c < step
        anc = tl.load(anc_in_ptr + parent_row * in_width + c, mask=m, other=0)
        tl.store(anc_out_ptr + r * out_width + c, anc, mask=m)
    tl.store(anc_out_ptr + r * out_width + step, slot)
    tl.store(error_ptr + r, tl.where(ok, 0, 2))


@custom_op("draft_scratch_slots", ("ancestors_out", "slots_out", "error_flag"))
def _scratch_op(parent_branch: torch.Tensor, ancestors_in: torch.Tensor, ancestors_out: torch.Tensor,
                slots_out: torch.Tensor, error_flag: torch.Tensor, scratch_base: int, num_steps: int,
                step: int) -> None:
    rows = parent_branch.numel()
    if rows:
        # NOTE: an empty ancestors_in (step 0) may have a null data pointer; it is never read then.
        anc_in = ancestors_in if ancestors_in.numel() else ancestors_out
        _scratch_kernel[(rows,)](parent_branch, anc_in, ancestors_out, slots_out, error_flag,
                                 parent_branch.shape[1], ancestors_in.shape[1], ancestors_out.shape[1],
                                 scratch_base, num_steps, step, BLOCK=16)


def draft_scratch_slots(parent_branch, ancestors_in, ancestors_out, slots_out, *, scratch_base: int,
                        num_steps: int, step: int, error_flag: torch.Tensor | None = None) -> None:
    flag = error_flag_for(parent_branch.numel(), parent_branch.device, error_flag)
    _scratch_op(parent_branch, ancestors_in, ancestors_out, slots_out, flag, scratch_base, num_steps, step)
    k = max(parent_branch.shape[1], 1)
    raise_on_cpu(flag, lambda r, code: f"parent_branch: request {r // k} node {r % k} has a branch outside [0, {k})")


# --------------------------------------------------------------------------- create_kv_indices
@triton.jit(do_not_specialize=["out_numel"])
def _gather_kernel(table_ptr, rows_ptr, lens_ptr, indptr_ptr, start_ptr, out_ptr, error_ptr, max_reqs, ctx,
                   out_numel, page_size, HAS_START: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    row = tl.load(rows_ptr + b).to(tl.int64)
    length = tl.load(lens_ptr + b).to(tl.int64)
    off = tl.load(indptr_ptr + b).to(tl.int64)
    start = row * 0
    if HAS_START:
        start = tl.load(start_ptr + b).to(tl.int64)
    count = (length + page_size - 1) // page_size
    err = tl.where((row < 0) | (row >= max_reqs), 1,
                   tl.where((start < 0) | (length < 0) | (start + length > ctx), 2,
                            tl.where((off < 0) | (off + count > out_numel), 3, 0)))
    tl.store(error_ptr + b, err)
    count = tl.where(err == 0, count, 0)
    for i0 in range(0, count, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        m = i < count
        slot = tl.load(table_ptr + row * ctx + start + i * page_size, mask=m, other=0)
        tl.store(out_ptr + off + i, (slot // page_size).to(out_ptr.dtype.element_ty), mask=m)


@custom_op("create_kv_indices", ("kv_indices", "error_flag"))
def _gather_op(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
               kv_indptr: torch.Tensor, kv_start_idx: torch.Tensor | None, kv_indices: torch.Tensor,
               error_flag: torch.Tensor, page_size: int) -> None:
    bs = req_pool_indices.shape[0]
    if bs:
        _gather_kernel[(bs,)](req_to_token, req_pool_indices, seq_lens, kv_indptr,
                              kv_start_idx if kv_start_idx is not None else seq_lens, kv_indices, error_flag,
                              req_to_token.shape[0], req_to_token.shape[1], kv_indices.numel(), page_size,
                              HAS_START=kv_start_idx is not None, BLOCK=_BLOCK)


def create_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_start_idx, kv_indices, *,
                      error_flag: torch.Tensor | None = None) -> None:
    flag = error_flag_for(req_pool_indices.shape[0], req_to_token.device, error_flag)
    _gather_op(req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_start_idx, kv_indices, flag, 1)
    _check(flag, "create_kv_indices")


def create_kv_page_indices(req_to_token, req_pool_indices, seq_lens, page_indptr, page_indices, *,
                           page_size: int, error_flag: torch.Tensor | None = None) -> None:
    flag = error_flag_for(req_pool_indices.shape[0], req_to_token.device, error_flag)
    _gather_op(req_to_token, req_pool_indices, seq_lens, page_indptr, None, page_indices, flag, page_size)
    _check(flag, "create_kv_page_indices")


# --------------------------------------------------------------------------- create_kv_layout
@triton.jit(do_not_specialize=["out_numel"])
def _layout_kernel(table_ptr, rows_ptr, prefix_ptr, own_ptr, indptr_ptr, out_ptr, error_ptr, branches, width,
                   stride_own, max_reqs, ctx, out_numel, BLOCK: tl.constexpr):
    s = tl.program_id(0)  # attention sequence s = b * branches + j
    b = s // branches
    j = s % branches
    row = tl.load(rows_ptr + b).to(tl.int64)
    prefix = tl.load(prefix_ptr + b).to(tl.int64)
    before = row * 0  # the prefixes of requests 0..b-1
    for i0 in range(0, b, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        before += tl.sum(tl.load(prefix_ptr + i, mask=i < b, other=0).to(tl.int64))
    off = before * branches + j * prefix + s.to(tl.int64) * width  # where sequence s starts
    end = off + prefix + width
    err = tl.where((row < 0) | (row >= max_reqs), 1,
                   tl.where((prefix < 0) | (prefix > ctx), 2, tl.where(end > out_numel, 3, 0)))
    tl.store(error_ptr + s, err)
    tl.store(indptr_ptr + s + 1, end.to(indptr_ptr.dtype.element_ty))
    if s == 0:
        tl.store(indptr_ptr, end * 0)
    count = tl.where(err == 0, prefix, 0)
    for i0 in range(0, count, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        m = i < count
        slot = tl.load(table_ptr + row * ctx + i, mask=m, other=0)
        tl.store(out_ptr + off + i, slot.to(out_ptr.dtype.element_ty), mask=m)
    for w0 in range(0, tl.where(err == 0, width, 0), BLOCK):
        w = w0 + tl.arange(0, BLOCK)
        m = w < width
        slot = tl.load(own_ptr + s.to(tl.int64) * stride_own + w, mask=m, other=0)
        tl.store(out_ptr + off + prefix + w, slot.to(out_ptr.dtype.element_ty), mask=m)


@custom_op("create_kv_layout", ("kv_indptr", "kv_indices", "error_flag"))
def _layout_op(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
               own: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, error_flag: torch.Tensor) -> None:
    num_seqs, width = own.shape
    if num_seqs:
        _layout_kernel[(num_seqs,)](req_to_token, req_pool_indices, prefix_lens, own, kv_indptr, kv_indices, error_flag,
                                    num_seqs // req_pool_indices.shape[0], width, own.stride(0), req_to_token.shape[0],
                                    req_to_token.shape[1], kv_indices.numel(), BLOCK=_BLOCK)


def create_kv_layout(req_to_token, req_pool_indices, prefix_lens, own, kv_indptr, kv_indices, *,
                     error_flag: torch.Tensor | None = None) -> None:
    flag = error_flag_for(own.shape[0], req_to_token.device, error_flag)
    _layout_op(req_to_token, req_pool_indices, prefix_lens, own, kv_indptr, kv_indices, flag)
    branches = max(own.shape[0] // max(req_pool_indices.shape[0], 1), 1)
    raise_on_cpu(flag, lambda s, code: "create_kv_layout: " + _ERRORS[code].format(b=s // branches))


IMPLS = {
    "assign_req_to_token": assign_req_to_token,
    "compact_accepted_kv_locs": compact_accepted_kv_locs,
    "move_kv_slots": move_kv_slots,
    "draft_scratch_slots": draft_scratch_slots,
    "create_kv_indices": create_kv_indices,
    "create_kv_page_indices": create_kv_page_indices,
    "create_kv_layout": create_kv_layout,
}
