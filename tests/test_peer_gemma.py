"""Gemma-3-270M beside vLLM (``gpu_peer.sh gemma``): its published config.json written as a dummy
checkpoint (``write_dummy_config``) that specdec parses as Gemma 3 and decodes with random weights,
and the decode rows named after the checkpoint's shape (``benchmarks/peer/offline.py``)."""

import importlib.util
import json
from pathlib import Path

import pytest

from specdec.bench.synthetic_settings import HF_CONFIGS, write_dummy_config
from specdec.engine.args import EngineArgs
from specdec.engine.engine import Engine
from specdec.models.registry import config_from_hf

SPEC = importlib.util.spec_from_file_location(
    "peer_offline", Path(__file__).resolve().parents[1] / "benchmarks" / "peer" / "offline.py")
offline = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(offline)

GLOBAL_LAYERS = [5, 11, 17]  # every 6th layer of 18 attends the whole context


def _written(tmp_path: Path, **overrides) -> tuple[str, dict]:
    path = write_dummy_config("gemma-3-270m", tmp_path, **overrides)
    return path, json.loads((Path(path) / "config.json").read_text())


def test_config_is_gemma_3_270m_as_published(tmp_path):
    path, d = _written(tmp_path)
    assert Path(path).name == "gemma-3-270m-target"
    assert d == HF_CONFIGS["gemma-3-270m"]
    # what vLLM 0.26's Gemma3ForCausalLM reads (through transformers' Gemma3TextConfig), besides the shape
    assert (d["architectures"], d["model_type"], d["torch_dtype"]) == (["Gemma3ForCausalLM"], "gemma3_text", "bfloat16")
    assert [i for i, t in enumerate(d["layer_types"]) if t == "full_attention"] == GLOBAL_LAYERS
    assert (d["sliding_window"], d["rope_theta"], d["rope_local_base_freq"]) == (512, 1e6, 1e4)
    assert d["final_logit_softcapping"] is None and d["attn_logit_softcapping"] is None

    c = config_from_hf(d)
    assert (c.model_type, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (
        "gemma3_text", 262144, 640, 2048, 18)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.query_pre_attn_scalar) == (4, 1, 256, 256)
    assert (c.hidden_act, c.tie_word_embeddings, c.qk_norm) == ("gelu_pytorch_tanh", True, True)
    assert [c.layer_window(i) for i in range(18)] == [None if i in GLOBAL_LAYERS else 512 for i in range(18)]
    assert c.layer_rope(0)[0] == 1e4 and c.layer_rope(5)[0] == 1e6
    # sliding layers run on triton with CUDA graphs: --attention-backend auto picks it on a GPU
    assert c.has_sliding_layers
    assert EngineArgs(model_path=path, device="cuda").with_attention_resolved().attention_backend == "triton"


def test_transformers_reads_the_same_layers(tmp_path):
    transformers = pytest.importorskip("transformers")
    path, d = _written(tmp_path)
    hf = transformers.AutoConfig.from_pretrained(path)
    assert type(hf).__name__ == "Gemma3TextConfig"
    assert list(hf.layer_types) == d["layer_types"] and hf.sliding_window == 512


def test_fewer_layers_keep_the_every_sixth_global_rule(tmp_path):
    _, d = _written(tmp_path, num_hidden_layers=7, vocab_size=1000)
    assert d["layer_types"] == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]
    assert d["vocab_size"] == 1000 and d["hidden_size"] == 640


def test_engine_decodes_the_shape_with_random_weights(tmp_path):
    """The real widths (640 / 2048 / head_dim 256, MQA), 6 layers, a small vocab and an 8-token window
    that the 13-token prompt overruns: a batch decodes each request as it decodes alone."""
    path, _ = _written(tmp_path, vocab_size=1000, num_hidden_layers=6, sliding_window=8)
    engine = Engine(path, load_format="dummy")
    prompts = [[5, 17, 3, 88, 41, 9, 60, 7, 250, 999, 12, 40, 3], [2, 33, 71, 14]]
    params = {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}
    together = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
    alone = [engine.generate(input_ids=[p], sampling_params=params)[0]["output_ids"] for p in prompts]
    assert together == alone
    assert all(len(ids) == 5 and all(0 <= t < 1000 for t in ids) for ids in together)


@pytest.mark.parametrize("model, name", [("/tmp/ck/llama-3.1-8b-target", "llama-3.1-8b-decode"),
                                         ("/tmp/ck/gemma-3-270m-target/", "gemma-3-270m-decode"),
                                         ("/models/some-8b", "some-8b-decode")])
def test_decode_rows_are_named_after_the_checkpoint_shape(model, name):
    assert offline.decode_workload(model) == name
