"""Tensor parallelism on two and four GPUs (NCCL; tp 4 where the host has four): greedy speculative
output with --tp-size N equals plain decoding with --tp-size N, and plain --tp-size N equals
--tp-size 1, under CUDA graphs and overlap scheduling (the CUDA defaults), for each backend, a fixed
chain and adaptive speculation; the one-shot all-reduce (the default on the GPUs of one host) gives
the same tokens as NCCL's, and the draft head sharded or replicated (--speculative-draft-tp) stays
lossless. At tp 4 the checkpoint's 2 KV heads are replicated (each on two ranks).

bf16: the shards sum their partial products in another order than one GPU does, and a verify
forward rounds differently from a decode forward, so "equal" is the near-tie rule of
tests/e2e/helpers.py: equal, or the first difference is between tokens within bf16 noise of the best.
Exact equality holds only between the one-shot all-reduce and NCCL at tp 2 (one sum a + b).
"""

from __future__ import annotations

import functools

import pytest
import torch

from specdec.attention import available_backends
from specdec.engine.engine import Engine
from specdec.models import load_target
from specdec.models.config import default_eagle3_layers

from ..models.hf_checkpoints import write_eagle3_head, write_hf_checkpoint
from .helpers import assert_equal_or_near_tie, assert_no_leak, prompts_of

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism needs two GPUs")]

BACKENDS = [b for b in ("triton", "flashinfer") if b in available_backends()]
TP_SIZES = [tp for tp in (2, 4) if torch.cuda.device_count() >= tp]
LENGTHS, MAX_NEW = [1, 9, 4, 23, 2, 15, 6], [17, 5, 30, 12, 1, 24, 9]
SPECS = {"chain-3x1x4": dict(speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                             speculative_adaptive="off"),
         "adaptive-5x4x8": dict(speculative_num_steps=5, speculative_eagle_topk=4, speculative_num_draft_tokens=8,
                                speculative_adaptive="on")}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Llama, head_dim 128 (FlashInfer's), GQA 4/2: one KV head per rank; vocab 999 splits 500 + 499 (+1 padding)."""
    root = tmp_path_factory.mktemp("tp-gpu")
    _, path = write_hf_checkpoint("llama", root / "target", seed=3, vocab_size=999, hidden_size=512,
                                  intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=128, max_position_embeddings=1024)
    target = load_target(path, aux_hidden_layers=default_eagle3_layers(4))
    head = write_eagle3_head(target, root / "head", draft_vocab_size=600)
    return str(path), str(head)


@pytest.fixture(scope="module")
def reference(checkpoint):
    return load_target(checkpoint[0], dtype=torch.float32, device="cuda")  # the near-tie judge (fp32, one GPU)


def _generate(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    params = [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in MAX_NEW]
    return [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]


@pytest.fixture(scope="module")
def plain_outputs(checkpoint, reference):
    """(prompts, plain(backend, tp)): plain greedy output with --tp-size N, checked against --tp-size 1;
    each computed when a test first asks (``-k tp4`` builds no tp 2 engine)."""
    prompts = prompts_of(LENGTHS, 999)

    @functools.cache
    def tp_one(backend: str) -> list[list[int]]:
        engine = Engine(checkpoint[0], device="cuda", attention_backend=backend)
        try:
            return _generate(engine, prompts)
        finally:
            engine.shutdown()

    @functools.cache
    def plain(backend: str, tp: int) -> list[list[int]]:
        engine = Engine(checkpoint[0], device="cuda", attention_backend=backend, tp_size=tp)
        try:
            assert engine.cuda_graph_bytes > 0  # decode steps replay graphs, all-reduces captured in them
            got = _generate(engine, prompts)
            assert_no_leak(engine)
        finally:
            engine.shutdown()
        assert_equal_or_near_tie(reference, prompts, got, tp_one(backend))
        return got

    return prompts, plain


@pytest.mark.parametrize("tp", TP_SIZES, ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_tp_speculative_equals_plain(checkpoint, reference, plain_outputs, backend, spec, tp, tmp_path):
    prompts, plain = plain_outputs
    want = plain(backend, tp)  # before this test's engine: one tp engine at a time
    path, head = checkpoint
    engine = Engine(path, device="cuda", attention_backend=backend, tp_size=tp, speculative_algorithm="EAGLE3",
                    speculative_draft_model_path=head, speculative_adaptive_profile=str(tmp_path / "costs.json"),
                    max_running_requests=8, **SPECS[spec])  # 8: adaptive profiles batch sizes 1-8 only
    try:
        got = _generate(engine, prompts)
        assert_equal_or_near_tie(reference, prompts, got, want)
        steps = engine.scheduler.spec_shape_steps  # shape name (or "plain") -> decode steps
        assert steps and (spec.startswith("adaptive") or set(steps) == {"3x1x4"})
        assert_no_leak(engine)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("tp", TP_SIZES, ids=lambda tp: f"tp{tp}")
@pytest.mark.skipif("triton" not in BACKENDS, reason="needs the triton backend")
def test_gpu_tp_custom_all_reduce_on_and_off(checkpoint, reference, plain_outputs, tp):
    """Two ranks sum a + b once, the same bits through the one-shot kernel or NCCL: tp 2 output with
    --disable-custom-all-reduce equals the default's token for token, plain (against the fixture's
    run) and speculative with the head sharded. Four ranks sum in another order than NCCL's ring:
    equal under the near-tie rule. The head replicated equals plain under the near-tie rule."""
    prompts, plain = plain_outputs
    default = plain("triton", tp)  # before this test's engines: one tp engine at a time

    def assert_same_sums(got, want):  # the one-shot all-reduce against NCCL's
        if tp == 2:
            assert got == want
        else:
            assert_equal_or_near_tie(reference, prompts, got, want)

    path, head = checkpoint
    spec = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=head, max_running_requests=8,
                **SPECS["chain-3x1x4"])
    nccl = {"disable_custom_all_reduce": True}
    runs = {}
    for name, flags in [("plain-nccl", nccl), ("spec-shard", {**spec, "speculative_draft_tp": "shard"}),
                        ("spec-shard-nccl", {**spec, "speculative_draft_tp": "shard", **nccl}),
                        ("spec-replicate", {**spec, "speculative_draft_tp": "replicate"})]:
        engine = Engine(path, device="cuda", attention_backend="triton", tp_size=tp, **flags)
        try:
            want = "torch.distributed" if "disable_custom_all_reduce" in flags else "push"  # the default kernel
            assert engine.target_model.tp.all_reduce_name == want, name
            assert engine.draft_model is None or engine.draft_model.tp.size == (1 if "replicate" in name else tp)
            runs[name] = _generate(engine, prompts)
            assert_no_leak(engine)
        finally:
            engine.shutdown()
    assert_same_sums(runs["plain-nccl"], default)
    assert_same_sums(runs["spec-shard-nccl"], runs["spec-shard"])
    for name in ("spec-shard", "spec-replicate"):
        assert_equal_or_near_tie(reference, prompts, runs[name], default)
