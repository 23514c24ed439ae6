"""Pure-torch attention over the paged KV cache: the reference every other backend is tested against.

Runs on CPU and GPU. Sequences of the ragged layout are padded to one batched attention call;
scores are computed in fp32 whatever the cache dtype.
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.attention.base import AttentionBackend, AttentionLayer
from specdec.attention.layout import RaggedLayout, build_ragged_layout
from specdec.forward import ForwardBatch


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


def _padded_metadata(layout: RaggedLayout, device: torch.device) -> TorchNativeMetadata:
    n = layout.num_seqs
    max_q = max(layout.q_lens, default=1) or 1
    max_kv = max(layout.kv_lens, default=1) or 1
    q_rows = torch.zeros(n, max_q, dtype=torch.int64, device=device)
    q_valid = torch.zeros(n, max_q, dtype=torch.bool, device=device)
    kv_slots = torch.zeros(n, max_kv, dtype=torch.int64, device=device)
    allowed = torch.zeros(n, max_q, max_kv, dtype=torch.bool, device=device)
    qo = layout.qo_indptr.tolist()
    kvp = layout.kv_indptr.tolist()
    mp = layout.mask_indptr.tolist() if layout.mask_indptr is not None else None
    for s, (q, kv) in enumerate(zip(layout.q_lens, layout.kv_lens)):
        q_rows[s, :q] = torch.arange(qo[s], qo[s] + q, device=device)
        q_valid[s, :q] = True
        kv_slots[s, :kv] = layout.kv_indices[kvp[s] : kvp[s] + kv]
        if mp is not None:
            allowed[s, :q, :kv] = layout.mask[mp[s] : mp[s + 1]].view(q, kv)
        else:
            rows = torch.arange(q, device=device).unsqueeze(1)
            cols = torch.arange(kv, device=device).unsqueeze(0)
            allowed[s, :q, :kv] = cols <= rows + (kv - q)
    # NOTE: padded query rows get one visible column so softmax stays finite; they are dropped.
    allowed[:, :, 0] |= ~q_valid
    return TorchNativeMetadata(q_rows=q_rows, q_valid=q_valid, kv_slots=kv_slots, allowed=allowed)


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        layout = build_ragged_layout(batch)
        batch.attn_metadata = _padded_metadata(layout, batch.input_ids.device)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        md: TorchNativeMetadata = batch.attn_metadata
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        batch.kv_cache.set_kv(layer.layer_id, batch.out_cache_loc, k.view(-1, hkv, d), v.view(-1, hkv, d))
        k_buf, v_buf = batch.kv_cache.get_kv(layer.layer_id)
        qs = q.view(-1, hq, d)[md.q_rows].float()  # [num_seqs, max_q, hq, d]
        ks = k_buf[md.kv_slots].float()  # [num_seqs, max_kv, hkv, d]
        vs = v_buf[md.kv_slots].float()
        group = hq // hkv
        qs = qs.view(qs.shape[0], qs.shape[1], hkv, group, d).permute(0, 2, 3, 1, 4)  # [s, hkv, g, q, d]
        scores = torch.einsum("shgqd,skhd->shgqk", qs, ks) * layer.scaling
        scores = scores.masked_fill(~md.allowed[:, None, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("shgqk,skhd->sqhgd", probs, vs).reshape(qs.shape[0], -1, hq * d)
        result = torch.empty(q.shape[0], hq * d, dtype=q.dtype, device=q.device)
        result[md.q_rows[md.q_valid]] = out[md.q_valid].to(q.dtype)
        return result
