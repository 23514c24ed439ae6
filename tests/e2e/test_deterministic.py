"""``--enable-deterministic-inference``: in bf16, greedy speculative output equals plain decoding bit
for bit (no near-tie escape), trees and chains alike, eager and on the CUDA-graph path, and a request
gives the same tokens alone and inside a batch. On CPU through torch_native (the padded graph path
run eagerly, ``use_graphs=False``; on CPU on a GPU machine too); on a GPU through the triton
backend with real graph replay."""

from __future__ import annotations

import pytest
import torch

from specdec.engine import deterministic
from specdec.forward import batch_invariant_enabled, set_batch_invariant

from .helpers import engine, make_pair

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
PROMPTS = [[5, 17, 42, 8, 61, 23, 9, 77, 31, 2 + 1] * 3, [11, 3, 50, 64, 7], [90, 12, 45, 33, 21, 8, 70, 14]]


@pytest.fixture(autouse=True)
def _switch_off_after():
    yield
    set_batch_invariant(False)  # NOTE: process-wide; later tests build their models without it


def _generate(eng, prompts, max_new=20):
    params = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}
    return [r["output_ids"] for r in eng.generate(input_ids=prompts, sampling_params=params)]


def _outputs(backend, shape, prompts, **kw):
    target, draft = make_pair("EAGLE3", "mixed", dtype=torch.bfloat16, seed=3)
    common = dict(attention_backend=backend, device=DEVICE, enable_deterministic_inference=True, **kw)
    plain = _generate(engine(target.to(DEVICE), **common), prompts)
    spec_engine = engine(target, draft.to(DEVICE), algorithm="EAGLE3", shape=shape, **common)
    assert batch_invariant_enabled()
    return plain, _generate(spec_engine, prompts), spec_engine


# NOTE: triton runs here on the GPU only (interpreted, one engine pair took 9 minutes on 2 cores)
@pytest.mark.parametrize("backend,shape", [("torch_native", (5, 4, 8)), ("torch_native", (3, 1, 4))])
def test_speculative_equals_plain_bit_for_bit(backend, shape):
    plain, spec, spec_engine = _outputs(backend, shape, PROMPTS, page_size=1)
    assert spec == plain
    alone = _generate(spec_engine, PROMPTS[1:2])
    assert alone[0] == spec[1]  # the same tokens alone as inside the batch


@pytest.mark.parametrize("shape", [(5, 4, 8), (3, 1, 4)], ids=lambda s: "x".join(map(str, s)))
def test_padded_graph_path_equals_plain_bit_for_bit(shape):
    """Captured sizes [2, 4]: the three requests run padded (3 -> 4, then 2 or 1 -> 2) on the static
    path whose KV lists are built on the device; plain decoding runs eagerly, one request at a time too."""
    target, draft = make_pair("EAGLE3", "mixed", dtype=torch.bfloat16, seed=3)
    common = dict(attention_backend="torch_native", device="cpu", enable_deterministic_inference=True, page_size=16)
    plain = [_generate(engine(target, **common), [p])[0] for p in PROMPTS]
    spec = engine(target, draft, algorithm="EAGLE3", shape=shape, **common)
    spec.capture_cuda_graphs([2, 4], use_graphs=False)
    assert _generate(spec, PROMPTS) == plain
    verify_calls = [g.num_calls for (mode, _, _), g in spec.runner.graphs.items() if mode.name == "TARGET_VERIFY"]
    assert verify_calls and min(verify_calls) > 0 and spec.worker.draft_extend_graph.runner.num_calls > 0


def test_prefix_cache_on_and_off_give_the_same_tokens():
    """The second prompt extends the first: with the cache on its prefill reads 32 cached positions
    (KV a decode step and a verify wrote) and computes only the rest; off, it computes them all."""
    target, draft = make_pair("EAGLE3", "mixed", dtype=torch.bfloat16, seed=3)
    first = PROMPTS[0]
    outputs, cached = [], []
    for disable in (False, True):
        eng = engine(target, draft, algorithm="EAGLE3", shape=(3, 1, 4), attention_backend="torch_native",
                     device="cpu", enable_deterministic_inference=True, page_size=16, disable_radix_cache=disable)
        done = _generate(eng, [first])[0]
        params = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}
        out = eng.generate(input_ids=[first + done + [4, 44, 19]], sampling_params=params)[0]
        outputs.append(out["output_ids"])
        cached.append(out["meta_info"]["cached_tokens"])
    assert outputs[0] == outputs[1] and cached[0] >= 32 and cached[1] == 0


