"""ModelRunner: runs the target model over one ForwardBatch (the host side of specdec.host)."""

from __future__ import annotations

import torch

from specdec.attention import KVCache
from specdec.forward import ForwardBatch, LogitsOutput


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, attn_backend) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.attn_backend = attn_backend
        cfg = model.config
        self.hidden_size = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        self.aux_hidden_layers = getattr(model, "aux_hidden_layers", None) or None

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.lm_head_weight

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        self.attn_backend.init_forward_metadata(batch)
        return self.model(batch)
