"""load_hf_llama / load_target on an HF-layout directory written from a random model."""

import json

import pytest
import torch
from safetensors.torch import save_file

from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode
from specdec.attention import KVCache
from specdec.attention.torch_native import TorchNativeBackend
from specdec.models import load_target, read_num_layers
from ..builders import StandaloneRunner, make_random_target, tiny_llama_config


def _write_hf(model, path, *, extra=None, shards=2):
    cfg = model.config.to_hf()
    cfg["architectures"] = ["LlamaForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state.update(extra or {})
    names = sorted(state)
    for s in range(shards):  # sharded like real checkpoints
        save_file({k: state[k] for k in names[s::shards]}, str(path / f"model-{s:05d}-of-{shards:05d}.safetensors"))


@pytest.mark.parametrize("cfg", [{}, dict(tie_word_embeddings=True), dict(attention_bias=True)])
def test_hf_directory_round_trip(cfg, tmp_path):
    model = make_random_target(tiny_llama_config(**cfg), seed=11)
    extra = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}
    if model.config.tie_word_embeddings:
        extra["lm_head.weight"] = model.lm_head_weight.detach().clone()  # tied copies are ignored
    _write_hf(model, tmp_path, extra=extra)
    loaded = load_target(tmp_path, aux_hidden_layers=(1, 2, 3))
    assert loaded.config == model.config and read_num_layers(tmp_path) == 4
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    a = StandaloneRunner(model, 16).forward(ids).next_token_logits
    b = StandaloneRunner(loaded, 16).forward(ids, capture_hidden_mode=CaptureHiddenMode.FULL)
    torch.testing.assert_close(b.next_token_logits, a)
    assert b.hidden_states.shape == (11, 3 * 64)
    bf16 = load_target(tmp_path, dtype=torch.bfloat16)
    assert bf16.lm_head_weight.dtype == torch.bfloat16


def test_hf_directory_missing_weight(tmp_path):
    model = make_random_target(tiny_llama_config(), seed=11)
    _write_hf(model, tmp_path, shards=1)
    state = {k: v for k, v in model.state_dict().items() if k != "model.norm.weight"}
    save_file(state, str(tmp_path / "model-00000-of-00001.safetensors"))
    with pytest.raises(ValueError, match="model.norm.weight"):
        load_target(tmp_path)


def test_load_target_rejects_other_paths(tmp_path):
    with pytest.raises(ValueError, match="model-path"):
        load_target(tmp_path / "model.gguf")


def test_empty_batch():
    model = make_random_target(tiny_llama_config(), seed=1, aux_hidden_layers=(0, 1, 2))
    empty = torch.zeros(0, dtype=torch.int64)
    batch = ForwardBatch(
        forward_mode=ForwardMode.IDLE, input_ids=empty, positions=empty, out_cache_loc=empty,
        req_pool_indices=empty, prefix_lens=empty, extend_lens=empty,
        req_to_token=torch.zeros(1, 4, dtype=torch.int32),
        kv_cache=KVCache(num_layers=4, num_slots=4, num_kv_heads=2, head_dim=16, dtype=torch.float32, device="cpu"),
        attn_backend=TorchNativeBackend(), capture_hidden_mode=CaptureHiddenMode.FULL,
    )
    out = model(batch)
    assert out.next_token_logits.shape == (0, 97) and out.hidden_states.shape == (0, 192)
