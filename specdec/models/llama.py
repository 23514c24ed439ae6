"""Llama-family target model (Llama 2/3, Mistral, Qwen2 qkv bias, Qwen3 q/k norms) running one ForwardBatch.

Glossary: T = num_tokens of the forward, H = hidden_size, D = head_dim, Hq / Hkv = query / KV
heads, L = num_hidden_layers, I = intermediate_size. Attention goes through ``batch.attn_backend``
(which also writes the KV cache); norms, RoPE and SiLU-and-mul are the fused ops of
``specdec.models.ops`` (Triton on CUDA, the torch reference on CPU). Parameter names equal Hugging
Face's (``model.layers.{i}.self_attn.q_proj.weight``, ...), so a checkpoint loads with
``load_state_dict``; q/k/v and gate/up nevertheless run as one GEMM each (``StackedLinear``).

One decoder layer, as kernels (residual = the residual stream, carried next to each layer's output
so that every residual add happens inside the following norm):

    x, residual = add_rms_norm(x, residual)       input_layernorm (layer 0: rms_norm, residual = x)
    qkv = x @ [Wq | Wk | Wv]^T                     one GEMM, q/k/v are column slices
    apply_rope_(q, k)                              in place
    attn = attention(q, k, v)                      the backend: KV-cache write + attention
    x = attn @ Wo^T
    x, residual = add_rms_norm(x, residual)       post_attention_layernorm
    x = silu_and_mul(x @ [Wgate | Wup]^T) @ Wdown^T

Variation is resolved once, at construction: ``config.qk_norm`` adds per-head q/k RMSNorms before
RoPE (Qwen3), ``config.layer_window(i)`` gives a layer a sliding window (Mistral), ``hidden_act``
picks the gated activation, and ``tp`` (``specdec.models.parallel.TPGroup``) shards heads,
intermediate features and vocabulary over tensor-parallel ranks (one all-reduce after o_proj and
after down_proj, an all-gather of the logits). Gemma 3 (``specdec.models.gemma3``) reuses these
parts with its own norms and block.

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

import math
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from specdec.attention.base import AttentionLayer
from specdec.forward import CaptureHiddenMode, ForwardBatch, LogitsMode, LogitsOutput
from specdec.models.config import KVLayout, LlamaConfig, default_eagle3_layers
from specdec.models.ops import add_rms_norm, apply_rope_, rms_norm, silu_and_mul
from specdec.models.ops.gemv import linear
from specdec.models.ops.stacked_linear import FusedGemmModule, StackedLinear
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
    "select_output",
]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, *, dtype: torch.dtype, device: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        # NOTE: statistics in fp32, then back to the input dtype before the weight (as HF does).
        return rms_norm(x, self.weight, self.eps)

    def forward_add(
        self,
        x: torch.Tensor,  # [T, H]
        residual: torch.Tensor | None,  # [T, H]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] normed, [T, H] residual stream)
        """``(norm(x + residual), x + residual)`` in one kernel; ``(norm(x), x)`` when residual is None."""
        if residual is None:
            return self(x), x
        return add_rms_norm(x, residual, self.weight, self.eps)


class IdentityNorm(nn.Module):
    """No norm (EAGLE-1's first draft layer; no weight in the checkpoint), with RMSNorm's interface."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward_add(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stream = x if residual is None else x + residual
        return stream, stream


def rope_inv_freq(head_dim: int, theta: float, scaling: Mapping[str, Any] | None) -> torch.Tensor:
    """[D/2] fp32 inverse frequencies, with HF's "linear" and "llama3" rope scaling."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return inv
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv / factor
    # llama3: long wavelengths are divided by factor, short ones kept, the band between smoothed.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """HF rotate_half RoPE; cos/sin computed in fp32 from the positions of this forward."""

    def __init__(self, head_dim: int, theta: float, scaling: Mapping[str, Any] | None) -> None:
        super().__init__()
        self.head_dim = head_dim
        # NOTE: a plain attribute, not a buffer, so model.to(bfloat16) cannot round it.
        self._inv_freq = rope_inv_freq(head_dim, theta, scaling)
        self._by_device: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._by_device:
            self._by_device[device] = self._inv_freq.to(device)
        return self._by_device[device]

    def forward(
        self,
        positions: torch.Tensor,  # [T]
        q: torch.Tensor,  # [T, Hq * D] rotated in place
        k: torch.Tensor,  # [T, Hkv * D] rotated in place
    ) -> None:
        apply_rope_(q, k, positions, self.inv_freq(q.device))


def row_parallel(x: torch.Tensor, proj: nn.Linear, tp: TPGroup) -> torch.Tensor:
    """``proj(x)`` for a row-parallel ``proj``: partial sums all-reduced, then the bias once."""
    if tp.size == 1:
        return linear(x, proj.weight, proj.bias)
    out = tp.all_reduce(linear(x, proj.weight))
    return out if proj.bias is None else out + proj.bias


class LlamaAttention(FusedGemmModule):
    """q/k/v as one GEMM, optional per-head q/k norms (``config.qk_norm``), RoPE, the backend's
    attention (a sliding window where ``config.layer_window`` says), o_proj."""

    _stacked_names = ("qkv_proj",)

    def __init__(
        self,
        config: LlamaConfig,
        layer_id: int,
        *,
        dtype: torch.dtype,
        device: Any,
        in_features: int | None = None,
        qkv_bias: bool | None = None,
        norm_cls: type[nn.Module] | None = None,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        shard, d = tp.heads(config), config.head_dim
        hq, hkv = shard.num_q, shard.num_kv
        in_f = in_features or config.hidden_size
        bias = config.attention_bias if qkv_bias is None else qkv_bias
        kw = dict(dtype=dtype, device=device)
        self.q_proj = nn.Linear(in_f, hq * d, bias=bias, **kw)
        self.k_proj = nn.Linear(in_f, hkv * d, bias=bias, **kw)
        self.v_proj = nn.Linear(in_f, hkv * d, bias=bias, **kw)
        self.o_proj = nn.Linear(hq * d, config.hidden_size, bias=config.attention_out_bias, **kw)
        self.qkv_proj = StackedLinear(self.q_proj, self.k_proj, self.v_proj)
        if config.qk_norm:
            norm_cls = norm_cls or RMSNorm
            self.q_norm = norm_cls(d, config.rms_norm_eps, dtype=dtype, device=device)
            self.k_norm = norm_cls(d, config.rms_norm_eps, dtype=dtype, device=device)
        self.qk_norm = config.qk_norm
        self.q_size, self.kv_size, self.head_dim = hq * d, hkv * d, d
        self.tp = tp
        self.rotary = RotaryEmbedding(d, *config.layer_rope(layer_id))
        self.layer = AttentionLayer(
            layer_id=layer_id, num_heads=hq, num_kv_heads=hkv, head_dim=d, scaling=config.attn_scaling,
            sliding_window=config.layer_window(layer_id),
        )

    def forward(self, positions: torch.Tensor, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 * Hkv) * D]
        # NOTE: slices, not split(): autograd allows the in-place RoPE only on single-output views.
        q = qkv[:, : self.q_size]  # [T, Hq * D]
        k = qkv[:, self.q_size : self.q_size + self.kv_size]  # [T, Hkv * D]
        v = qkv[:, self.q_size + self.kv_size :]  # [T, Hkv * D]
        if self.qk_norm:
            t, d = q.shape[0], self.head_dim
            q = self.q_norm(q.reshape(-1, d)).view(t, -1)  # per head: [T * Hq, D]
            k = self.k_norm(k.reshape(-1, d)).view(t, -1)
        self.rotary(positions, q, k)
        out = batch.attn_backend.forward(q, k, v, self.layer, batch)
        return row_parallel(out, self.o_proj, self.tp)


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [T, 2I] -> [T, I]
    """Gemma's GeGLU: gelu(gate, tanh approximation) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


_GATED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": silu_and_mul,
    "gelu_pytorch_tanh": gelu_tanh_and_mul,
}


