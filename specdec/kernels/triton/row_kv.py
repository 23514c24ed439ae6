"""Triton version of ``specdec.kernels.row_kv.build_row_kv_lists``.

Grid ``(num_lists, cdiv(stride, BLOCK))``: program (l, t) writes entries [t * BLOCK, (t + 1) * BLOCK)
of list l's prefix (and, causal, of its new tokens); for a tree list, program (l, 0) also scatters
the nodes its row sees to their positions (at most a request's q nodes, one masked store).
Every access is masked to its tensor; nothing is read back on the host but the error flag on CPU.

Error codes (``error_flag[l]``, 0 = fine): 1 = row outside req_to_token, 2 = prefix outside the row,
3 = a list longer than ``kv_table``'s stride. A list with an error is not written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton._common import custom_op, error_flag_for, next_pow2, raise_on_cpu

_ERRORS = {
    1: "req_pool_indices: list {l} has a row outside req_to_token",
    2: "prefix_lens: list {l} has a prefix outside its row",
    3: "kv_table: list {l} is longer than the stride",
}
_BLOCK = 256


@triton.jit
def _row_kv_kernel(table_ptr, rows_ptr, prefix_ptr, qo_ptr, loc_ptr, pos_ptr, mask_ptr, out_ptr, error_ptr,
                   q_len, max_reqs, ctx, stride_out, TREE: tl.constexpr, BLOCK: tl.constexpr,
                   BLOCK_Q: tl.constexpr):
    lst = tl.program_id(0)
    tile = tl.program_id(1)
    b = lst
    if TREE:
        b = lst // q_len
    row = tl.load(rows_ptr + b).to(tl.int64)
    prefix = tl.load(prefix_ptr + b).to(tl.int64)
    start = tl.load(qo_ptr + b).to(tl.int64)
    new = tl.load(qo_ptr + b + 1).to(tl.int64) - start
    if TREE:
        length = tl.maximum(tl.load(pos_ptr + lst).to(tl.int64) + 1, prefix)
    else:
        length = prefix + new
    err = tl.where((row < 0) | (row >= max_reqs), 1,
                   tl.where((prefix < 0) | (prefix > ctx), 2, tl.where(length > stride_out, 3, 0)))
    if tile == 0:
        tl.store(error_ptr + lst, err)
    # a list in error reads and writes nothing (NOTE: bounds, not `mask & (err == 0)`: triton 3.9's interpreter
    # gives a tensor mask and a scalar comparison an int32 result, which tl.load/tl.store then reject)
    prefix = tl.where(err == 0, prefix, 0)
    length = tl.where(err == 0, length, 0)
    out = out_ptr + lst.to(tl.int64) * stride_out
    offs = tile * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    in_prefix = offs < prefix
    slot = tl.load(table_ptr + row * ctx + offs, mask=in_prefix, other=0)
    tl.store(out + offs, slot.to(tl.int32), mask=in_prefix)
    if TREE:
        if tile == 0:
            i = lst - start  # this row's node
            j = tl.arange(0, BLOCK_Q)
            node = j < new
            seen = tl.load(mask_ptr + b * new * new + i * new + j, mask=node, other=0) != 0
            pos_j = tl.load(pos_ptr + start + j, mask=node, other=0).to(tl.int64)
            keep = seen & node & (pos_j >= prefix) & (pos_j < length)
            own = tl.load(loc_ptr + start + j, mask=keep, other=0)
            tl.store(out + pos_j, own.to(tl.int32), mask=keep)
    else:
        mine = (offs >= prefix) & (offs < length)
        own = tl.load(loc_ptr + start + offs - prefix, mask=mine, other=0)
        tl.store(out + offs, own.to(tl.int32), mask=mine)


@custom_op("build_row_kv_lists", ("kv_table", "error_flag"))
def _row_kv_op(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
               qo_indptr: torch.Tensor, out_cache_loc: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor,
               tree: bool, kv_table: torch.Tensor, error_flag: torch.Tensor) -> None:
    lists, stride = kv_table.shape
    bs = req_pool_indices.shape[0]
    q_len = out_cache_loc.shape[0] // bs if tree and bs else 1
    if lists and stride:
        _row_kv_kernel[(lists, triton.cdiv(stride, _BLOCK))](
            req_to_token, req_pool_indices, prefix_lens, qo_indptr, out_cache_loc, positions, tree_mask, kv_table,
            error_flag, q_len, req_to_token.shape[0], req_to_token.shape[1], stride,
            TREE=tree, BLOCK=_BLOCK, BLOCK_Q=next_pow2(q_len))


def build_row_kv_lists(req_to_token, req_pool_indices, prefix_lens, qo_indptr, out_cache_loc, positions, tree_mask,
                       kv_table, *, error_flag: torch.Tensor | None = None) -> None:
    flag = error_flag_for(kv_table.shape[0], req_to_token.device, error_flag)
    tree = tree_mask is not None
    # NOTE: a bool tensor viewed as uint8 is the same bytes; the kernel tests != 0
    mask = tree_mask.view(torch.uint8) if tree and tree_mask.dtype == torch.bool else tree_mask
    _row_kv_op(req_to_token, req_pool_indices, prefix_lens, qo_indptr, out_cache_loc, positions,
               mask if tree else out_cache_loc, tree, kv_table, flag)
    raise_on_cpu(flag, lambda lst, code: "build_row_kv_lists: " + _ERRORS[code].format(l=lst))


IMPLS = {"build_row_kv_lists": build_row_kv_lists}
