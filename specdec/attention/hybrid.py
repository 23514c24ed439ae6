"""One backend for prefill, another for everything else (SGLang's ``--prefill-attention-backend`` /
``--decode-attention-backend``).

Prefill and chunked-prefill forwards (``EXTEND``: many query rows per request) go to the prefill
backend; decode, draft steps, target verify and draft extend (a few rows per request, the forwards
that CUDA graphs replay) go to the decode backend. Both read and write the same paged KV cache, so a
request moves between them freely. On the H100, fa4 prefills in about half of triton's time while
triton decodes and verifies faster (``benchmarks/results/2026-11-24-h100-fa4/``): ``fa4:triton``.

A hybrid backend is named ``PREFILL:DECODE`` wherever a backend name goes (``create_attention_backend``).
"""

from __future__ import annotations

import torch

from specdec.attention.base import AttentionBackend, AttentionLayer, StaticPlan
from specdec.forward import ForwardBatch, ForwardMode

SEPARATOR = ":"


def hybrid_name(prefill: str, decode: str) -> str:
    """The backend name of ``prefill`` for prefill forwards and ``decode`` for the rest (one name if equal)."""
    return prefill if prefill == decode else f"{prefill}{SEPARATOR}{decode}"


class HybridAttentionBackend(AttentionBackend):
    def __init__(self, prefill: AttentionBackend, decode: AttentionBackend) -> None:
        self.prefill = prefill
        self.decode = decode
        self.name = hybrid_name(prefill.name, decode.name)
        # graphs capture only decode-side forwards (decode, draft steps, verify, draft extend)
        self.supports_cuda_graph = decode.supports_cuda_graph
        self.plans_on_host = decode.plans_on_host
        self.supports_sliding_window = prefill.supports_sliding_window and decode.supports_sliding_window
        self.supports_fp8_kv_cache = prefill.supports_fp8_kv_cache and decode.supports_fp8_kv_cache

    def backend_for(self, mode: ForwardMode) -> AttentionBackend:
        return self.prefill if mode == ForwardMode.EXTEND else self.decode

    def plan_static(self, plan: StaticPlan) -> None:
        self.decode.plan_static(plan)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.backend_for(batch.forward_mode).init_forward_metadata(batch)

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads * head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        layer: AttentionLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
        return self.backend_for(batch.forward_mode).forward(q, k, v, layer, batch)
