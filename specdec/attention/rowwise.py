"""Deterministic inference's attention plan: every query row over its own KV list in position order.

Under ``--enable-deterministic-inference`` (``specdec.forward.batch_invariant_enabled``) the triton
and torch_native backends plan every forward but a draft step (the draft only proposes) with
``plan_row_kv``: row r attends the first ``row_lens[r]`` entries of ``kv_table[row_list[r]]``, which
hold exactly the entries it may see, ordered by position: its request's cached prefix, then
(verify) its tree ancestors by depth, or (prefill, decode, draft extend) the request's earlier new
tokens, then itself. A decode step at position p and the verify node at position p on the accepted
path therefore attend over the same positions in the same order (only the slots differ), and so do
a prefill row with and without a cached prefix, with any page size, inside any batch.

    request with 3 cached tokens (slots 40 41 9), verify tree   0          nodes written at slots
    (node t at slot 50 + t):                                   / \\         50 51 52 53
                                                              1   2
                                                                  |
                                                                  3
    row of node 3: [40 41 9 | 50 52 53]   (prefix, root, node 2, itself)
    decode at node 3's position after committing nodes 0 and 2: [40 41 9 | s0 s2 s3], its own slots

The lists are built on the device (``specdec.kernels.build_row_kv_lists``) and the row mapping with
tensor ops, so a plan under ``static_max_seq_len`` reads nothing on the host and can be captured in a
CUDA graph (the table is then sized by that bound). The triton backend runs the rows through
``triton_kernels.row_attention`` (fixed position splits); torch_native through ``rowwise_attention``.
Without the flag the triton backend plans small verify batches here too and runs each node as a
decode step (``triton_kernels.decode_attention_rows``; see ``specdec.attention.triton_backend``).
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.forward import ForwardBatch, ForwardMode
from specdec.kernels import build_row_kv_lists


@dataclasses.dataclass(frozen=True)
class RowKV:
    # [num_lists, stride] int32 KV slots in position order: one list a request (causal) or a row (tree)
    kv_table: torch.Tensor
    # [num_tokens] int64 the list each packed query row reads
    row_list: torch.Tensor
    # [num_tokens] int32 how many of that list's entries it reads
    row_lens: torch.Tensor
    # host bound on row_lens (the table's stride): sizes a kernel's grid without a sync
    max_kv_len: int


def plan_row_kv(batch: ForwardBatch) -> RowKV:
    """The rows' KV lists of a prefill, decode, draft-extend or verify batch (module docstring)."""
    if batch.draft_ancestors is not None:
        raise ValueError("plan_row_kv: a draft step keeps its own plan")
    device = batch.input_ids.device
    bs, n = batch.batch_size, batch.num_tokens
    if batch.static_max_seq_len is not None:  # CUDA-graph shapes: q tokens a request, lengths on the device
        q = n // max(bs, 1)
        if q * bs != n:
            raise ValueError(f"plan_row_kv: {n} tokens are not the same count for {bs} requests")
        qo_indptr = torch.arange(bs + 1, dtype=torch.int64, device=device) * q
        stride = batch.static_max_seq_len + q
    else:
        extend = batch.host_extend_lens()
        qo_indptr = torch.tensor([0] + extend, dtype=torch.int64).cumsum(0).to(device)
        stride = max((p + e for p, e in zip(batch.host_prefix_lens(), extend)), default=1)
    prefix = batch.prefix_lens.to(device=device, dtype=torch.int64)  # [bs]
    positions = batch.positions.to(device=device, dtype=torch.int64)  # [n]
    tree = batch.forward_mode == ForwardMode.TARGET_VERIFY
    if tree and batch.tree_mask is None:
        raise ValueError("TARGET_VERIFY batch needs tree_mask")
    table = torch.empty(n if tree else bs, max(stride, 1), dtype=torch.int32, device=device)
    build_row_kv_lists(batch.req_to_token, batch.req_pool_indices, prefix, qo_indptr, batch.out_cache_loc,
                       positions, batch.tree_mask if tree else None, table)
    rows = torch.arange(n, device=device)
    if tree:  # row r lists its prefix, ancestors and itself: positions 0 .. positions[r]
        return RowKV(kv_table=table, row_list=rows, row_lens=(positions + 1).to(torch.int32), max_kv_len=stride)
    req = torch.searchsorted(qo_indptr[1:], rows, right=True)  # [n] request of each row
    lens = prefix[req] + rows - qo_indptr[req] + 1  # causal: the prefix and new tokens up to itself
    return RowKV(kv_table=table, row_list=req, row_lens=lens.to(torch.int32), max_kv_len=stride)


def rowwise_attention(
    q: torch.Tensor,  # [rows, num_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    kv_table: torch.Tensor,  # [num_lists, stride] int32
    row_list: torch.Tensor,  # [rows]
    row_lens: torch.Tensor,  # [rows] int32
    out: torch.Tensor,  # [rows, num_heads, head_dim] (written)
    *,
    sm_scale: float,
    max_kv_len: int,
    window: int | None = None,
) -> None:
    """torch_native's deterministic attention, and the specification of the triton backend's
    ``row_attention`` (its ``row_attention_ref``): softmax(q k^T * sm_scale) v per row over its list,
    in fp32, one row at a time (no splits: equal to the kernel up to summation order), so each row's
    arithmetic depends on its list alone. A sliding ``window`` keeps the list's last ``window``
    entries (entry e is position e, and the row is at its last). Query head h reads KV head ``h //
    (num_heads // num_kv_heads)``; ``max_kv_len`` does not change the result."""
    group = q.shape[1] // k_buffer.shape[1]
    lists, lens = row_list.tolist(), row_lens.tolist()
    for r in range(q.shape[0]):
        lo = 0 if window is None else max(0, lens[r] - window)
        slots = kv_table[lists[r], lo : lens[r]].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [kv, num_heads, d]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,khd->hk", q[r].float(), k) * sm_scale
        out[r] = torch.einsum("hk,khd->hd", torch.softmax(scores, dim=-1), v).to(out.dtype)
