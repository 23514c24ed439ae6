"""EAGLE-3 draft head (checkpoint architecture ``LlamaForCausalLMEagle3``, SGLang ``llama_eagle3.py``).

    h      = fc(hidden) if hidden has 3H features (the target's captured layers) else hidden
    a      = attn(cat(input_layernorm(embed(token)), hidden_norm(h)))     q/k/v read 2H features
    h      = h + a
    h      = h + mlp(post_attention_layernorm(h))          <- returned hidden (next step's input)
    logits = lm_head(norm(h))                              over the draft vocab

Draft ids map to target ids through ``d2t``: ``target = draft + d2t[draft]``; ``t2d[target]`` says
whether a target id is in the draft vocab. Checkpoint names: ``fc.weight``, ``midlayer.*``,
``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d`` (and optionally ``embed_tokens.weight``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specdec.forward import ForwardBatch, LogitsOutput
from specdec.models.eagle import SharedWeights
from specdec.models.llama import KVLayout, LlamaAttention, LlamaConfig, LlamaMLP, RMSNorm, logits_and_hidden
from specdec.models.ops.gemv import linear
from specdec.models.parallel import SINGLE, TPGroup, make_embedding


class Eagle3MidLayer(nn.Module):
    def __init__(self, config: LlamaConfig, *, dtype: torch.dtype, device: Any, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps, dtype=dtype, device=device)
        self.hidden_norm = RMSNorm(h, eps, dtype=dtype, device=device)
        # SGLang builds the 2H-input qkv without bias whatever the config says.
        self.self_attn = LlamaAttention(config, 0, dtype=dtype, device=device, in_features=2 * h, qkv_bias=False,
                                        tp=tp)
        self.post_attention_layernorm = RMSNorm(h, eps, dtype=dtype, device=device)
        self.mlp = LlamaMLP(config, dtype=dtype, device=device, tp=tp)
        self.tp = tp

    def forward(
        self,
        positions: torch.Tensor,  # [T]
        embeds: torch.Tensor,  # [T, H]
        h: torch.Tensor,  # [T, H]
        batch: ForwardBatch,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] MLP output, [T, H] residual)
        """The returned pair sums to the layer's output (the residual add is left to the next norm; with
        several tp ranks the MLP output is this rank's partial sum, all-reduced there too)."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(h)], dim=-1)  # [T, 2H]
        a = self.self_attn(positions, x, batch, reduce=False)
        x, residual = self.post_attention_layernorm.forward_add(a, h, self.tp)  # residual = h + attn
        return self.mlp(x, reduce=False), residual


