"""Every registered architecture against transformers: tiny random checkpoints written by
transformers load through ``load_target`` and give its logits (fp32), prefill and step by step,
with sliding windows shorter than the sequence; greedy EAGLE-3 output equals plain greedy output."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from specdec.engine.engine import Engine  # noqa: E402
from specdec.forward import LogitsMode  # noqa: E402
from specdec.models import load_target, read_num_layers  # noqa: E402
from specdec.models.config import default_eagle3_layers  # noqa: E402
from specdec.models.registry import config_from_hf  # noqa: E402
from ..builders import StandaloneRunner  # noqa: E402

from .hf_checkpoints import ARCHS, hf_logits, write_eagle3_head, write_hf_checkpoint  # noqa: E402

IDS = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14, 52, 8, 95]  # 14 tokens > sliding window 5
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "mistral", "gemma3": "gemma3_text"}


@pytest.fixture(scope="module", params=ARCHS)
def checkpoint(request, tmp_path_factory):
    arch = request.param
    hf, path = write_hf_checkpoint(arch, tmp_path_factory.mktemp(arch), seed=3)
    return arch, hf, path


def test_loads_sharded_and_matches_transformers(checkpoint):
    arch, hf, path = checkpoint
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("*.safetensors"))) > 1
    model = load_target(path)
    assert model.config.model_type == MODEL_TYPES[arch] and read_num_layers(path) == 2
    ref = hf_logits(hf, IDS)
    ours = StandaloneRunner(model, len(IDS)).forward(IDS, logits_mode=LogitsMode.ALL).next_token_logits
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    # the same positions decoded one token at a time through the KV cache (windows slide past it)
    runner = StandaloneRunner(model, len(IDS))
    steps = [runner.forward(IDS[:6], logits_mode=LogitsMode.LAST).next_token_logits[-1]]
    steps += [runner.forward([t], logits_mode=LogitsMode.LAST).next_token_logits[-1] for t in IDS[6:]]
    torch.testing.assert_close(torch.stack(steps), ref[5:], rtol=1e-4, atol=1e-4)


def test_greedy_eagle3_equals_plain(checkpoint, tmp_path):
    arch, _, path = checkpoint
    target = load_target(path, aux_hidden_layers=default_eagle3_layers(2))
    head = write_eagle3_head(target, tmp_path / "head", draft_vocab_size=80)
    params = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}
    prompts = [IDS[:7], IDS[3:12]]
    plain = Engine(str(path)).generate(input_ids=prompts, sampling_params=params)
    spec = Engine(str(path), speculative_algorithm="EAGLE3", speculative_draft_model_path=str(head),
                  speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=5)
    out = spec.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in out] == [p["output_ids"] for p in plain]
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in out)


def test_sliding_window_changes_the_output(tmp_path):
    """A guard that the window is honoured at all: a wider window gives other late logits."""
    hf, path = write_hf_checkpoint("mistral", tmp_path, seed=3)
    cfg = json.loads((path / "config.json").read_text())
    narrow = load_target(path)
    cfg["sliding_window"] = None
    (path / "config.json").write_text(json.dumps(cfg))
    full = load_target(path)
    a = StandaloneRunner(narrow, len(IDS)).forward(IDS).next_token_logits
    b = StandaloneRunner(full, len(IDS)).forward(IDS).next_token_logits
    torch.testing.assert_close(a[:5], b[:5])
    assert (a[5:] - b[5:]).abs().max() > 1e-3


@pytest.mark.parametrize("cfg, match", [
    ({"architectures": ["GPTNeoXForCausalLM"]}, "not supported; supported: LlamaForCausalLM"),
    ({"architectures": ["Gemma3ForCausalLM"], "final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"architectures": ["LlamaForCausalLM"], "hidden_act": "gelu"}, "hidden_act"),
])
def test_config_errors(cfg, match):
    base = {"vocab_size": 97, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4}
    with pytest.raises(ValueError, match=match):
        config_from_hf({**base, **cfg})


def test_old_style_gemma3_config():
    """transformers < 4.53 configs: sliding_window_pattern and rope_local_base_freq, no layer_types."""
    c = config_from_hf({"architectures": ["Gemma3ForCausalLM"], "vocab_size": 97, "hidden_size": 64,
                        "intermediate_size": 96, "num_hidden_layers": 7, "num_attention_heads": 4,
                        "sliding_window": 8, "sliding_window_pattern": 6, "rope_theta": 1e6,
                        "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert [c.layer_window(i) for i in range(7)] == [8, 8, 8, 8, 8, None, 8]
    assert c.layer_rope(0) == (1e4, None) and c.layer_rope(5)[0] == 1e6 and c.layer_rope(5)[1]["factor"] == 8.0