class LlamaMLP(FusedGemmModule):
    """Gated MLP: down(act(gate(x)) * up(x)), gate and up as one GEMM (SwiGLU, or Gemma's GeGLU)."""

    _stacked_names = ("gate_up_proj",)

    def __init__(self, config: LlamaConfig, *, dtype: torch.dtype, device: Any, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        h, i, b = config.hidden_size, config.intermediate_size // tp.size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=b, dtype=dtype, device=device)
        self.up_proj = nn.Linear(h, i, bias=b, dtype=dtype, device=device)
        self.down_proj = nn.Linear(i, h, bias=b, dtype=dtype, device=device)
        self.gate_up_proj = StackedLinear(self.gate_proj, self.up_proj)
        self.act = _GATED_ACTIVATIONS[config.hidden_act]
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        gate_up = self.gate_up_proj(x)  # [T, 2I]
        return row_parallel(self.act(gate_up), self.down_proj, self.tp)  # [T, I] -> [T, H]


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block on a split residual stream (see the module docstring).

    ``input_norm=False`` gives EAGLE-1's first draft layer (identity input norm).
    """

    def __init__(
        self, config: LlamaConfig, layer_id: int, *, dtype: torch.dtype, device: Any, input_norm: bool = True,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        eps, h = config.rms_norm_eps, config.hidden_size
        self.input_layernorm = RMSNorm(h, eps, dtype=dtype, device=device) if input_norm else IdentityNorm()
        self.self_attn = LlamaAttention(config, layer_id, dtype=dtype, device=device, tp=tp)
        self.post_attention_layernorm = RMSNorm(h, eps, dtype=dtype, device=device)
        self.mlp = LlamaMLP(config, dtype=dtype, device=device, tp=tp)

    def forward(
        self,
        positions: torch.Tensor,  # [T]
        x: torch.Tensor,  # [T, H] previous layer's MLP output (or the layer input when residual is None)
        residual: torch.Tensor | None,  # [T, H]
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] MLP output, [T, H] residual)
        """The residual stream entering the layer is ``x + residual`` (``x`` when residual is None);
        the one leaving it is the sum of the two returned tensors."""
        h, residual = self.input_layernorm.forward_add(x, residual)
        h = self.self_attn(positions, h, batch)
        h, residual = self.post_attention_layernorm.forward_add(h, residual)
        return self.mlp(h), residual


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
    by default; None: the lm_head's), all-gathered over tensor-parallel ranks and cut to ``vocab_size``."""
    needs_last = batch.logits_mode == LogitsMode.LAST or batch.capture_hidden_mode == CaptureHiddenMode.LAST
    rows = last_token_rows(batch, logits_input.device) if needs_last else None
    x = select_output(logits_input, batch, last=batch.logits_mode == LogitsMode.LAST, rows=rows)
    logits = linear(x, lm_head_weight, out_dtype=batch.logits_dtype)  # [rows, vocab chunk]
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
        x = self.embed(batch.input_ids)  # [T, H]
        residual: torch.Tensor | None = None  # the stream is x + residual (see the module docstring)
        capture = batch.capture_hidden_mode != CaptureHiddenMode.NULL and self.aux_hidden_layers is not None
        # residual stream entering each layer, kept only for the captured ones (index L = last output)
        streams: dict[int, torch.Tensor] = {}
        layers = self.model.layers if batch.num_tokens > 0 else []  # NOTE: no attention call when idle
        for i, layer in enumerate(layers):
            if capture and i in self.aux_hidden_layers:
                streams[i] = x if residual is None else x + residual
            x, residual = layer(batch.positions, x, residual, batch)
        normed, h = self.model.norm.forward_add(x, residual)  # h: the stream leaving the last layer
        if self.aux_hidden_layers is None:
            hidden = normed
        elif capture:
            hidden = torch.cat([streams.get(i, h) for i in self.aux_hidden_layers], dim=-1)  # [T, len * H]
        else:
            hidden = None
        return logits_and_hidden(normed, hidden, self.lm_head_weight, batch, tp=self.tp,
                                 vocab_size=self.config.vocab_size)
