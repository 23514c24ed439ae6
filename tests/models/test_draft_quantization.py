"""``--speculative-draft-model-quantization fp8``: FP8 copies of a draft head's GEMM weights.

1. ``attach_fp8_copy_``: e4m3 values with one scale per row, each row's largest weight at +-448.
2. ``quantize_draft_`` on EAGLE-1 and EAGLE-3 heads: exactly the weights its GEMMs read get a copy
   (the target's shared weights do not), and on CPU the head then computes what the same head with
   FP8-rounded weights computes, bit for bit.
3. The engine with the flag: greedy speculative output equals plain output; a bad value names the flag.
"""

from __future__ import annotations

import copy

import pytest
import torch

from specdec.models.ops.gemv import FP8, FP8_MAX, attach_fp8_copy_, linear
from specdec.models.quantize import quantize_draft_

from ..builders import make_random_eagle3_head, make_random_eagle_head, make_random_target, tiny_llama_config
from ..e2e.helpers import assert_equal_or_near_tie, assert_no_leak, engine, make_pair, prompts_of


def fp8_rounded(w: torch.Tensor) -> torch.Tensor:
    """What a weight with an FP8 copy stands for: scale * e4m3(w / scale), per row."""
    q, scale = w.fp8_copy
    return (q.float() * scale[:, None]).to(w.dtype)


def test_attach_fp8_copy():
    w = torch.randn(6, 40, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 6)[:, None]
    w[2] = 0.0  # an all-zero row keeps a positive scale
    attach_fp8_copy_(w)
    q, scale = w.fp8_copy
    assert q.dtype == FP8 and q.shape == w.shape and scale.dtype == torch.float32 and scale.shape == (6,)
    assert (scale > 0).all() and torch.isfinite(q.float()).all()
    rows = [r for r in range(6) if r != 2]
    assert torch.equal(q.float()[rows].abs().amax(dim=1), torch.full((5,), FP8_MAX))
    # e4m3 keeps 3 mantissa bits: each weight within 1/16 of itself (or of the row's scale near 0)
    err = (fp8_rounded(w) - w).abs()
    assert (err <= w.abs() / 16 + scale[:, None] * 2.0**-9).all()
    with pytest.raises(ValueError, match="weight"):
        attach_fp8_copy_(torch.zeros(4))


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_quantize_draft_copies_the_heads_gemm_weights(algorithm):
    target = make_random_target(tiny_llama_config(), seed=1, aux_hidden_layers=[0, 1, 1] if algorithm == "EAGLE3" else None)
    head = make_random_eagle_head(target, seed=2) if algorithm == "EAGLE" else make_random_eagle3_head(target, seed=2)
    reference = copy.deepcopy(head)
    names = quantize_draft_(head, "fp8")
    layer = "layers.0" if algorithm == "EAGLE" else "midlayer"
    expected = {"fc", f"{layer}.self_attn.qkv_proj", f"{layer}.self_attn.o_proj", f"{layer}.mlp.gate_up_proj",
                f"{layer}.mlp.down_proj"} | ({"lm_head"} if algorithm == "EAGLE3" else set())
    assert set(names) == expected
    assert not hasattr(target.lm_head_weight, "fp8_copy") and not hasattr(target.embed_tokens.weight, "fp8_copy")
    # the reference head with every GEMM weight replaced by its FP8 rounding computes the same
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if param.dim() == 2 and "embed" not in name:
                attach_fp8_copy_(param)
                param.copy_(fp8_rounded(param))
                del param.fp8_copy
    x = torch.randn(5, head.fc.in_features, generator=torch.Generator().manual_seed(3))
    h = torch.randn(5, head.config.hidden_size, generator=torch.Generator().manual_seed(4))
    mlp, ref_mlp = head.get_submodule(f"{layer}.mlp"), reference.get_submodule(f"{layer}.mlp")
    with torch.no_grad():  # NOTE: a forward that records gradients reads the 16-bit weights
        assert torch.equal(linear(x, head.fc.weight, head.fc.bias), linear(x, reference.fc.weight, reference.fc.bias))
        assert torch.equal(mlp.gate_up_proj(h), ref_mlp.gate_up_proj(h))
        assert torch.equal(mlp(h), ref_mlp(h))
    assert torch.equal(linear(x, head.fc.weight, head.fc.bias), torch.nn.functional.linear(x, head.fc.weight, head.fc.bias))
    with pytest.raises(ValueError, match="--speculative-draft-model-quantization"):
        quantize_draft_(head, "int4")


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_engine_with_fp8_draft_is_lossless(algorithm, monkeypatch):
    from specdec.models.ops import gemv

    calls, w8a8 = [], []
    ref, ref_w8a8 = gemv.linear_fp8_ref, gemv.linear_w8a8_ref
    monkeypatch.setattr(gemv, "linear_fp8_ref", lambda *a: calls.append(a[1].shape) or ref(*a))
    monkeypatch.setattr(gemv, "linear_w8a8_ref", lambda *a: w8a8.append(a[0].shape[0]) or ref_w8a8(*a))
    target, draft = make_pair(algorithm, "mixed")
    prompts = prompts_of([7, 13, 3], target.config.vocab_size)
    params = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}
    expected = [r["output_ids"] for r in engine(target).generate(input_ids=prompts, sampling_params=params)]
    spec = engine(target, draft, algorithm=algorithm, shape=(4, 2, 6), speculative_draft_model_quantization="fp8")
    assert hasattr(spec.draft_model.fc.weight, "fp8_copy")
    results = spec.generate(input_ids=prompts, sampling_params=params)
    assert [r["output_ids"] for r in results] == expected
    assert sum(k for r in results for k in r["meta_info"]["spec_accept_lengths"]) > 0  # the head still drafts
    assert len(calls) > 0 and (draft.fc.weight.shape in calls)  # the head's GEMMs read the FP8 copies
    assert w8a8 and min(w8a8) > gemv.FP8_MAX_TOKENS  # past 16 tokens W8A8 (the draft extend: 3 requests x 6)


