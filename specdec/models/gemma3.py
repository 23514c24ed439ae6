"""Gemma 3 target (HF ``Gemma3ForCausalLM``, ``model_type: gemma3_text``), built from the Llama parts.

What differs from Llama, each resolved at construction:
* RMSNorm scales by ``1 + weight`` (weights stored as offsets from 1), in fp32 before the cast;
* the embedding is multiplied by sqrt(hidden_size) (rounded to the model dtype, as HF does);
* four norms per block ("sandwich"): the attention and the MLP outputs are each normed before
  they join the residual stream;
* per-head q/k norms, scores scaled by ``query_pre_attn_scalar ** -0.5``;
* GeGLU MLP (gelu with tanh approximation);
* sliding-window layers interleaved with global ones (``layer_types``), the local ones with
  their own RoPE theta (``rope_local_base_freq``) and no rope scaling.

One block (the stream is the residual stream; ``residual`` carries it as in ``specdec.models.llama``):

    h = post_attention_layernorm(attn(input_layernorm(stream)));  stream = stream + h
    h = post_feedforward_layernorm(mlp(pre_feedforward_layernorm(stream)))   -> returned with stream
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specdec.forward import ForwardBatch
from specdec.models.config import LlamaConfig
from specdec.models import ops
from specdec.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from specdec.models.parallel import SINGLE, TPGroup

__all__ = ["GemmaRMSNorm", "Gemma3DecoderLayer", "Gemma3ForCausalLM"]


class GemmaRMSNorm(nn.Module):
    """``x / rms(x) * (1 + weight)`` in fp32, then cast (HF ``Gemma3RMSNorm``); RMSNorm's interface.
    One kernel a call (``ops.scaled_rms_norm``), its fp32 scale ``1 + weight`` computed once per
    weight (eagerly, each of the ~8 elementwise ops a kernel, 109 norms made most of a Gemma-3-270M
    decode step's ~1,700 kernels on an H200)."""

    def __init__(self, size: int, eps: float, *, dtype: torch.dtype, device: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size, dtype=dtype, device=device))
        self.eps = eps
        self._scale: tuple[tuple[int, int, int], torch.Tensor] | None = None  # (the weight's identity, 1 + w)

    def scale(self) -> torch.Tensor:  # [H] float32
        """``1 + weight`` in fp32, recomputed only when the weight changes (loaded, moved, edited).
        NOTE: a CUDA graph captures the tensor returned: the weights are loaded before any capture."""
        key = (self.weight.data_ptr(), self.weight._version, self.weight.device.index or 0)
        if self._scale is None or self._scale[0] != key:
            self._scale = (key, 1.0 + self.weight.detach().float())
        return self._scale[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        return ops.scaled_rms_norm(x, self.scale(), self.eps)

    def forward_add(
        self, x: torch.Tensor, residual: torch.Tensor | None, tp: TPGroup = SINGLE
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] normed, [T, H] stream)
        """As ``RMSNorm.forward_add`` (``x`` beside a residual a partial sum over several ``tp`` ranks)."""
        if residual is None:
            return self(x), x
        return ops.add_scaled_rms_norm(tp.all_reduce(x), residual, self.scale(), self.eps)


class Gemma3DecoderLayer(nn.Module):
    partial_sums = False  # its outputs are whole: each is normed after its all-reduce (sandwich norms)

    def __init__(self, config: LlamaConfig, layer_id: int, *, dtype: torch.dtype, device: Any,
                 tp: TPGroup = SINGLE) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps, **kw)
        self.self_attn = LlamaAttention(config, layer_id, norm_cls=GemmaRMSNorm, tp=tp, **kw)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps, **kw)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps, **kw)
        self.mlp = LlamaMLP(config, tp=tp, **kw)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps, **kw)

    def forward(
        self,
        positions: torch.Tensor,  # [T]
        x: torch.Tensor,  # [T, H]
        residual: torch.Tensor | None,  # [T, H]
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] normed MLP output, [T, H] stream after attention)
        return self.forward_normed(positions, *self.enter(x, residual), batch)

    def enter(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """([T, H] the input norm's output, [T, H] the stream entering the layer)."""
        return self.input_layernorm.forward_add(x, residual)

    def forward_normed(self, positions: torch.Tensor, h: torch.Tensor, stream: torch.Tensor,
                       batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        stream = stream + self.post_attention_layernorm(self.self_attn(positions, h, batch))
        h = self.mlp(self.pre_feedforward_layernorm(stream))
        return self.post_feedforward_layernorm(h), stream


class Gemma3ForCausalLM(LlamaForCausalLM):
    layer_cls = Gemma3DecoderLayer
    norm_cls = GemmaRMSNorm

    def __init__(self, config: LlamaConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.embed_scale = config.hidden_size**0.5

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        x = self.model.embed_tokens(input_ids)
        # NOTE: HF rounds the scale to the model dtype before multiplying (a Python float here: no
        # host tensor inside a CUDA graph)
        return x * float(torch.tensor(self.embed_scale, dtype=x.dtype))
