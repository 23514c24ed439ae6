"""Tensor-parallel layout without processes: which rows and columns each rank holds."""

import pytest
import torch

from specdec.models.config import LlamaConfig
from specdec.models.parallel import TPGroup, shard_state_dict

CFG = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)


def _state(cfg):
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    rand = lambda *s: torch.randn(*s, generator=torch.Generator().manual_seed(sum(s)))  # noqa: E731
    p = "model.layers.0."
    return {
        "model.embed_tokens.weight": rand(cfg.vocab_size, h), "lm_head.weight": rand(cfg.vocab_size, h),
        p + "self_attn.q_proj.weight": rand(cfg.num_attention_heads * d, h),
        p + "self_attn.k_proj.weight": rand(cfg.num_key_value_heads * d, h),
        p + "self_attn.o_proj.weight": rand(h, cfg.num_attention_heads * d),
        p + "self_attn.o_proj.bias": rand(h), p + "self_attn.q_norm.weight": rand(d),
        p + "mlp.gate_proj.weight": rand(i, h), p + "mlp.down_proj.weight": rand(h, i),
    }


def test_shards_put_back_together():
    state = _state(CFG)
    shards = [shard_state_dict(state, CFG, TPGroup(rank=r, size=2)) for r in range(2)]
    cat = lambda name, dim: torch.cat([s[name] for s in shards], dim)  # noqa: E731
    p = "model.layers.0."
    for name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "mlp.gate_proj.weight"):
        assert torch.equal(cat(p + name, 0), state[p + name]), name
    for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
        assert torch.equal(cat(p + name, 1), state[p + name]), name
    for name in ("self_attn.o_proj.bias", "self_attn.q_norm.weight"):  # replicated
        assert all(torch.equal(s[p + name], state[p + name]) for s in shards)
    # vocab 97 over 2 ranks: 49 rows each, the last one zero padding
    emb = cat("model.embed_tokens.weight", 0)
    assert emb.shape == (98, 64) and torch.equal(emb[:97], state["model.embed_tokens.weight"]) and not emb[97].any()


def test_kv_heads_replicate_when_fewer_than_ranks():
    cfg = LlamaConfig(**{**CFG.__dict__, "num_key_value_heads": 1})
    tps = [TPGroup(rank=r, size=4) for r in range(4)]
    assert [(h.q_start, h.num_q, h.kv_start, h.num_kv) for h in (tp.heads(cfg) for tp in tps)] == [
        (0, 1, 0, 1), (1, 1, 0, 1), (2, 1, 0, 1), (3, 1, 0, 1)]
    k = "model.layers.0.self_attn.k_proj.weight"
    shards = [shard_state_dict(_state(cfg), cfg, tp)[k] for tp in tps]
    assert all(torch.equal(s, _state(cfg)[k]) for s in shards)


@pytest.mark.parametrize("overrides, match", [
    (dict(num_attention_heads=6, num_key_value_heads=6, head_dim=16), "does not divide num_attention_heads=6"),
    (dict(num_attention_heads=12, num_key_value_heads=3, head_dim=16), "num_key_value_heads=3"),
    (dict(intermediate_size=90), "does not divide intermediate_size=90"),
])
def test_sizes_that_do_not_split(overrides, match):
    cfg = LlamaConfig(**{**CFG.__dict__, **overrides})
    with pytest.raises(ValueError, match=match):
        TPGroup(rank=0, size=4).check(cfg)


def test_partial_sums_carry_the_bias_once():
    """``row_parallel(..., reduce=False)``: each rank's partial sum over its columns, the bias in rank
    0's alone, so the sum over ranks (what the next norm all-reduces) is the whole layer's output."""
    from torch import nn

    from specdec.models.llama_layers import row_parallel

    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    proj = nn.Linear(8, 5, bias=True, dtype=torch.float64)
    parts = []
    for rank in range(2):
        shard = nn.Linear(4, 5, bias=True, dtype=torch.float64)
        with torch.no_grad():
            shard.weight.copy_(proj.weight[:, 4 * rank:4 * (rank + 1)])
            shard.bias.copy_(proj.bias)
        parts.append(row_parallel(x[:, 4 * rank:4 * (rank + 1)], shard, TPGroup(rank=rank, size=2), reduce=False))
    torch.testing.assert_close(parts[0] + parts[1], proj(x), rtol=1e-12, atol=1e-12)