def _ngram_outputs(breadth, prompts, **kw):
    """Plain decoding and NGRAM (chains, or tries of ``breadth`` branches) over ``prompts`` in deterministic
    mode, and NGRAM's accepted lengths."""
    target, _ = make_pair("EAGLE3", "mixed", dtype=torch.bfloat16, seed=3)
    common = dict(device=DEVICE, enable_deterministic_inference=True, **kw)
    plain = _generate(engine(target.to(DEVICE), **common), prompts, max_new=30)
    spec = engine(target, speculative_algorithm="NGRAM", speculative_num_draft_tokens=8,
                  speculative_ngram_max_bfs_breadth=breadth, **common)
    params = {"temperature": 0, "max_new_tokens": 30, "ignore_eos": True}
    outs = spec.generate(input_ids=prompts, sampling_params=params)
    return plain, [o["output_ids"] for o in outs], [k for o in outs for k in o["meta_info"]["spec_accept_lengths"]]


# PROMPTS (the first repeats itself, the others do not) and two more that repeat: lookups match from a second copy on
NGRAM_PROMPTS = PROMPTS + [[7, 81, 26, 5, 40] * 3 + [7, 81], [19, 64, 3, 88, 52, 11, 29, 70, 6] * 2]


@pytest.mark.parametrize("breadth", [1, 3], ids=["chain", "trie"])
def test_ngram_equals_plain_bit_for_bit(breadth):
    plain, spec, accepts = _ngram_outputs(breadth, NGRAM_PROMPTS, attention_backend="torch_native", page_size=1)
    assert spec == plain
    assert max(accepts) > 1  # drafts were verified and accepted: the check is not vacuous


@pytest.mark.gpu
@pytest.mark.parametrize("breadth", [1, 3], ids=["chain", "trie"])
def test_gpu_ngram_equals_plain_bit_for_bit(breadth):
    """NGRAM's sizes (up to 8 nodes, padded) replaying CUDA graphs, against plain decoding."""
    plain, spec, accepts = _ngram_outputs(breadth, NGRAM_PROMPTS * 2, attention_backend="triton", page_size=16)
    assert spec == plain
    assert max(accepts) > 1


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(5, 4, 8), (3, 1, 4), (6, 8, 32)])
def test_gpu_speculative_equals_plain_bit_for_bit(shape):
    """Speculative decoding replaying CUDA graphs (sizes 1..4) against plain decoding, with graphs and without."""
    plain, spec, spec_engine = _outputs("triton", shape, PROMPTS * 3, page_size=16)
    assert spec == plain
    replays = {mode.name: g.num_calls for (mode, _, _), g in spec_engine.runner.graphs.items()}
    assert replays.get("TARGET_VERIFY", 0) > 0, replays
    eager = engine(make_pair("EAGLE3", "mixed", dtype=torch.bfloat16, seed=3)[0].to(DEVICE), attention_backend="triton",
                   device=DEVICE, enable_deterministic_inference=True, page_size=16, disable_cuda_graph=True)
    assert _generate(eager, PROMPTS * 3) == plain


def test_backend_without_the_mode_is_refused(monkeypatch):
    class NoMode:
        pass

    monkeypatch.setattr(deterministic, "create_attention_backend", lambda name: NoMode())
    target, draft = make_pair("EAGLE3", "random", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="has no batch-invariant mode"):
        engine(target, enable_deterministic_inference=True, attention_backend="torch_native", device="cpu")


def test_flag_off_leaves_the_switch_off():
    target, _ = make_pair("EAGLE3", "random", dtype=torch.bfloat16)
    set_batch_invariant(True)
    engine(target, attention_backend="torch_native", device="cpu")
    assert not batch_invariant_enabled()
