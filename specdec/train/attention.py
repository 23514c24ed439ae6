"""Training-time attention: padded [bs, seq_len] batches, causal, with EAGLE-3's training-time test.

A model calls ``batch.attn_backend.forward(q, k, v, layer, batch)`` as at inference; this backend
keeps no KV pool and is differentiable. Rows are ``bs`` right-padded sequences of ``seq_len``
tokens (packed as ``[bs * seq_len]``); padding sits after every real token, so causal attention
never lets a real query see it.

Training-time test (TTT). Step 0 is an ordinary causal forward over the sequence. Step ``s > 0``
feeds every query row its own output of step ``s - 1`` (a draft of depth ``s``). At inference a
depth-``s`` node sees the prefix (step-0 keys of positions <= its root) plus its own ancestors,
so query ``i`` of step ``s`` attends to

    step-0 keys 0..i (causal)   +   keys of steps 1..s at row i only (the diagonal)

Worked example, seq_len 3, step 2 (``x`` = may attend):

    query i   step-0 keys 0 1 2   step-1 key   step-2 key
       0               x . .        k1[0]        k2[0]
       1               x x .        k1[1]        k2[1]
       2               x x x        k1[2]        k2[2]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.attention.base import AttentionLayer
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode


class TTTAttention:
    """Duck-typed attention backend for training forwards (target capture and draft TTT steps)."""

    name = "ttt_train"

    def __init__(self, bs: int, seq_len: int) -> None:
        self.bs = bs
        self.seq_len = seq_len
        self.step = 0
        # layer_id -> [(k, v)] per step, each [bs, hkv, seq_len, d]
        self._kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._bias: torch.Tensor | None = None

    def _causal_bias(self, like: torch.Tensor) -> torch.Tensor:
        """[t, t] additive mask: 0 where key <= query, -inf above the diagonal."""
        if self._bias is None:
            t = self.seq_len
            self._bias = torch.full((t, t), float("-inf"), dtype=like.dtype, device=like.device).triu(1)
        return self._bias

    def next_step(self) -> None:
        """The following forwards are one draft step deeper (their queries see the diagonal keys)."""
        self.step += 1

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.num_tokens != self.bs * self.seq_len:
            raise ValueError(f"TTTAttention: {batch.num_tokens} tokens, expected {self.bs} x {self.seq_len}")

    def forward(
        self,
        q: torch.Tensor,  # [bs * seq_len, hq * d]
        k: torch.Tensor,  # [bs * seq_len, hkv * d]
        v: torch.Tensor,  # [bs * seq_len, hkv * d]
        layer: AttentionLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [bs * seq_len, hq * d]
        b, t = self.bs, self.seq_len
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        g = hq // hkv
        qs = q.view(b, t, hkv, g, d).permute(0, 2, 3, 1, 4)  # [b, hkv, g, t, d]
        ks = k.view(b, t, hkv, d).transpose(1, 2)  # [b, hkv, t, d]
        vs = v.view(b, t, hkv, d).transpose(1, 2)
        cache = self._kv.setdefault(layer.layer_id, [])
        if len(cache) != self.step:
            raise ValueError(f"TTTAttention: layer {layer.layer_id} ran {len(cache)} steps, expected {self.step}")
        cache.append((ks, vs))
        k0, v0 = cache[0]
        if self.step == 0:
            # plain causal attention: the fused kernel (exact, and much cheaper to differentiate)
            out = F.scaled_dot_product_attention(
                qs.reshape(b, hq, t, d), k0, v0, is_causal=True, scale=layer.scaling, enable_gqa=True
            ).view(b, hkv, g, t, d)
        else:
            scores = torch.einsum("bhgqd,bhkd->bhgqk", qs, k0) * layer.scaling + self._causal_bias(q)
            ks_diag = torch.stack([kk for kk, _ in cache[1:]], dim=-2)  # [b, hkv, t, s, d]
            vs_diag = torch.stack([vv for _, vv in cache[1:]], dim=-2)
            diag = torch.einsum("bhgqd,bhqsd->bhgqs", qs, ks_diag) * layer.scaling  # [b, hkv, g, t, s]
            probs = torch.softmax(torch.cat([scores, diag], dim=-1).float(), dim=-1).to(q.dtype)
            p0, pd = probs[..., :t], probs[..., t:]
            out = torch.einsum("bhgqk,bhkd->bhgqd", p0, v0) + torch.einsum("bhgqs,bhqsd->bhgqd", pd, vs_diag)
        return out.permute(0, 3, 1, 2, 4).reshape(b * t, hq * d)  # [b*t, hq*d]


def training_batch(
    input_ids: torch.Tensor,  # [bs, seq_len]
    backend: TTTAttention,
    *,
    spec_hidden_states: torch.Tensor | None = None,  # [bs * seq_len, features]
    position_offset: int = 0,
) -> ForwardBatch:
    """A ForwardBatch over a padded batch for ``backend`` (all logits, all hidden states)."""
    b, t = input_ids.shape
    device = input_ids.device
    positions = (torch.arange(t, device=device) + position_offset).repeat(b)  # [b*t]
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        input_ids=input_ids.reshape(-1),
        positions=positions,
        out_cache_loc=torch.arange(b * t, device=device),
        req_pool_indices=torch.arange(b, device=device),
        prefix_lens=torch.zeros(b, dtype=torch.int64, device=device),
        extend_lens=torch.full((b,), t, dtype=torch.int64, device=device),
        req_to_token=torch.empty(0, dtype=torch.int32, device=device),
        kv_cache=None,
        attn_backend=backend,
        logits_mode=LogitsMode.ALL,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        spec_hidden_states=spec_hidden_states,
        prefix_lens_cpu=[0] * b,
        extend_lens_cpu=[t] * b,
    )
