"""Per-row KV lists for deterministic inference, built on the device (``build_row_kv_lists``).

Under ``--enable-deterministic-inference`` every query row attends over its own list of visible KV
slots in position order, so that a decode step at position p and the same token as a node of a
verify tree reduce the same values in the same order. This op writes those lists into a
preallocated ``kv_table`` [num_lists, stride] without reading a device value on the host, so it runs
inside a captured CUDA graph (``stride`` is then the graph's bound: max prefix + tokens a request).

Two layouts, by ``tree_mask``:

* causal (None; prefill, decode, draft extend): one list per request, its prefix
  ``req_to_token[row_b, :prefix_b]`` then its new tokens' slots in order; query row i of the request
  reads the first ``prefix_b + i + 1`` entries (the attention planner computes those lengths).
* tree (TARGET_VERIFY, ``q`` nodes a request, QLEN_ONLY mask): one list per packed query row r
  (node i of request b): the prefix, then each node j that node i sees placed at entry
  ``positions[j]`` (its depth past the prefix), so the list is prefix, ancestors by depth, itself.
  Row r reads the first ``positions[r] + 1`` entries.

Worked example, prefix 3 (row slots 40 41 9), verify tree of 4 nodes at slots 50 51 52 53::

        0            positions  3 4 4 5          row 3 (node 3) sees nodes 0, 2, 3:
       / \\                                       kv_table[row 3] = [40 41 9 50 52 53]
      1   2                                      row 1 (node 1):   [40 41 9 50 51]
          |
          3

and a decode step at node 3's position, after nodes 0 and 2 were committed at slots s0 s2 and the
new token got s3, lists [40 41 9 s0 s2 s3]: the same positions in the same order.

Entries past a list's length are left as they were. NOTE: tree lists rely on the verify
contract that a node's position is prefix + its depth (``build_tree``); nodes whose position falls
outside [prefix, positions[r]] are skipped (the padding requests of a CUDA-graph batch put every
node at position 0 with no prefix: their lists are one entry, the padding slot).
"""

from __future__ import annotations

import torch

from specdec.kernels.common import INDEX_DTYPES, check_rows, check_tensor, table_row
from specdec.kernels.dispatch import select_impl

__all__ = ["build_row_kv_lists", "build_row_kv_lists_ref"]


def build_row_kv_lists(
    req_to_token: torch.Tensor,  # [max_reqs, max_context]
    req_pool_indices: torch.Tensor,  # [bs]
    prefix_lens: torch.Tensor,  # [bs]
    qo_indptr: torch.Tensor,  # [bs + 1] request b's new tokens are packed rows qo_indptr[b]:qo_indptr[b + 1]
    out_cache_loc: torch.Tensor,  # [num_tokens] the new tokens' slots
    positions: torch.Tensor,  # [num_tokens]
    tree_mask: torch.Tensor | None,  # [bs * q * q] bool / uint8 per-request [q, q] blocks; None: causal
    kv_table: torch.Tensor,  # [bs (causal) or num_tokens (tree), stride] int32, written
) -> None:
    """Each list's KV slots in position order (module docstring)."""
    bs, device = check_rows(req_to_token, req_pool_indices, {"prefix_lens": prefix_lens})
    check_tensor("qo_indptr", qo_indptr, dtype=INDEX_DTYPES, shape=(bs + 1,), device=device)
    check_tensor("out_cache_loc", out_cache_loc, dtype=INDEX_DTYPES, dim=1, device=device)
    num_tokens = out_cache_loc.shape[0]
    check_tensor("positions", positions, dtype=INDEX_DTYPES, shape=(num_tokens,), device=device)
    lists = bs
    if tree_mask is not None:
        q = num_tokens // max(bs, 1)
        if q * bs != num_tokens:
            raise ValueError(f"tree lists: {num_tokens} tokens are not the same count for {bs} requests")
        check_tensor("tree_mask", tree_mask, dtype=(torch.bool, torch.uint8), shape=(bs * q * q,), device=device)
        lists = num_tokens
    check_tensor("kv_table", kv_table, dtype=torch.int32, dim=2, device=device)
    if kv_table.shape[0] != lists:
        raise ValueError(f"kv_table: expected {lists} lists ({'tree' if tree_mask is not None else 'causal'}), "
                         f"got {kv_table.shape[0]}")
    impl = select_impl("build_row_kv_lists", build_row_kv_lists_ref, device)
    impl(req_to_token, req_pool_indices, prefix_lens, qo_indptr, out_cache_loc, positions, tree_mask, kv_table)


def build_row_kv_lists_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    out_cache_loc: torch.Tensor,
    positions: torch.Tensor,
    tree_mask: torch.Tensor | None,
    kv_table: torch.Tensor,
) -> None:
    """Specification of ``build_row_kv_lists`` (module docstring), one request at a time."""
    stride = kv_table.shape[1]
    rows, prefix, qo = req_pool_indices.tolist(), prefix_lens.tolist(), qo_indptr.tolist()
    pos, loc = positions.tolist(), out_cache_loc.to(torch.int32)
    for b, (row, p) in enumerate(zip(rows, prefix)):
        table = table_row(req_to_token, row, b)
        start, end = qo[b], qo[b + 1]
        if not 0 <= p <= table.shape[0]:
            raise ValueError(f"prefix_lens: request {b} has {p} tokens, its row holds {table.shape[0]}")
        if tree_mask is None:
            if p + end - start > stride:
                raise ValueError(f"kv_table: request {b} lists {p + end - start} entries, stride {stride}")
            kv_table[b, :p] = table[:p].to(torch.int32)
            kv_table[b, p : p + end - start] = loc[start:end]
            continue
        q = end - start
        block = tree_mask[b * q * q : (b + 1) * q * q].view(q, q).to(torch.bool)
        for i in range(q):
            r = start + i
            if pos[r] + 1 > stride or p > stride:
                raise ValueError(f"kv_table: row {r} lists {max(pos[r] + 1, p)} entries, stride {stride}")
            kv_table[r, :p] = table[:p].to(torch.int32)
            for j in range(q):
                if block[i, j] and p <= pos[start + j] <= pos[r]:
                    kv_table[r, pos[start + j]] = loc[start + j]