class Eagle3DraftModel(nn.Module):
    architecture = "LlamaForCausalLMEagle3"

    def __init__(
        self,
        config: LlamaConfig,
        *,
        aux_hidden_layers: tuple[int, ...],
        embed_tokens: nn.Embedding | None,
        draft_vocab_size: int | None = None,
        target_hidden_size: int | None = None,
        lm_head_weight: torch.Tensor | None = None,
        own_embedding: bool = False,
        fc_bias: bool = False,
        dtype: torch.dtype = torch.float32,
        device: Any = "cpu",
        tp: TPGroup = SINGLE,
        target_tp: TPGroup | None = None,
    ) -> None:
        """``aux_hidden_layers``: the target capture indices this head was trained on (see llama.py).
        ``lm_head_weight``: share the target's lm_head instead of owning one (then the draft vocab
        is the full vocab). ``own_embedding``: use a checkpoint embedding instead of the target's.
        ``tp``: shard the layer and the own lm_head as the target's are (``specdec.models.parallel``);
        ``SINGLE`` keeps them whole on every rank (``--speculative-draft-tp replicate``). ``fc``, the
        norms and the token maps stay whole either way. ``target_tp`` (default ``tp``): the group a
        shared ``lm_head_weight``'s rows are cut over (the target's)."""
        super().__init__()
        if config.num_hidden_layers != 1:
            raise ValueError(f"EAGLE-3 draft: num_hidden_layers={config.num_hidden_layers} is not supported (only 1)")
        self.config = config
        self.tp = tp
        # the logits' group: the own lm_head's (tp), or the shared target lm_head's
        self.logits_tp = tp if lm_head_weight is None else (target_tp or tp)
        h, vocab = config.hidden_size, config.vocab_size
        self.draft_vocab_size = int(draft_vocab_size or vocab)
        if lm_head_weight is not None and self.draft_vocab_size != vocab:
            raise ValueError(
                f"EAGLE-3 draft: a shared lm_head needs draft_vocab_size={self.draft_vocab_size} == vocab_size={vocab}"
            )
        self.target_hidden_size = int(target_hidden_size or h)
        self.aux_hidden_layers = tuple(aux_hidden_layers)
        kw = dict(dtype=dtype, device=device)
        if own_embedding:
            self.embed_tokens = make_embedding(vocab, h, tp, **kw)
        elif embed_tokens is None:
            raise ValueError("Eagle3DraftModel needs the target's embed_tokens unless own_embedding=True")
        self.shared = SharedWeights(None if own_embedding else embed_tokens, lm_head_weight)
        self.fc = nn.Linear(len(self.aux_hidden_layers) * self.target_hidden_size, h, bias=fc_bias, **kw)
        self.midlayer = Eagle3MidLayer(config, tp=tp, **kw)
        self.norm = RMSNorm(h, config.rms_norm_eps, **kw)
        if lm_head_weight is None:  # [draft_vocab (this rank's chunk under tensor parallelism), H]
            rows = self.draft_vocab_size if tp.size == 1 else tp.vocab_chunk(self.draft_vocab_size)
            self.lm_head = nn.Linear(h, rows, bias=False, **kw)
        # [draft_vocab] target_id - draft_id; [vocab] True where the target id is in the draft vocab
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.int64, device=device))
        self.register_buffer("t2d", torch.zeros(vocab, dtype=torch.bool, device=device))
        if self.draft_vocab_size == vocab:
            self.t2d.fill_(True)

    @property
    def embedding(self) -> nn.Embedding:
        return self.shared.embed_tokens if self.shared.embed_tokens is not None else self.embed_tokens

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [draft_vocab, H] ([chunk, H] this rank's rows)
        return self.shared.lm_head_weight if self.shared.lm_head_weight is not None else self.lm_head.weight

    @property
    def hidden_feature_size(self) -> int:
        """Features per token this head reads from the target (the concatenated captured layers)."""
        return self.fc.in_features

    @property
    def kv_layout(self) -> KVLayout:
        return KVLayout(1, self.tp.heads(self.config).num_kv, self.config.head_dim)

    def map_draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocab ids -> target-vocab ids (``ids + d2t[ids]``), any shape."""
        return ids + self.d2t[ids]

    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        hidden_in = batch.spec_hidden_states  # [T, 3H] from the target or [T, H] from this head
        if hidden_in is None:
            raise ValueError("EAGLE-3 draft forward needs batch.spec_hidden_states")
        e = self.embedding(batch.input_ids)  # [T, H]
        hidden_in = hidden_in.to(e.dtype)
        features = hidden_in.shape[-1]
        if features == self.config.hidden_size:
            h = hidden_in
        elif features == self.fc.in_features:
            h = linear(hidden_in, self.fc.weight, self.fc.bias)
        else:
            raise ValueError(
                f"EAGLE-3 draft: spec_hidden_states has {features} features; expected "
                f"{self.fc.in_features} (target layers) or {self.config.hidden_size} (own output)"
            )
        residual = None
        if batch.num_tokens > 0:
            h, residual = self.midlayer(batch.positions, e, h, batch)
        normed, h = self.norm.forward_add(h, residual, self.midlayer.tp)  # h: the layer's output, the next step's input
        return logits_and_hidden(normed, h, self.lm_head_weight, batch, tp=self.logits_tp,
                                 vocab_size=self.draft_vocab_size)
