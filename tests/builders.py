"""Tiny random models for tests, a perfect-draft fixture, and a single-sequence CPU runner.

Perfect-draft pair (``make_perfect_draft_pair``): every target layer has zero ``o_proj`` and
``down_proj``, so the residual stream is just ``embed(x)`` and the next token depends only on the
current one: ``f(x) = argmax lm_head(norm(embed(x)))``. Embedding rows have unit RMS, so
``norm(embed(x)) == embed(x)`` (up to eps), and a draft that reproduces ``embed(x_cur)`` for its
input token predicts exactly ``f(x_cur)``, the token the target will verify next.

* EAGLE: ``fc = [c·I | 0]`` keeps the (scaled) token embedding; the layer adds nothing (zero
  o/down proj) and there is no final norm, so the draft logits are c times the target's.
* EAGLE-3: ``fc`` keeps one captured copy of ``embed(x_prev)``; the mid layer attends only to
  itself (q·k is a constant vector's RoPE self-similarity, scaled so every other position is
  ~100 logits lower) and its value/output projections add ``embed(x_cur) - hidden`` on the
  "token" dims, turning the residual ``embed(x_prev)`` into ``embed(x_cur)``.
  Embedding layout: dims [0, A) hold token features, dims [A, A+3) a constant vector u that feeds
  q/k; A = min(Hkv * D, H - 3) so the value path (Hkv * D wide) can carry the token features.

The target's lm_head maps each token to a distinct next token with a clear logit margin, and the
drafts' logits are the target's scaled by ~2-3 (confident, never exactly one-hot), so a tree's
cumulative scores keep the correct chain on top.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from specdec.attention.kv_cache import KVCache
from specdec.attention.torch_native import TorchNativeBackend
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode, LogitsOutput
from specdec.models.eagle import EagleDraftModel
from specdec.models.eagle3 import Eagle3DraftModel
from specdec.models.llama import LlamaConfig, LlamaForCausalLM, default_eagle3_layers


def tiny_llama_config(**overrides: Any) -> LlamaConfig:
    """vocab 97 (not a power of two), H 64, 4 layers, 4 query / 2 KV heads (GQA), D 16."""
    base = dict(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
    )
    base.update(overrides)
    return LlamaConfig(**base)


@torch.no_grad()
def randomize_(module: nn.Module, seed: int) -> nn.Module:
    """Fill every parameter with seeded random values (norm weights near 1, matrices ~1/sqrt(fan_in))."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
        r = torch.randn(p.shape, generator=gen)
        if name.endswith("norm.weight"):
            r = 1.0 + 0.1 * r
        elif name.endswith("bias"):
            r = 0.1 * r
        elif "embed_tokens" not in name:
            r = r / math.sqrt(p.shape[-1])
        p.copy_(r.to(p.dtype))
    return module


