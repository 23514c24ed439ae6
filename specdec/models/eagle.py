"""EAGLE-1/2 draft head (checkpoint architecture ``LlamaForCausalLMEagle``, SGLang ``llama_eagle.py``).

    x      = fc(cat(embed(token), hidden))        fc: Linear(2H -> H, bias=True)
    x      = decoder layers (layer 0's input norm is the identity)
    logits = lm_head(x)                            no final norm; lm_head shared with the target

``hidden`` is the target's final normed hidden state at the previous position for the first draft
step, then the head's own output ``x`` (which this forward returns as ``hidden_states``).
Checkpoint weight names: ``fc.weight``, ``fc.bias``, ``layers.{i}.self_attn.q_proj.weight``, ...,
``layers.{i}.post_attention_layernorm.weight`` (no ``layers.0.input_layernorm``), and optionally
``embed_tokens.weight`` (then the head uses its own embedding instead of the target's).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from specdec.forward import ForwardBatch, LogitsOutput
from specdec.models.llama import KVLayout, LlamaConfig, LlamaDecoderLayer, logits_and_hidden
from specdec.models.ops.gemv import linear
from specdec.models.parallel import SINGLE, TPGroup, make_embedding


@dataclasses.dataclass(frozen=True)
class SharedWeights:
    """Target weights a draft head reads but does not own (not registered, never saved).

    NOTE: holding the Parameter / Module objects (not their data) keeps the sharing intact when
    the target is later moved with ``.to()``.
    """

    embed_tokens: nn.Embedding | None
    # [vocab, H]
    lm_head_weight: torch.Tensor | None


class EagleDraftModel(nn.Module):
    architecture = "LlamaForCausalLMEagle"

    def __init__(
        self,
        config: LlamaConfig,
        *,
        embed_tokens: nn.Embedding | None,
        lm_head_weight: torch.Tensor,
        own_embedding: bool = False,
        fc_bias: bool = True,
        hot_token_ids: torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
        device: Any = "cpu",
        tp: TPGroup = SINGLE,
        target_tp: TPGroup | None = None,
    ) -> None:
        """``embed_tokens`` / ``lm_head_weight`` come from the target; ``own_embedding`` gives the
        head its own ``embed_tokens`` (when its checkpoint has one) instead of the target's.

        ``hot_token_ids`` ([draft_vocab] target ids, EAGLE-2's ``--speculative-token-map``): the
        head predicts over these tokens only; ``lm_head_weight`` then holds just their rows, whole
        on every rank. Otherwise, under tensor parallelism (``target_tp``, default ``tp``),
        ``lm_head_weight`` is the target's shard and the logits are gathered. ``tp``: the group the
        head's own weights (decoder layers, own embedding) are sharded over; ``SINGLE`` keeps them
        whole on every rank (``--speculative-draft-tp replicate``).
        """
        super().__init__()
        self.config = config
        self.tp = tp
        # the logits' group: a token map's rows are whole on every rank, the target's lm_head is cut
        self.logits_tp = SINGLE if hot_token_ids is not None else (target_tp or tp)
        h = config.hidden_size
        if own_embedding:
            self.embed_tokens = make_embedding(config.vocab_size, h, tp, dtype=dtype, device=device)
        elif embed_tokens is None:
            raise ValueError("EagleDraftModel needs the target's embed_tokens unless own_embedding=True")
        self.shared = SharedWeights(None if own_embedding else embed_tokens, lm_head_weight)
        self.fc = nn.Linear(2 * h, h, bias=fc_bias, dtype=dtype, device=device)
        if hot_token_ids is not None and hot_token_ids.shape[0] != lm_head_weight.shape[0]:
            raise ValueError("hot_token_ids and lm_head_weight rows differ")
        # not part of the checkpoint format: it comes from the token-map file
        self.register_buffer("hot_token_ids", hot_token_ids, persistent=False)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, dtype=dtype, device=device, input_norm=i != 0, tp=tp)
            for i in range(config.num_hidden_layers)
        )

    @property
    def embedding(self) -> nn.Embedding:
        return self.shared.embed_tokens if self.shared.embed_tokens is not None else self.embed_tokens

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [vocab, H] ([chunk, H] under tensor parallelism; hot rows)
        return self.shared.lm_head_weight

    @property
    def hidden_feature_size(self) -> int:
        """Features per token this head reads from the target (the final hidden state)."""
        return self.config.hidden_size

    @property
    def kv_layout(self) -> KVLayout:
        c = self.config
        return KVLayout(c.num_hidden_layers, self.tp.heads(c).num_kv, c.head_dim)

    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        hidden_in = batch.spec_hidden_states  # [T, H]
        if hidden_in is None:
            raise ValueError("EAGLE draft forward needs batch.spec_hidden_states")
        e = self.embedding(batch.input_ids)  # [T, H]
        if hidden_in.shape != e.shape:
            raise ValueError(
                f"EAGLE draft: spec_hidden_states has shape {tuple(hidden_in.shape)}, expected {tuple(e.shape)}"
            )
        h = linear(torch.cat([e, hidden_in.to(e.dtype)], dim=-1), self.fc.weight, self.fc.bias)  # [T, H]
        if batch.num_tokens > 0:
            residual = None  # the stream is h + residual (see specdec.models.llama)
            for layer in self.layers:
                h, residual = layer(batch.positions, h, residual, batch)
            h = self.tp.all_reduce(h) + residual  # NOTE: h a partial sum (LlamaDecoderLayer.partial_sums)
        vocab = self.lm_head_weight.shape[0] if self.logits_tp.size == 1 else self.config.vocab_size
        return logits_and_hidden(h, h, self.lm_head_weight, batch, tp=self.logits_tp, vocab_size=vocab)
