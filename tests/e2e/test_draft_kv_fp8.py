"""``--speculative-draft-kv-cache-dtype fp8_e4m3``: the draft head's KV cache in FP8.

The attention kernels over an FP8 cache are tested against their references in
tests/attention/test_triton_backend.py and test_store_kv.py; here the engine: the head's cache is
FP8 and written through (the head still drafts), speculative output equals plain output, no KV
slot leaks, and a bad value or a backend that cannot read FP8 is named.
"""

from __future__ import annotations

import pytest
import torch

from specdec.attention.kv_dtype import KV_CACHE_DTYPES
from specdec.attention.torch_native import TorchNativeBackend
from specdec.config import DRAFT_KV_CACHE_DTYPES, ConfigError

from .helpers import assert_equal_or_near_tie, assert_no_leak, engine, make_pair, prompts_of

FP8 = "fp8_e4m3"


def _generate(eng, prompts, max_new=20):
    params = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}
    return eng.generate(input_ids=prompts, sampling_params=params)


@pytest.mark.parametrize("shape", [(3, 1, 4), (4, 2, 6)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
def test_fp8_draft_kv_cache_is_lossless(algorithm, shape):
    target, draft = make_pair(algorithm, "mixed")
    prompts = prompts_of([7, 13, 3], target.config.vocab_size)
    expected = [r["output_ids"] for r in _generate(engine(target), prompts)]
    spec = engine(target, draft, algorithm=algorithm, shape=shape, speculative_draft_kv_cache_dtype=FP8)
    kv = spec.worker.resources.kv
    assert kv.k.dtype == kv.v.dtype == torch.float8_e4m3fn
    results = _generate(spec, prompts)
    assert [r["output_ids"] for r in results] == expected
    assert sum(k for r in results for k in r["meta_info"]["spec_accept_lengths"]) > 0  # the head still drafts
    assert kv.k.float().abs().amax() > 0  # and its cache was written
    auto = engine(target, draft, algorithm=algorithm, shape=shape).kv_bytes_per_token["draft"]  # fp32
    assert spec.kv_bytes_per_token["draft"] * 4 == auto
    assert_no_leak(spec)


def test_fp8_draft_kv_cache_with_fp8_draft_weights():
    target, draft = make_pair("EAGLE3", "mixed")
    prompts = prompts_of([5, 11], target.config.vocab_size)
    expected = [r["output_ids"] for r in _generate(engine(target), prompts)]
    spec = engine(target, draft, algorithm="EAGLE3", shape=(4, 2, 6), speculative_draft_kv_cache_dtype=FP8,
                  speculative_draft_model_quantization="fp8")
    assert [r["output_ids"] for r in _generate(spec, prompts)] == expected
    assert_no_leak(spec)


def test_the_flag_values_are_the_cache_dtypes():
    assert set(DRAFT_KV_CACHE_DTYPES) == set(KV_CACHE_DTYPES)


def test_a_bad_value_names_the_flag():
    target, draft = make_pair("EAGLE", "mixed")
    with pytest.raises(ConfigError, match="--speculative-draft-kv-cache-dtype='fp8_e5m3'"):
        engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), speculative_draft_kv_cache_dtype="fp8_e5m3")


def test_a_backend_that_reads_no_fp8_cache_is_refused(monkeypatch):
    monkeypatch.setattr(TorchNativeBackend, "supports_fp8_kv_cache", False)
    target, draft = make_pair("EAGLE", "mixed")
    with pytest.raises(ConfigError, match="--speculative-draft-kv-cache-dtype=fp8_e4m3: the torch_native"):
        engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), speculative_draft_kv_cache_dtype=FP8)


# ============================================================================= GPU
@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
@pytest.mark.parametrize("shape", [(3, 1, 4), (5, 4, 8)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_fp8_draft_kv_cache_is_lossless(algorithm, shape):
    """bf16, triton, CUDA graphs (the draft loop and the draft extend store and read the FP8 cache
    inside their graphs), with FP8 draft weights too: speculative output equals plain output up to
    the bf16 near-ties of test_gpu_lossless."""
    target, draft = make_pair(algorithm, "mixed", dtype=torch.bfloat16)
    target, draft = target.to("cuda"), draft.to("cuda")
    prompts = prompts_of([1, 9, 4, 23, 2, 15, 6], target.config.vocab_size)
    kw = dict(device="cuda", attention_backend="triton")
    expected = [r["output_ids"] for r in _generate(engine(target, **kw), prompts, max_new=24)]
    spec = engine(target, draft, algorithm=algorithm, shape=shape, speculative_draft_kv_cache_dtype=FP8,
                  speculative_draft_model_quantization="fp8", **kw)
    assert spec.worker.resources.kv.k.dtype == torch.float8_e4m3fn
    results = _generate(spec, prompts, max_new=24)
    assert sum(k for r in results for k in r["meta_info"]["spec_accept_lengths"]) > 0
    assert_equal_or_near_tie(target, prompts, [r["output_ids"] for r in results], expected,
                             max_diverged=len(prompts) // 2, top_two=True)
    assert_no_leak(spec)
