"""Llama-family target model (Llama 2/3, Mistral, Qwen2 qkv bias, Qwen3 q/k norms) running one ForwardBatch.

Glossary: T = num_tokens of the forward, H = hidden_size, L = num_hidden_layers. The layers
(norms, RoPE, attention, MLP, the decoder layer, and the kernels one layer runs) are
``specdec.models.llama_layers``; this module stacks them and turns the last hidden state into
logits and the features a draft head reads. Parameter names equal Hugging Face's
(``model.layers.{i}.self_attn.q_proj.weight``, ...), so a checkpoint loads with ``load_state_dict``.
Under tensor parallelism (``tp``) the vocabulary is sharded too: an all-gather of the logits.
Gemma 3 (``specdec.models.gemma3``) reuses these parts with its own norms and block.

Every linear layer (the lm_head too) goes through ``ops.gemv.linear``: on a GPU, for a few tokens
(decode, small verify forwards), a Triton skinny GEMM where it beats cuBLAS.

What the target hands a draft head (``LogitsOutput.hidden_states``, per ``capture_hidden_mode``):
* EAGLE-1/2 (``aux_hidden_layers=None``): the final normed hidden state, the lm_head input [*, H];
* EAGLE-3: the residual stream entering each listed layer, concatenated in the listed order
  [*, len(aux_hidden_layers) * H]. Index ``i`` means "the input of layer i"; ``i == L`` means the
  output of the last layer before the final norm (SGLang's ``eagle_aux_hidden_state_layer_ids``
  name layer *outputs*, so checkpoint id ``j`` becomes index ``j + 1`` here).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specdec.forward import CaptureHiddenMode, ForwardBatch, LogitsMode, LogitsOutput, batch_invariant_enabled
from specdec.models.config import KVLayout, LlamaConfig, default_eagle3_layers
from specdec.models.llama_layers import (  # re-exported: the family's parts, importable from here as before
    IdentityNorm,
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    RMSNorm,
    RotaryEmbedding,
    rope_inv_freq,
)
from specdec.models.ops.gemv import linear
from specdec.models.parallel import SINGLE, TPGroup, make_embedding

__all__ = [
    "LlamaConfig",
    "LlamaForCausalLM",
    "KVLayout",
    "default_eagle3_layers",
    "RMSNorm",
    "IdentityNorm",
    "RotaryEmbedding",
    "LlamaAttention",
    "LlamaMLP",
    "LlamaDecoderLayer",
    "rope_inv_freq",
    "select_output",
]


def last_token_rows(batch: ForwardBatch, device: torch.device) -> torch.Tensor:
    """[bs] packed row of each request's last new token (requests are extend_lens segments)."""
    if batch.output_rows is not None:
        return batch.output_rows
    lens = batch.extend_lens.to(device=device, dtype=torch.int64)
    return torch.cumsum(lens, 0) - 1