def test_engine_rejects_an_unknown_quantization():
    from specdec.engine.args import EngineArgs

    with pytest.raises(ValueError, match="--speculative-draft-model-quantization"):
        target, draft = make_pair("EAGLE", "mixed")
        engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), speculative_draft_model_quantization="int4")
    assert EngineArgs(speculative_draft_model_quantization="fp8").speculative_draft_model_quantization == "fp8"


# ============================================================================= GPU
@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
@pytest.mark.parametrize("shape", [(3, 1, 4), (5, 4, 8)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_fp8_draft_is_lossless(algorithm, shape, monkeypatch):
    """bf16, triton, CUDA graphs: the head's GEMMs read their FP8 copies inside the captured draft
    loop (W8A16) and draft extend (W8A8: 7 requests x 4+ tokens); speculative output equals plain
    output up to the bf16 near-ties of test_gpu_lossless."""
    from specdec.models.ops import gemv

    kernels, launches, w8a8 = gemv._kernels(), [], []
    launch, quantize = kernels.gemv, kernels.quantize_rows_fp8
    monkeypatch.setattr(kernels, "gemv", lambda *a, scale=None, **kw: launches.append(scale is not None) or
                        launch(*a, scale=scale, **kw))
    monkeypatch.setattr(kernels, "quantize_rows_fp8", lambda x: w8a8.append(x.shape[0]) or quantize(x))
    target, draft = make_pair(algorithm, "mixed", dtype=torch.bfloat16)
    target, draft = target.to("cuda"), draft.to("cuda")
    prompts = prompts_of([1, 9, 4, 23, 2, 15, 6], target.config.vocab_size)
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    kw = dict(device="cuda", attention_backend="triton")
    expected = [r["output_ids"] for r in engine(target, **kw).generate(input_ids=prompts, sampling_params=params)]
    spec = engine(target, draft, algorithm=algorithm, shape=shape, speculative_draft_model_quantization="fp8", **kw)
    got = [g["output_ids"] for g in spec.generate(input_ids=prompts, sampling_params=params)]
    assert any(launches), "no GEMM read an FP8 copy"
    assert w8a8 and min(w8a8) > gemv.FP8_MAX_TOKENS, "no GEMM of more than 16 tokens ran W8A8"  # the draft extend
    assert_equal_or_near_tie(target, prompts, got, expected, max_diverged=len(prompts) // 2, top_two=True)
    assert_no_leak(spec)


@pytest.mark.gpu
def test_gpu_fp8_draft_needs_a_16_bit_model():
    target, draft = make_pair("EAGLE", "mixed", dtype=torch.float32)
    with pytest.raises(ValueError, match="--speculative-draft-model-quantization.*--dtype"):
        engine(target.to("cuda"), draft.to("cuda"), algorithm="EAGLE", shape=(3, 1, 4), device="cuda",
               speculative_draft_model_quantization="fp8")
