"""Pure-torch attention over the paged KV cache: the reference every other backend is tested against.

Runs on CPU and GPU. Sequences (requests, or draft branches) are padded to one batched attention
call; scores are computed in fp32 whatever the cache dtype. Its metadata is derived from the batch
directly, independently of ``layout.RaggedLayout`` that the Triton backend plans from, so the two
backends cross-check each other's reading of the attention rules.

Deterministic inference (``specdec.forward.batch_invariant_enabled``) attends one query row at a time over
that row's own KV list in position order (``specdec.attention.rowwise``), except in a draft step.
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.attention.base import AttentionBackend, AttentionLayer
from specdec.attention.rowwise import RowKV, plan_row_kv, rowwise_attention
from specdec.forward import ForwardBatch, ForwardMode, batch_invariant_enabled


@dataclasses.dataclass(frozen=True)
class TorchNativeMetadata:
    # [num_seqs, max_q] packed query row of each padded query slot (0 where padding)
    q_rows: torch.Tensor
    # [num_seqs, max_q] True where q_rows is a real query
    q_valid: torch.Tensor
    # [num_seqs, max_kv] KV slot of each padded kv entry (0 where padding)
    kv_slots: torch.Tensor
    # [num_seqs, max_q, max_kv] True where the query may attend the kv entry
    allowed: torch.Tensor
    # [num_seqs, max_q] position of each query; [num_seqs, max_kv] of each kv entry (sliding windows)
    q_pos: torch.Tensor
    kv_pos: torch.Tensor

    def window(self, sliding_window: int | None) -> torch.Tensor:  # [num_seqs, max_q, max_kv]
        """``allowed`` narrowed to keys with position > query position - window (HF's rule)."""
        if sliding_window is None:
            return self.allowed
        near = self.kv_pos[:, None, :] > self.q_pos[:, :, None] - sliding_window
        return self.allowed & (near | ~self.q_valid[:, :, None])  # padded rows keep their column


def _padded_metadata(batch: ForwardBatch) -> TorchNativeMetadata:
    """Padded per-sequence views of the batch, built with tensor ops (no per-sequence loop).

    A sequence is a request, or one branch (row) of a draft decode step. Its KV entries are the
    request's cached prefix followed by its own new slots (or, for a draft branch, its ancestors).
    """
    device = batch.input_ids.device
    prefix = batch.prefix_lens.to(device=device, dtype=torch.int64)  # [bs]
    extend = batch.extend_lens.to(device=device, dtype=torch.int64)  # [bs]
    rows = batch.req_pool_indices.to(device=device, dtype=torch.int64)  # [bs]
    starts = torch.cumsum(extend, 0) - extend  # [bs] first packed token of each request
    max_prefix = max(batch.host_prefix_lens(), default=0)
    if batch.draft_ancestors is not None:  # every token is its own sequence
        topk = batch.num_tokens // max(batch.batch_size, 1)
        seq_req = torch.arange(batch.batch_size, device=device).repeat_interleave(topk)  # [n]
        own = batch.draft_ancestors.to(torch.int64)  # [n, depth]
        own_len = torch.full_like(seq_req, own.shape[1])
        q_rows = torch.arange(batch.num_tokens, device=device)[:, None]  # [n, 1]
        q_valid = torch.ones_like(q_rows, dtype=torch.bool)
    else:
        seq_req = torch.arange(batch.batch_size, device=device)
        max_q = max(batch.host_extend_lens(), default=1) or 1
        col = torch.arange(max_q, device=device)[None]
        q_valid = col < extend[:, None]  # [bs, max_q]
        q_rows = torch.where(q_valid, starts[:, None] + col, 0)
        own = batch.out_cache_loc.to(torch.int64)[q_rows]  # [bs, max_q] the new tokens' slots
        own_len = extend
    seq_prefix = prefix[seq_req]  # [n]
    kv_len = seq_prefix + own_len
    max_kv = max(max_prefix + own.shape[1], 1)
    col = torch.arange(max_kv, device=device)[None]  # [1, max_kv]
    in_prefix = col < seq_prefix[:, None]
    table = batch.req_to_token[rows[seq_req][:, None], col.clamp(max=batch.req_to_token.shape[1] - 1)]
    own_col = (col - seq_prefix[:, None]).clamp(0, max(own.shape[1] - 1, 0))
    own_slots = own.gather(1, own_col) if own.shape[1] else torch.zeros_like(table, dtype=torch.int64)
    kv_valid = col < kv_len[:, None]  # [n, max_kv]
    kv_slots = torch.where(in_prefix, table.to(torch.int64), own_slots)
    kv_slots = torch.where(kv_valid, kv_slots, 0)
    # [n, max_q, max_kv] causal aligned to the end: row r of q rows sees entries c <= kv - q + r
    q_len = q_valid.sum(dim=1)  # [n]
    q_pos = torch.arange(q_rows.shape[1], device=device)[None, :, None]
    allowed = col[:, None, :] <= ((kv_len - q_len)[:, None, None] + q_pos)
    if batch.forward_mode == ForwardMode.TARGET_VERIFY:
        allowed = in_prefix[:, None, :] | _tree_block(batch, extend, seq_prefix, q_rows.shape[1], max_kv)
    allowed &= kv_valid[:, None, :] & q_valid[:, :, None]
    # NOTE: padded query rows get one visible column so softmax stays finite; they are dropped.
    allowed[:, :, 0] |= ~q_valid
    positions = batch.positions.to(device=device, dtype=torch.int64)
    q_pos = positions[q_rows]  # [n, max_q]
    if batch.draft_ancestors is not None:  # ancestor i of a branch sits at depth i past the prefix
        own_pos = seq_prefix[:, None] + own_col
    else:
        own_pos = q_pos.gather(1, own_col.clamp(max=q_pos.shape[1] - 1))
    kv_pos = torch.where(in_prefix, col, own_pos)  # [n, max_kv]
    return TorchNativeMetadata(q_rows=q_rows, q_valid=q_valid, kv_slots=kv_slots, allowed=allowed,
                               q_pos=q_pos, kv_pos=kv_pos)


def _tree_block(batch: ForwardBatch, extend: torch.Tensor, prefix: torch.Tensor, max_q: int, max_kv: int) -> torch.Tensor:
    """[bs, max_q, max_kv] each request's [n, n] tree mask placed after its prefix columns.

    ``tree_mask`` is flat: request b's block (n_b = extend[b] nodes) starts at sum of n^2 before it.
    """
    if batch.tree_mask is None:
        raise ValueError("TARGET_VERIFY batch needs tree_mask")
    device = extend.device
    flat = batch.tree_mask.to(torch.bool)
    block_start = torch.cumsum(extend * extend, 0) - extend * extend  # [bs]
    row = torch.arange(max_q, device=device)[None, :, None]  # [1, max_q, 1]
    col = torch.arange(max_kv, device=device)[None, None, :] - prefix[:, None, None]  # tree column
    n = extend[:, None, None]
    inside = (row < n) & (col >= 0) & (col < n)  # [bs, max_q, max_kv]
    index = block_start[:, None, None] + row * n + col
    return flat[index.clamp(0, max(flat.numel() - 1, 0))] & inside


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"
    supports_sliding_window = True
    supports_fp8_kv_cache = True
    supports_deterministic = True

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        # deterministic inference: one row at a time over its own KV list (padding changes reductions);
        # a draft step only proposes and keeps the padded plan
        rowwise = batch_invariant_enabled() and batch.draft_ancestors is None
        batch.attn_metadata = plan_row_kv(batch) if rowwise else _padded_metadata(batch)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        md: TorchNativeMetadata | RowKV = batch.attn_metadata
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        batch.kv_cache.set_kv(layer.layer_id, batch.out_cache_loc, k.view(-1, hkv, d), v.view(-1, hkv, d))
        k_buf, v_buf = batch.kv_cache.get_kv(layer.layer_id)
        if isinstance(md, RowKV):
            out = torch.empty(q.shape[0], hq, d, dtype=q.dtype, device=q.device)
            rowwise_attention(q.view(-1, hq, d), k_buf, v_buf, md.kv_table, md.row_list, md.row_lens, out,
                              sm_scale=layer.scaling, max_kv_len=md.max_kv_len, window=layer.sliding_window)
            return out.view(-1, hq * d)
        qs = q.view(-1, hq, d)[md.q_rows].float()  # [num_seqs, max_q, hq, d]
        ks = k_buf[md.kv_slots].float()  # [num_seqs, max_kv, hkv, d]
        vs = v_buf[md.kv_slots].float()
        group = hq // hkv
        qs = qs.view(qs.shape[0], qs.shape[1], hkv, group, d).permute(0, 2, 3, 1, 4)  # [s, hkv, g, q, d]
        scores = torch.einsum("shgqd,skhd->shgqk", qs, ks) * layer.scaling
        scores = scores.masked_fill(~md.window(layer.sliding_window)[:, None, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("shgqk,skhd->sqhgd", probs, vs).reshape(qs.shape[0], -1, hq * d)
        result = torch.empty(q.shape[0], hq * d, dtype=q.dtype, device=q.device)
        result[md.q_rows[md.q_valid]] = out[md.q_valid].to(q.dtype)
        return result