def select_output(
    x: torch.Tensor,  # [T, F]
    batch: ForwardBatch,
    *,
    last: bool,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:  # [bs, F] when last, else [T, F]
    if not last:
        return x
    return x[rows if rows is not None else last_token_rows(batch, x.device)]


def logits_and_hidden(
    logits_input: torch.Tensor,  # [T, H] what the lm_head reads
    hidden: torch.Tensor | None,  # [T, F] what a draft head conditions on
    lm_head_weight: torch.Tensor,  # [vocab, H] ([chunk, H] this rank's rows under tensor parallelism)
    batch: ForwardBatch,
    *,
    tp: TPGroup = SINGLE,
    vocab_size: int | None = None,
) -> LogitsOutput:
    """Apply logits_mode / capture_hidden_mode; logits are returned in ``batch.logits_dtype`` (fp32
    by default; None: the lm_head's; fp32 always under deterministic inference), all-gathered over
    tensor-parallel ranks and cut to ``vocab_size``."""
    needs_last = batch.logits_mode == LogitsMode.LAST or batch.capture_hidden_mode == CaptureHiddenMode.LAST
    rows = last_token_rows(batch, logits_input.device) if needs_last else None
    x = select_output(logits_input, batch, last=batch.logits_mode == LogitsMode.LAST, rows=rows)
    # NOTE: deterministic inference: fp32 logits, never rounded to the model dtype (near ties stay apart)
    out_dtype = torch.float32 if batch_invariant_enabled() else batch.logits_dtype
    logits = linear(x, lm_head_weight, out_dtype=out_dtype)  # [rows, vocab chunk]
    logits = tp.gather_vocab(logits, vocab_size or lm_head_weight.shape[0])
    captured = None
    if batch.capture_hidden_mode != CaptureHiddenMode.NULL and hidden is not None:
        captured = select_output(hidden, batch, last=batch.capture_hidden_mode == CaptureHiddenMode.LAST, rows=rows)
    return LogitsOutput(next_token_logits=logits, hidden_states=captured)


class LlamaModel(nn.Module):
    def __init__(
        self, config: LlamaConfig, layer_cls: type[nn.Module], norm_cls: type[nn.Module], *,
        dtype: torch.dtype, device: Any, tp: TPGroup,
    ) -> None:
        super().__init__()
        self.embed_tokens = make_embedding(config.vocab_size, config.hidden_size, tp, dtype=dtype, device=device)
        self.layers = nn.ModuleList(
            layer_cls(config, i, dtype=dtype, device=device, tp=tp) for i in range(config.num_hidden_layers)
        )
        self.norm = norm_cls(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)


class LlamaForCausalLM(nn.Module):
    """The target. Subclasses (Gemma 3) swap ``layer_cls`` / ``norm_cls`` and ``embed``."""

    layer_cls: type[nn.Module] = LlamaDecoderLayer
    norm_cls: type[nn.Module] = RMSNorm

    def __init__(
        self,
        config: LlamaConfig,
        *,
        aux_hidden_layers: tuple[int, ...] | list[int] | None = None,
        dtype: torch.dtype = torch.float32,
        device: Any = "cpu",
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        self.config = config
        tp.check(config)
        self.tp = tp
        if aux_hidden_layers is not None:
            aux_hidden_layers = tuple(int(i) for i in aux_hidden_layers)
            bad = [i for i in aux_hidden_layers if not 0 <= i <= config.num_hidden_layers]
            if not aux_hidden_layers or bad:
                raise ValueError(
                    f"aux_hidden_layers={aux_hidden_layers}: need one or more layer indices in "
                    f"[0, {config.num_hidden_layers}] (num_hidden_layers={config.num_hidden_layers})"
                )
        # layer indices whose input is captured for EAGLE-3, or None (capture the final normed state)
        self.aux_hidden_layers: tuple[int, ...] | None = aux_hidden_layers
        self.model = LlamaModel(config, self.layer_cls, self.norm_cls, dtype=dtype, device=device, tp=tp)
        if not config.tie_word_embeddings:
            rows = tp.vocab_chunk(config.vocab_size)
            self.lm_head = nn.Linear(config.hidden_size, rows, bias=False, dtype=dtype, device=device)

    @property
    def embed_tokens(self) -> nn.Module:
        """The token embedding (vocab-parallel under tensor parallelism; callable the same way)."""
        return self.model.embed_tokens

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [vocab, H] ([chunk, H] under tensor parallelism)
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight
        return self.lm_head.weight

    def full_lm_head_weight(self) -> torch.Tensor:  # [vocab, H]
        """The whole lm_head on every rank (all-gathered under tensor parallelism)."""
        return self.tp.gather_rows(self.lm_head_weight, self.config.vocab_size)

    @property
    def hidden_feature_size(self) -> int:
        """Features per token of the captured hidden state (what a draft head's fc reads)."""
        n = 1 if self.aux_hidden_layers is None else len(self.aux_hidden_layers)
        return n * self.config.hidden_size

    @property
    def kv_layout(self) -> KVLayout:
        heads = self.tp.heads(self.config)
        return KVLayout(self.config.num_hidden_layers, heads.num_kv, self.config.head_dim)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        return self.model.embed_tokens(input_ids)

    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        return self.forward_head(*self.forward_body(batch), batch)

    def forward_body(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every token through the layers: ([T, H] the final norm's output, which the lm_head reads;
        [T, F] what a draft head conditions on, or None). A prefill's piecewise CUDA graphs capture
        this part (``specdec.cuda_graph.piecewise``)."""
        x = self.embed(batch.input_ids)  # [T, H]
        residual: torch.Tensor | None = None  # the stream is x + residual (see llama_layers)
        capture = batch.capture_hidden_mode != CaptureHiddenMode.NULL and self.aux_hidden_layers is not None
        # residual stream entering each layer, kept only for the captured ones (index L = last output)
        streams: dict[int, torch.Tensor] = {}
        layers = self.model.layers if batch.num_tokens > 0 else []  # NOTE: no attention call when idle
        for i, layer in enumerate(layers):
            h, stream = layer.enter(x, residual)  # the input norm, and the stream entering layer i
            if capture and i in self.aux_hidden_layers:
                streams[i] = stream
            x, residual = layer.forward_normed(batch.positions, h, stream, batch)
        # h: the stream leaving the last layer (x a partial sum over the tp ranks: the layer's partial_sums)
        normed, h = self.model.norm.forward_add(x, residual, self.tp if self.layer_cls.partial_sums else SINGLE)
        if self.aux_hidden_layers is None:
            hidden = normed
        elif capture:
            hidden = torch.cat([streams.get(i, h) for i in self.aux_hidden_layers], dim=-1)  # [T, len * H]
        else:
            hidden = None
        return normed, hidden

    def forward_head(self, normed: torch.Tensor, hidden: torch.Tensor | None, batch: ForwardBatch) -> LogitsOutput:
        """The logits (and captured hidden states) the batch asks for, from ``forward_body``'s outputs."""
        return logits_and_hidden(normed, hidden, self.lm_head_weight, batch, tp=self.tp,
                                 vocab_size=self.config.vocab_size)
