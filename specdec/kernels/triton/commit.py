"""Triton ``commit_step`` (``specdec.kernels.commit``): one program per request, W lanes.

Error codes (``error_flag[b]``, 0 = fine): those of ``cache_ops.accepted_path``, which both read a
request's accepted path through.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.triton._common import custom_op, error_flag_for, next_pow2, raise_on_cpu
from specdec.kernels.triton.cache_ops import accepted_path

_ERRORS = {
    1: "req_pool_indices: request {b} has a row outside req_to_token",
    2: "request {b}: seq_len + N outside its row, or accept_length outside [0, W)",
    4: "accept_index: request {b} has an entry that is not one of its nodes",
}


@triton.jit
def _commit_kernel(table_ptr, rows_ptr, seq_lens_ptr, accept_index_ptr, accept_length_ptr, predicts_ptr,
                   next_token_ptr, next_sibling_ptr, src_ptr, dst_ptr, nodes_ptr, tokens_ptr, next_tokens_ptr,
                   next_seq_lens_ptr, positions_ptr, slots_ptr, num_committed_ptr, host_ptr, error_ptr,
                   max_reqs, ctx, n, w, host_w, pad_slot, park_base,
                   SHIFT: tl.constexpr, OBSERVE: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    row, base, k, err, i, accepted, local = accepted_path(rows_ptr, seq_lens_ptr, accept_index_ptr,
                                                          accept_length_ptr, b, max_reqs, ctx, n, w, BLOCK_W)
    k = tl.where(err == 0, k, 0)
    node = tl.where(accepted, local + b * n, 0)  # a verify row; padding: node 0
    row_ptr = table_ptr + tl.where(err == 0, row, 0) * ctx + tl.where(err == 0, base, 0)
    home = tl.load(row_ptr, mask=err == 0, other=0).to(tl.int64)
    src = tl.load(row_ptr + local, mask=accepted, other=0).to(tl.int64)
    dst = tl.load(row_ptr + i, mask=accepted, other=0).to(tl.int64)
    token = tl.load(predicts_ptr + node).to(tl.int64)
    if SHIFT:
        after_root = tl.load(row_ptr + 1 + i, mask=i < k, other=0).to(tl.int64)
        slot = tl.where(i < k, after_root, tl.where(i == k, park_base + row, pad_slot))
    else:
        slot = tl.where(accepted, dst, pad_slot)
    lane = i < w
    out = b * w + i
    tl.store(src_ptr + out, tl.where(accepted, src, home), mask=lane)
    tl.store(dst_ptr + out, tl.where(accepted, dst, home), mask=lane)
    tl.store(nodes_ptr + out, node, mask=lane)
    tl.store(tokens_ptr + out, token, mask=lane)
    tl.store(positions_ptr + out, base + SHIFT + i, mask=lane)
    tl.store(slots_ptr + out, slot, mask=lane)
    tl.store(next_tokens_ptr + b, tl.sum(tl.where(i == k, token, 0)))
    tl.store(next_seq_lens_ptr + b, base + k + 1)
    tl.store(num_committed_ptr + b, k + 1)
    host = host_ptr + b * host_w
    tl.store(host, row)
    tl.store(host + 1, base)
    tl.store(host + 2, k)
    tl.store(host + 3 + i, token, mask=lane)
    if OBSERVE:
        tl.store(host + 3 + w + i, tl.where(accepted, local, -1), mask=lane)
        j = tl.arange(0, BLOCK_N)
        links = j < n
        tl.store(host + 3 + 2 * w + j, tl.load(next_token_ptr + b * n + j, mask=links, other=0), mask=links)
        tl.store(host + 3 + 2 * w + n + j, tl.load(next_sibling_ptr + b * n + j, mask=links, other=0), mask=links)
    tl.store(error_ptr + b, err)


@custom_op("commit_step", ("src_locs", "dst_locs", "nodes", "tokens", "next_tokens", "next_seq_lens", "positions",
                           "slots", "num_committed", "host", "error_flag"))
def _commit_op(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
               accept_index: torch.Tensor, accept_length: torch.Tensor, predicts: torch.Tensor,
               retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor, src_locs: torch.Tensor,
               dst_locs: torch.Tensor, nodes: torch.Tensor, tokens: torch.Tensor, next_tokens: torch.Tensor,
               next_seq_lens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               num_committed: torch.Tensor, host: torch.Tensor, error_flag: torch.Tensor,
               num_draft_tokens: int, pad_slot: int, park_base: int) -> None:
    bs, w = accept_index.shape
    if bs:
        _commit_kernel[(bs,)](
            req_to_token, req_pool_indices, seq_lens, accept_index, accept_length, predicts, retrive_next_token,
            retrive_next_sibling, src_locs, dst_locs, nodes, tokens, next_tokens, next_seq_lens, positions, slots,
            num_committed, host, error_flag, req_to_token.shape[0], req_to_token.shape[1], num_draft_tokens, w,
            host.shape[1], pad_slot, park_base, SHIFT=int(park_base >= 0), OBSERVE=host.shape[1] > 3 + w,
            BLOCK_W=next_pow2(w), BLOCK_N=next_pow2(num_draft_tokens))


def commit_step(req_to_token, req_pool_indices, seq_lens, accept_index, accept_length, predicts, retrive_next_token,
                retrive_next_sibling, out, *, num_draft_tokens: int, pad_slot: int, park_base: int,
                error_flag: torch.Tensor | None = None) -> None:
    flag = error_flag_for(req_pool_indices.shape[0], req_to_token.device, error_flag)
    _commit_op(req_to_token, req_pool_indices, seq_lens, accept_index, accept_length, predicts, retrive_next_token,
               retrive_next_sibling, *out, flag, num_draft_tokens, pad_slot, park_base)
    raise_on_cpu(flag, lambda b, code: "commit_step: " + _ERRORS[code].format(b=b))


IMPLS = {"commit_step": commit_step}
