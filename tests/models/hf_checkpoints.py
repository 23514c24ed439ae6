"""Tiny random HF checkpoints of every registered architecture, written by ``transformers`` itself
(as a new user's checkpoint would be): sharded safetensors with an index, config.json from the
transformers config class. Hidden 64, 2 layers, vocab 97, GQA 4/2 heads.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from specdec.models.config import LlamaConfig
from specdec.models.eagle3 import Eagle3DraftModel
from specdec.models.loaders import save_draft_head

ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma3")
BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
            pad_token_id=0)


def hf_config(arch: str, **overrides):
    import transformers as T

    kw = {**BASE, **overrides}
    if arch == "llama":
        return T.LlamaConfig(**kw)
    if arch == "qwen2":
        return T.Qwen2Config(**kw)
    if arch == "qwen3":
        return T.Qwen3Config(**kw)
    if arch == "mistral":
        return T.MistralConfig(**{"sliding_window": 5, **kw})
    if arch == "gemma3":
        kw = {"sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"],
              "query_pre_attn_scalar": 24, "tie_word_embeddings": True, **kw}
        return T.Gemma3TextConfig(**kw)
    raise ValueError(arch)


@torch.no_grad()
def make_hf_model(arch: str, seed: int = 0, **overrides):
    """A random transformers model (fp32, eager attention) whose weights are all O(1)-informative."""
    import transformers as T

    config = hf_config(arch, **overrides)
    config._attn_implementation = "eager"
    cls = {"gemma3": T.Gemma3ForCausalLM}.get(arch, T.AutoModelForCausalLM)
    model = cls.from_config(config) if cls is T.AutoModelForCausalLM else cls(config)
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        r = torch.randn(p.shape, generator=gen)
        if name.endswith("norm.weight"):
            r = (0.0 if arch == "gemma3" else 1.0) + 0.1 * r
        elif name.endswith("bias"):
            r = 0.1 * r
        elif "embed_tokens" not in name:
            r = r / math.sqrt(p.shape[-1])
        p.copy_(r)
    return model.eval()


def write_hf_checkpoint(arch: str, path: Path, seed: int = 0, **overrides):
    """(transformers model, path): config.json plus several safetensors shards and their index."""
    model = make_hf_model(arch, seed, **overrides)
    model.save_pretrained(str(path), max_shard_size="40KB")
    return model, path


def hf_logits(model, ids: list[int]) -> torch.Tensor:  # [T, vocab]
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def eagle3_head_config(target: LlamaConfig) -> LlamaConfig:
    """A Llama-style EAGLE-3 head config for any target (SpecForge heads are LlamaForCausalLMEagle3)."""
    return LlamaConfig(
        vocab_size=target.vocab_size, hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
        num_hidden_layers=1, num_attention_heads=target.num_attention_heads,
        num_key_value_heads=target.num_key_value_heads, head_dim=target.head_dim, rms_norm_eps=target.rms_norm_eps,
        max_position_embeddings=target.max_position_embeddings,
    )


@torch.no_grad()
def write_eagle3_head(target, path: Path, seed: int = 1, draft_vocab_size: int | None = None) -> Path:
    """A random EAGLE-3 head in SGLang / SpecForge's layout (d2t, t2d) for ``target``, saved to ``path``."""
    config = eagle3_head_config(target.config)
    vocab = config.vocab_size
    draft_vocab = draft_vocab_size or vocab
    head = Eagle3DraftModel(config, aux_hidden_layers=target.aux_hidden_layers, embed_tokens=target.embed_tokens,
                            draft_vocab_size=draft_vocab)
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(head.named_parameters(), key=lambda kv: kv[0]):
        r = torch.randn(p.shape, generator=gen)
        p.copy_(1.0 + 0.1 * r if name.endswith("norm.weight") else r / math.sqrt(p.shape[-1]))
    kept = torch.sort(torch.randperm(vocab, generator=gen)[:draft_vocab]).values  # [draft_vocab] target ids
    head.d2t.copy_(kept - torch.arange(draft_vocab))
    head.t2d.zero_()
    head.t2d[kept] = True
    save_draft_head(head, path)
    return path