def _dtype_of(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def make_random_target(
    config: LlamaConfig | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    *,
    aux_hidden_layers: tuple[int, ...] | None = None,
    device: Any = "cpu",
) -> LlamaForCausalLM:
    config = config or tiny_llama_config()
    model = LlamaForCausalLM(config, aux_hidden_layers=aux_hidden_layers, dtype=dtype, device=device)
    return randomize_(model, seed).eval()


def make_random_eagle_head(target: LlamaForCausalLM, seed: int = 0) -> EagleDraftModel:
    config = dataclasses.replace(target.config, num_hidden_layers=1)
    head = EagleDraftModel(
        config, embed_tokens=target.embed_tokens, lm_head_weight=target.lm_head_weight,
        dtype=_dtype_of(target), device=target.lm_head_weight.device,
    )
    return randomize_(head, seed).eval()


def make_random_eagle3_head(
    target: LlamaForCausalLM, seed: int = 0, draft_vocab_size: int | None = None
) -> Eagle3DraftModel:
    """A random EAGLE-3 head; a smaller ``draft_vocab_size`` keeps a random sorted subset of ids."""
    if target.aux_hidden_layers is None:
        raise ValueError("an EAGLE-3 head needs a target built with aux_hidden_layers")
    config = dataclasses.replace(target.config, num_hidden_layers=1)
    vocab = config.vocab_size
    draft_vocab = draft_vocab_size or vocab
    head = Eagle3DraftModel(
        config, aux_hidden_layers=target.aux_hidden_layers, embed_tokens=target.embed_tokens,
        draft_vocab_size=draft_vocab, dtype=_dtype_of(target), device=target.lm_head_weight.device,
    )
    randomize_(head, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    kept = torch.sort(torch.randperm(vocab, generator=gen)[:draft_vocab]).values  # [draft_vocab] target ids
    head.d2t.copy_(kept - torch.arange(draft_vocab))
    head.t2d.zero_()
    head.t2d[kept] = True
    return head.eval()


# ----------------------------------------------------------------------------- perfect draft


def _structured_embedding(config: LlamaConfig, token_dims: int, gen: torch.Generator) -> torch.Tensor:
    """[vocab, H] rows with unit RMS: random token features on [0, A), constant u=2 on [A, A+3)."""
    h = config.hidden_size
    emb = torch.zeros(config.vocab_size, h)
    feats = torch.randn(config.vocab_size, token_dims, generator=gen)
    u_energy = 3 * 2.0**2
    emb[:, :token_dims] = feats / feats.norm(dim=-1, keepdim=True) * math.sqrt(h - u_energy)
    emb[:, token_dims : token_dims + 3] = 2.0
    return emb


def _designed_lm_head(embedding: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """[vocab, H] head whose next token is a random permutation of the current one, with margin.

    Row v = 8 * embed(perm[v]) / H (+ small noise): token x scores ~8 on v = perm^-1(x) and at most
    ~5 elsewhere, so the top-1 / top-2 gaps stay within a narrow range (no near ties).
    """
    vocab, h = embedding.shape
    perm = torch.randperm(vocab, generator=gen)
    return 0.3 * torch.randn(vocab, h, generator=gen) / math.sqrt(h) + 8.0 * embedding[perm] / h


def _sharpness(target: LlamaForCausalLM) -> float:
    """Logit scale for the draft: confident (top-1 well ahead) but never a probability of exactly 1.

    NOTE: a tree keeps the highest *cumulative* draft scores, so a flat draft would let shallow
    siblings outrank the deep correct chain; an over-sharp one (probabilities rounding to 1 or 0)
    would tie a node with its child and let the tree keep a child without its parent.
    """
    logits = target.model.norm(target.embed_tokens.weight.double()) @ target.lm_head_weight.double().T
    top = logits.topk(2, dim=-1).values  # [vocab, 2]
    return 12.0 / float((top[:, 0] - top[:, 1]).max())


def _self_attention_gain(draft: Eagle3DraftModel, max_distance: int) -> float:
    """Scale for q so that position 0 out-scores every other distance by ~100 logits."""
    inv = draft.midlayer.self_attn.rotary.inv_freq(torch.device("cpu"))[:3].double()
    dist = torch.arange(1, max_distance + 1, dtype=torch.float64)[:, None]
    gap = float((3 - torch.cos(dist * inv).sum(-1)).min()) * 4.0  # u_i^2 = 4 per pair
    if gap <= 1e-6:
        raise ValueError("perfect-draft fixture: RoPE frequencies too slow to single out position 0")
    return 100.0 / (gap * draft.config.head_dim**-0.5)


@torch.no_grad()
def _make_eagle3_perfect(target: LlamaForCausalLM, token_dims: int, seed: int) -> Eagle3DraftModel:
    c = target.config
    h, d, hkv = c.hidden_size, c.head_dim, c.num_key_value_heads
    group = c.num_attention_heads // hkv
    draft = make_random_eagle3_head(target, seed=seed)
    draft.d2t.zero_()
    draft.t2d.fill_(True)
    draft.lm_head.weight.copy_(target.lm_head_weight * _sharpness(target))
    for norm in (draft.norm, draft.midlayer.input_layernorm, draft.midlayer.hidden_norm):
        norm.weight.fill_(1.0)
    draft.midlayer.mlp.down_proj.weight.zero_()
    n_aux = len(target.aux_hidden_layers)
    draft.fc.weight.copy_(torch.cat([torch.eye(h)] + [torch.zeros(h, h)] * (n_aux - 1), dim=1))
    attn = draft.midlayer.self_attn
    gain = _self_attention_gain(draft, c.max_position_embeddings)
    for w in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight):
        w.zero_()
    for i in range(3):  # q/k read u (first half of the 2H input = normed embedding), pair i of each head
        attn.q_proj.weight[torch.arange(c.num_attention_heads) * d + i, token_dims + i] = gain
        attn.k_proj.weight[torch.arange(hkv) * d + i, token_dims + i] = 1.0
    j = torch.arange(token_dims)
    attn.v_proj.weight[j, j] = 1.0  # + norm(embed(x_cur)) ...
    attn.v_proj.weight[j, h + j] = -1.0  # ... - norm(hidden), on the token dims
    attn.o_proj.weight[j, (j // d) * group * d + j % d] = 1.0  # first query head of each KV group
    return draft.eval()


@torch.no_grad()
def make_perfect_draft_pair(
    config: LlamaConfig, algorithm: str, *, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[LlamaForCausalLM, EagleDraftModel | Eagle3DraftModel]:
    """(target, draft) whose greedy draft prediction always equals the target's next token.

    ``algorithm``: "EAGLE" or "EAGLE3". A tied config is untied (a tied head would always
    predict the current token again). See the module docstring for the construction.
    """
    algorithm = algorithm.upper()
    if algorithm not in ("EAGLE", "EAGLE3"):
        raise ValueError(f"algorithm={algorithm!r}: expected EAGLE or EAGLE3")
    config = dataclasses.replace(config, tie_word_embeddings=False)
    h, d = config.hidden_size, config.head_dim
    token_dims = min(config.num_key_value_heads * d, h - 3)
    if algorithm == "EAGLE3" and (d < 6 or token_dims < 1):
        raise ValueError(f"perfect EAGLE-3 fixture needs head_dim >= 6 and hidden_size >= 4 (got {d}, {h})")
    aux = default_eagle3_layers(config.num_hidden_layers) if algorithm == "EAGLE3" else None
    target = make_random_target(config, seed, torch.float32, aux_hidden_layers=aux)
    gen = torch.Generator().manual_seed(seed + 7)
    emb = _structured_embedding(config, token_dims if algorithm == "EAGLE3" else h - 3, gen)
    target.embed_tokens.weight.copy_(emb)
    target.model.norm.weight.fill_(1.0)
    target.lm_head.weight.copy_(_designed_lm_head(target.embed_tokens.weight, gen))
    for layer in target.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    if algorithm == "EAGLE":
        draft: EagleDraftModel | Eagle3DraftModel = make_random_eagle_head(target, seed + 1)
        # scaling the kept embedding by c scales the (norm-free) logits by c; the next step's fc
        # reads only the token half, so the scale does not compound
        c = _sharpness(target)
        draft.fc.weight.copy_(torch.cat([c * torch.eye(h), torch.zeros(h, h)], dim=1))
        draft.fc.bias.zero_()
        for layer in draft.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    else:
        draft = _make_eagle3_perfect(target, token_dims, seed + 1)
    return target.to(dtype), draft.to(dtype)


# ----------------------------------------------------------------------------- standalone runner


class StandaloneRunner:
    """Runs one model over one sequence on CPU: a prefill, then any number of appended chunks.

    KV slot of position p is p (``req_to_token`` is the identity), so no paging is involved.
    """

    def __init__(self, model: nn.Module, max_len: int) -> None:
        layout = model.kv_layout
        weight = next(model.parameters())
        self.model = model
        self.max_len = max_len
        self.cache = KVCache(num_layers=layout.num_layers, num_slots=max_len, num_kv_heads=layout.num_kv_heads,
                             head_dim=layout.head_dim, dtype=weight.dtype, device=weight.device)
        self.backend = TorchNativeBackend()
        self.req_to_token = torch.arange(max_len, dtype=torch.int32, device=weight.device)[None]
        self.seq_len = 0

    @torch.no_grad()
    def forward(
        self,
        input_ids: list[int] | torch.Tensor,
        *,
        spec_hidden_states: torch.Tensor | None = None,
        logits_mode: LogitsMode = LogitsMode.ALL,
        logits_dtype: torch.dtype | None = torch.float32,
        capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL,
    ) -> LogitsOutput:
        device = self.req_to_token.device
        ids = torch.as_tensor(input_ids, dtype=torch.int64, device=device).view(-1)
        n = int(ids.shape[0])
        if self.seq_len + n > self.max_len:
            raise ValueError(f"StandaloneRunner: {self.seq_len + n} tokens exceed max_len={self.max_len}")
        pos = torch.arange(self.seq_len, self.seq_len + n, device=device)
        batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE if self.seq_len and n == 1 else ForwardMode.EXTEND,
            input_ids=ids, positions=pos, out_cache_loc=pos.clone(),
            req_pool_indices=torch.zeros(1, dtype=torch.int64, device=device),
            prefix_lens=torch.tensor([self.seq_len], device=device),
            extend_lens=torch.tensor([n], device=device),
            req_to_token=self.req_to_token, kv_cache=self.cache, attn_backend=self.backend,
            logits_mode=logits_mode, logits_dtype=logits_dtype, capture_hidden_mode=capture_hidden_mode,
            spec_hidden_states=spec_hidden_states, prefix_lens_cpu=[self.seq_len], extend_lens_cpu=[n],
        )
        self.backend.init_forward_metadata(batch)
        out = self.model(batch)
        self.seq_len += n
        return out


def greedy_generate_reference(
    model: LlamaForCausalLM, prompt_ids: list[int], max_new_tokens: int
) -> list[int]:
    """Plain greedy decoding (prefill, then one token per forward); returns the new tokens."""
    runner = StandaloneRunner(model, len(prompt_ids) + max_new_tokens)
    out: list[int] = []
    logits = runner.forward(prompt_ids, logits_mode=LogitsMode.LAST).next_token_logits
    while len(out) < max_new_tokens:
        out.append(int(logits[-1].argmax()))
        if len(out) < max_new_tokens:
            logits = runner.forward([out[-1]], logits_mode=LogitsMode.LAST).next_token_logits
    return out
