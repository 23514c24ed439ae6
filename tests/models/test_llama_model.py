"""LlamaForCausalLM against an independent plain-torch Llama (full causal attention, no KV cache)."""

import dataclasses
import math

import pytest
import torch

from specdec.attention import KVCache
from specdec.attention.torch_native import TorchNativeBackend
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode
from specdec.models import LlamaConfig, default_eagle3_layers
from ..builders import StandaloneRunner, make_random_target, tiny_llama_config

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def ref_inv_freq(c: LlamaConfig) -> torch.Tensor:
    """RoPE frequencies; llama3 scaling written as Meta's per-frequency reference loop."""
    d = c.head_dim
    freqs = [1.0 / (c.rope_theta ** (2 * i / d)) for i in range(d // 2)]
    s = c.rope_scaling
    if s is not None:
        low_wl = s["original_max_position_embeddings"] / s["low_freq_factor"]
        high_wl = s["original_max_position_embeddings"] / s["high_freq_factor"]
        new = []
        for f in freqs:
            wl = 2 * math.pi / f
            if wl < high_wl:
                new.append(f)
            elif wl > low_wl:
                new.append(f / s["factor"])
            else:
                sm = (s["original_max_position_embeddings"] / wl - s["low_freq_factor"]) / (
                    s["high_freq_factor"] - s["low_freq_factor"])
                new.append((1 - sm) * f / s["factor"] + sm * f)
        freqs = new
    return torch.tensor(freqs, dtype=torch.float64)


def ref_forward(model, ids: list[int], capture=()):
    """Plain Llama over one whole sequence, float64. Returns (logits [T, V], captured layer inputs)."""
    c = model.config
    sd = {k: v.double() for k, v in model.state_dict().items()}
    w = lambda name: sd[name]  # noqa: E731
    b = lambda name: sd.get(name, 0.0)  # noqa: E731
    t, hq, hkv, d = len(ids), c.num_attention_heads, c.num_key_value_heads, c.head_dim

    def norm(x, weight):
        return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps)

    ang = torch.arange(t, dtype=torch.float64)[:, None] * ref_inv_freq(c)[None]
    cos, sin = torch.cos(ang)[:, None], torch.sin(ang)[:, None]

    def rope(x):  # [T, heads, D], HF rotate_half: pairs (i, i + D/2)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    x = w("model.embed_tokens.weight")[torch.tensor(ids)]
    taken = {}
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(c.num_hidden_layers):
        taken[i] = x
        p = f"model.layers.{i}."
        hn = norm(x, w(p + "input_layernorm.weight"))
        q = (hn @ w(p + "self_attn.q_proj.weight").T + b(p + "self_attn.q_proj.bias")).view(t, hq, d)
        k = (hn @ w(p + "self_attn.k_proj.weight").T + b(p + "self_attn.k_proj.bias")).view(t, hkv, d)
        v = (hn @ w(p + "self_attn.v_proj.weight").T + b(p + "self_attn.v_proj.bias")).view(t, hkv, d)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(t, hq * d)
        x = x + attn @ w(p + "self_attn.o_proj.weight").T + b(p + "self_attn.o_proj.bias")
        hn = norm(x, w(p + "post_attention_layernorm.weight"))
        gate = hn @ w(p + "mlp.gate_proj.weight").T
        up = hn @ w(p + "mlp.up_proj.weight").T
        x = x + (torch.nn.functional.silu(gate) * up) @ w(p + "mlp.down_proj.weight").T
    taken[c.num_hidden_layers] = x
    final = norm(x, w("model.norm.weight"))
    head = w("model.embed_tokens.weight") if c.tie_word_embeddings else w("lm_head.weight")
    return final @ head.T, final, [taken[i] for i in capture]


CONFIGS = {
    "gqa": {},
    "mha": dict(num_key_value_heads=4),
    "tied": dict(tie_word_embeddings=True),
    "qkv_bias": dict(attention_bias=True),
    "llama_bias": dict(attention_bias=True, attention_out_bias=True),
    "llama3_rope": dict(rope_scaling=LLAMA3_ROPE, rope_theta=500000.0),
    "head_dim_8": dict(head_dim=8, num_key_value_heads=1),
}


def _ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_prefill_and_decode_match_reference(name):
    model = make_random_target(tiny_llama_config(**CONFIGS[name]), seed=3)
    ids = _ids(37, model.config.vocab_size)
    ref, _, _ = ref_forward(model, ids)
    full = StandaloneRunner(model, 64).forward(ids).next_token_logits
    torch.testing.assert_close(full.double(), ref, atol=2e-5, rtol=2e-5)
    runner = StandaloneRunner(model, 64)
    rows = [runner.forward(ids[:11]).next_token_logits]
    rows += [runner.forward(ids[i : i + 1]).next_token_logits for i in range(11, 30)]
    rows += [runner.forward(ids[30:]).next_token_logits]  # a later multi-token chunk after a prefix
    torch.testing.assert_close(torch.cat(rows).double(), ref, atol=2e-5, rtol=2e-5)


def test_packed_batch_last_logits_and_prefix():
    """Two requests in one forward: LAST rows, then an extend of both on top of their prefixes."""
    model = make_random_target(tiny_llama_config(), seed=5)
    a, b = _ids(9, 97, 1), _ids(13, 97, 2)
    cache = KVCache(num_layers=4, num_slots=64, num_kv_heads=2, head_dim=16, dtype=torch.float32, device="cpu")
    table = torch.zeros(2, 32, dtype=torch.int32)
    table[0, :12] = torch.arange(40, 52)  # request 0 lives in slots 40.., request 1 in slots 3..
    table[1, :16] = torch.arange(3, 19)
    backend = TorchNativeBackend()

    def run(tokens, prefix, lens, mode, capture):
        locs = torch.cat([table[r, p : p + n] for r, (p, n) in enumerate(zip(prefix, lens))]).long()
        pos = torch.cat([torch.arange(p, p + n) for p, n in zip(prefix, lens)])
        batch = ForwardBatch(
            forward_mode=ForwardMode.EXTEND, input_ids=torch.tensor(tokens), positions=pos, out_cache_loc=locs,
            req_pool_indices=torch.tensor([0, 1]), prefix_lens=torch.tensor(prefix),
            extend_lens=torch.tensor(lens), req_to_token=table, kv_cache=cache, attn_backend=backend,
            logits_mode=mode, capture_hidden_mode=capture,
        )
        backend.init_forward_metadata(batch)
        return model(batch)

    out = run(a[:6] + b[:10], [0, 0], [6, 10], LogitsMode.LAST, CaptureHiddenMode.LAST)
    ref_a, fin_a, _ = ref_forward(model, a)
    ref_b, fin_b, _ = ref_forward(model, b)
    assert out.next_token_logits.shape == (2, 97)
    torch.testing.assert_close(out.next_token_logits.double(), torch.stack([ref_a[5], ref_b[9]]), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(out.hidden_states.double(), torch.stack([fin_a[5], fin_b[9]]), atol=2e-5, rtol=2e-5)
    out = run(a[6:] + b[10:], [6, 10], [3, 3], LogitsMode.ALL, CaptureHiddenMode.FULL)
    torch.testing.assert_close(out.next_token_logits.double(), torch.cat([ref_a[6:], ref_b[10:]]), atol=2e-5, rtol=2e-5)
    assert out.hidden_states.shape == (6, 64)


@pytest.mark.parametrize("layers", [(2, 2, 1), (0, 3, 4), (1,)])
def test_eagle3_capture_returns_layer_inputs(layers):
    model = make_random_target(tiny_llama_config(), seed=7, aux_hidden_layers=layers)
    ids = _ids(21, 97, 4)
    ref, _, taken = ref_forward(model, ids, capture=layers)
    out = StandaloneRunner(model, 32).forward(ids, capture_hidden_mode=CaptureHiddenMode.FULL)
    assert out.hidden_states.shape == (21, 64 * len(layers))
    torch.testing.assert_close(out.hidden_states.double(), torch.cat(taken, dim=-1), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(out.next_token_logits.double(), ref, atol=2e-5, rtol=2e-5)
    last = StandaloneRunner(model, 32).forward(
        ids, logits_mode=LogitsMode.LAST, capture_hidden_mode=CaptureHiddenMode.LAST
    )
    torch.testing.assert_close(last.hidden_states, out.hidden_states[-1:])
    assert StandaloneRunner(model, 32).forward(ids).hidden_states is None


def test_final_hidden_capture_is_lm_head_input():
    model = make_random_target(tiny_llama_config(), seed=8)
    ids = _ids(12, 97, 5)
    _, final, _ = ref_forward(model, ids)
    out = StandaloneRunner(model, 16).forward(ids, capture_hidden_mode=CaptureHiddenMode.FULL)
    torch.testing.assert_close(out.hidden_states.double(), final, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_close_to_fp32(dtype):
    """Error of a low-precision run stays within a few times the error of rounding the weights."""
    ref_model = make_random_target(tiny_llama_config(), seed=9)
    ids = _ids(17, 97, 6)
    ref = StandaloneRunner(ref_model, 32).forward(ids).next_token_logits
    low = make_random_target(tiny_llama_config(), seed=9, dtype=dtype)
    out = StandaloneRunner(low, 32).forward(ids).next_token_logits
    assert out.dtype == torch.float32
    rounded = ref_forward(low, ids)[0]  # float64 math on the rounded weights
    weight_err = (rounded - ref.double()).abs().max()
    assert (out.double() - ref.double()).abs().max() < 4 * weight_err + 0.05


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [5, 80])  # on CUDA: the skinny GEMM (widening in its store), then F.linear
def test_logits_in_the_model_dtype_widen_to_the_fp32_ones(dtype, rows):
    """``logits_dtype=None`` (a verify's and the draft's) gives the lm_head's own dtype, the default's
    fp32 logits exactly once widened."""
    model = make_random_target(tiny_llama_config(), seed=10, dtype=dtype)
    ids = _ids(rows, 97, 7)
    wide = StandaloneRunner(model, 96).forward(ids).next_token_logits
    own = StandaloneRunner(model, 96).forward(ids, logits_dtype=None).next_token_logits
    assert wide.dtype == torch.float32 and own.dtype == dtype
    assert torch.equal(own.float(), wide)


def test_default_eagle3_layers():
    assert default_eagle3_layers(32) == (2, 16, 29)
    assert default_eagle3_layers(4) == (2, 2, 1)
    assert default_eagle3_layers(1) == (0, 0, 0)


def test_bad_aux_layers_rejected():
    with pytest.raises(ValueError, match="aux_hidden_layers"):
        make_random_target(tiny_llama_config(), aux_hidden_layers=(0, 5))


def test_config_from_hf_and_validation():
    hf = {"vocab_size": 97, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rope_scaling": LLAMA3_ROPE,
          "eos_token_id": [2, 5], "model_type": "llama"}
    c = LlamaConfig.from_hf(hf)
    assert c.head_dim == 16 and c.eos_token_ids == (2, 5) and c.rope_scaling["rope_type"] == "llama3"
    assert LlamaConfig.from_hf(c.to_hf()) == c
    q = LlamaConfig.from_hf({**hf, "model_type": "qwen2"})
    assert q.attention_bias and not q.attention_out_bias
    assert LlamaConfig.from_hf(q.to_hf()) == q
    with pytest.raises(ValueError, match="intermediate_size"):
        LlamaConfig.from_hf({k: v for k, v in hf.items() if k != "intermediate_size"})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        LlamaConfig.from_hf({**hf, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="rope_type"):
        LlamaConfig.from_hf({**hf, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
    with pytest.raises(ValueError, match="low_freq_factor"):
        LlamaConfig.from_hf({**hf, "rope_scaling": {"rope_type": "llama3", "factor": 2.0}})
    assert dataclasses.replace(c, rope_scaling={"type": "default"}).rope_scaling is None
