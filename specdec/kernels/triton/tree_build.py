"""Triton ``build_tree_kernel_efficient`` and ``reconstruct_indices_from_tree_mask``.

One program per request; node vectors have BLOCK_N lanes (node t in lane t) and [N, N] relations
are register tiles, so nothing is shared between programs and no step needs a barrier. Per-node
lookups into a register vector ("parent of cur") are one-hot masked sums, exact for integers.

Error codes (``error_flag[b] = code + 16 * node``, the first failing node of request b, checked in
the reference's order: every node's parent first, then cycles): see ``_BUILD_ERRORS``. FULL_MASK
adds ``_MASK_OVERFLOW`` when the mask is too small for the seq_len prefixes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.kernels.common import TreeMaskMode, packed_mask_bytes
from specdec.kernels.triton._common import custom_op, error_flag_for, next_pow2, raise_on_cpu

_BUILD_ERRORS = {
    1: "has negative score index",
    2: "(score index) points past parent_list",
    3: "has a parent that is not among the selected nodes",
    4: "has a cycle among its ancestors",
}
_MASK_OVERFLOW = 1 << 30


@triton.jit(do_not_specialize=["bs", "mask_numel"])
def _build_tree_kernel(
    parent_list_ptr, selected_ptr, seq_len_ptr, mask_ptr, positions_ptr, rindex_ptr, next_token_ptr,
    next_sibling_ptr, error_ptr, bs, mask_numel, parent_width, topk, n,
    MODE: tl.constexpr, NBYTES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    t = tl.arange(0, BLOCK_N)  # node (row) index
    j = tl.arange(0, BLOCK_N)  # node (column) index
    valid = t < n
    is_child = valid & (t >= 1)
    # Parent of each node from score indices (node t is selected_index[b, t - 1]).
    sel = tl.load(selected_ptr + b * (n - 1) + t - 1, mask=is_child, other=0)
    row = tl.where(sel >= 0, sel // topk, 0)
    in_list = row < parent_width
    parent_score = tl.load(parent_list_ptr + b * parent_width + row,
                           mask=is_child & (sel >= 0) & (row > 0) & in_list, other=-1)
    # NOTE: the first node holding a score index wins, like the ref's node_of_score.setdefault.
    match = (sel[None, :] == parent_score[:, None]) & is_child[None, :]
    first = tl.min(tl.where(match, j[None, :], BLOCK_N), axis=1)
    code = tl.where(sel < 0, 1, tl.where(row == 0, 0, tl.where(~in_list, 2, tl.where(first < BLOCK_N, 0, 3))))
    code = tl.where(is_child, code, 0)
    parent = tl.where(is_child & (code == 0) & (row > 0), first, 0)
    parent = tl.where(t == 0, -1, parent)
    # Ancestors: walk every node up at once, until all reach the root (a tree's depth, not N,
    # rounds: 64 rounds took 68 us of an H100 step at N = 64) or N rounds (a cycle);
    # anc[t, j] = node t sees node j.
    anc = ((t[:, None] == j[None, :]) | (j[None, :] == 0)) & valid[:, None] & valid[None, :]
    cur = t
    rounds = n * 0
    while (tl.max(cur, axis=0) > 0) & (rounds < n):
        up = tl.sum(tl.where(cur[:, None] == j[None, :], parent[None, :], 0), axis=1)
        cur = tl.where(cur > 0, up, cur)
        anc = anc | ((cur[:, None] == j[None, :]) & (cur[:, None] > 0))
        rounds += 1
    cycle = valid & (cur > 0)
    depth = tl.sum(anc.to(tl.int64), axis=1) - 1
    # Children of p chained in ascending node order.
    child_of = (parent[:, None] == j[None, :]) & is_child[:, None]  # [c, p]
    first_child = tl.min(tl.where(child_of, t[:, None], BLOCK_N), axis=0)
    first_child = tl.where(first_child < BLOCK_N, first_child, -1)
    sibling = (parent[None, :] == parent[:, None]) & is_child[None, :] & (j[None, :] > t[:, None])
    next_sibling = tl.min(tl.where(sibling, j[None, :], BLOCK_N), axis=1)
    next_sibling = tl.where(is_child & (next_sibling < BLOCK_N), next_sibling, -1)

    seq_len = tl.load(seq_len_ptr + b)
    base = b * n
    tl.store(positions_ptr + base + t, seq_len + depth, mask=valid)
    tl.store(rindex_ptr + base + t, base + t, mask=valid)
    tl.store(next_token_ptr + base + j, first_child.to(tl.int64), mask=j < n)
    tl.store(next_sibling_ptr + base + t, next_sibling.to(tl.int64), mask=valid)
    both = valid[:, None] & valid[None, :]
    overflow = 0
    if MODE == 0:  # FULL_MASK: rows of seq_len + N entries, request b after all earlier requests'
        prefix = b * 0
        for start in range(0, b, BLOCK_B):
            offs = start + tl.arange(0, BLOCK_B)
            prefix += tl.sum(tl.load(seq_len_ptr + offs, mask=offs < b, other=0))
        width = seq_len + n
        row_start = (prefix + base) * n
        off = row_start + t[:, None] * width + seq_len + j[None, :]
        tl.store(mask_ptr + off, anc.to(tl.uint8), mask=both & (off < mask_numel))
        overflow = tl.where(row_start + n * width > mask_numel, 1073741824, 0)  # _MASK_OVERFLOW
    elif MODE == 1:
        tl.store(mask_ptr + base * n + t[:, None] * n + j[None, :], anc.to(tl.uint8), mask=both)
    else:  # bit j of row t; N <= 32 so a row fits an int64
        bits = tl.sum(tl.where(anc & both, tl.full([1, BLOCK_N], 1, tl.int64) << j[None, :].to(tl.int64), 0), axis=1)
        for k in tl.static_range(NBYTES):
            tl.store(mask_ptr + (base + t) * NBYTES + k, ((bits >> (8 * k)) & 255).to(tl.uint8), mask=valid)

    bad = tl.min(tl.where(code != 0, t, BLOCK_N))
    bad_code = tl.sum(tl.where(t == bad, code, 0))
    cyc = tl.min(tl.where(cycle, t, BLOCK_N))
    err = tl.where(bad < BLOCK_N, bad_code + 16 * bad, tl.where(cyc < BLOCK_N, 4 + 16 * cyc, 0))
    tl.store(error_ptr + b, err + overflow)


@custom_op(
    "build_tree_kernel_efficient",
    ("tree_mask", "positions", "retrive_index", "retrive_next_token", "retrive_next_sibling", "error_flag"),
)
def _build_tree_op(
    parent_list: torch.Tensor, selected_index: torch.Tensor, verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor, positions: torch.Tensor, retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor, error_flag: torch.Tensor,
    topk: int, depth: int, draft_token_num: int, tree_mask_mode: int,
) -> None:
    bs, n = parent_list.shape[0], draft_token_num
    if bs == 0:
        return
    nbytes = packed_mask_bytes(n) if tree_mask_mode == TreeMaskMode.QLEN_ONLY_BITPACKING else 1
    mask_bytes = tree_mask.view(torch.uint8)  # bool and packed uint8/16/32 alike, byte addressed
    _build_tree_kernel[(bs,)](
        parent_list, selected_index, verified_seq_len, mask_bytes, positions, retrive_index,
        retrive_next_token, retrive_next_sibling, error_flag, bs, mask_bytes.numel(), parent_list.shape[1],
        topk, n, MODE=tree_mask_mode, NBYTES=nbytes, BLOCK_N=next_pow2(n), BLOCK_B=256, num_warps=4,
    )


def build_tree_kernel_efficient(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
    *,
    error_flag: torch.Tensor | None = None,  # [bs] int32, 0 = request's tree is well formed
) -> None:
    """Triton ``build_tree_kernel_efficient`` (inputs validated by the public op)."""
    bs, n = parent_list.shape[0], int(draft_token_num)
    flag = error_flag_for(bs, parent_list.device, error_flag)
    _build_tree_op(parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
                   retrive_next_token, retrive_next_sibling, flag, int(topk), int(depth), n, int(tree_mask_mode))

    def describe(b: int, code: int) -> str:
        if code & _MASK_OVERFLOW:
            need = (int(verified_seq_len.sum()) + bs * n) * n
            return f"tree_mask: FULL_MASK needs (sum(seq_lens) + bs*N) * N = {need} entries, got {tree_mask.numel()}"
        node, kind = code >> 4, code & 15
        return f"invalid draft tree: request {b} node {node} {_BUILD_ERRORS[kind]}"

    raise_on_cpu(flag, describe, first=_MASK_OVERFLOW)  # the ref checks the overflow first


@triton.jit
def _reconstruct_kernel(
    mask_ptr, seq_len_ptr, positions_ptr, rindex_ptr, next_token_ptr, next_sibling_ptr, n,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    t = tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_N)
    valid = t < n
    both = valid[:, None] & valid[None, :]
    m = tl.load(mask_ptr + b * n * n + t[:, None] * n + j[None, :], mask=both, other=0) != 0
    lower = m & (j[None, :] < t[:, None])  # [t, j]: node t sees an earlier node j
    parent = tl.max(tl.where(lower, j[None, :], -1), axis=1)
    depth = tl.sum(lower.to(tl.int64), axis=1)
    # next_token[j] = smallest row t > j whose column j is set (reduce over rows)
    next_token = tl.min(tl.where(lower, t[:, None], BLOCK_N), axis=0)
    next_token = tl.where(next_token < BLOCK_N, next_token, -1)
    same = (parent[None, :] == parent[:, None]) & valid[None, :] & (j[None, :] > t[:, None])
    next_sibling = tl.min(tl.where(same, j[None, :], BLOCK_N), axis=1)
    next_sibling = tl.where((parent != -1) & (next_sibling < BLOCK_N), next_sibling, -1)
    base = b * n
    tl.store(positions_ptr + base + t, tl.load(seq_len_ptr + b) + depth, mask=valid)
    tl.store(rindex_ptr + base + t, base + t, mask=valid)
    tl.store(next_token_ptr + base + j, next_token.to(tl.int64), mask=j < n)
    tl.store(next_sibling_ptr + base + t, next_sibling.to(tl.int64), mask=valid)


@custom_op(
    "reconstruct_indices_from_tree_mask",
    ("positions", "retrive_index", "retrive_next_token", "retrive_next_sibling"),
)
def _reconstruct_op(
    tree_mask: torch.Tensor, verified_seq_len: torch.Tensor, positions: torch.Tensor,
    retrive_index: torch.Tensor, retrive_next_token: torch.Tensor, retrive_next_sibling: torch.Tensor,
    batch_size: int, draft_token_num: int,
) -> None:
    if batch_size == 0:
        return
    _reconstruct_kernel[(batch_size,)](
        tree_mask.view(torch.uint8), verified_seq_len, positions, retrive_index, retrive_next_token,
        retrive_next_sibling, draft_token_num, BLOCK_N=next_pow2(draft_token_num), num_warps=4,
    )


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Triton ``reconstruct_indices_from_tree_mask`` (no walks, so no error flag)."""
    _reconstruct_op(tree_mask, verified_seq_len, positions, retrive_index, retrive_next_token, retrive_next_sibling,
                    int(batch_size), int(draft_token_num))


IMPLS = {
    "build_tree_kernel_efficient": build_tree_kernel_efficient,
    "reconstruct_indices_from_tree_mask": reconstruct_indices_from_tree_mask,
}
