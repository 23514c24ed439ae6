"""GGUF files of each llama.cpp architecture (llama for Llama and Mistral, qwen2, qwen3, gemma3)
load into the same model as the HF checkpoint they were converted from."""

import dataclasses

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("transformers")

from specdec.forward import LogitsMode  # noqa: E402
from specdec.models import load_target, read_num_layers  # noqa: E402
from ..builders import StandaloneRunner  # noqa: E402

from .gguf_arch_writer import write_arch_gguf  # noqa: E402
from .hf_checkpoints import write_hf_checkpoint  # noqa: E402

IDS = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 14]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_gguf_equals_hf_checkpoint(arch, tmp_path):
    overrides = {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
                 "query_pre_attn_scalar": 16} if arch == "gemma3" else {}
    _, path = write_hf_checkpoint(arch, tmp_path / "hf", seed=5, **overrides)
    hf = load_target(path)
    gguf_path = write_arch_gguf(tmp_path / "tiny.gguf", hf)
    loaded = load_target(gguf_path)
    assert read_num_layers(gguf_path) == 2
    ignore = {"max_position_embeddings", "rope_scaling"}
    ours = {k: v for k, v in dataclasses.asdict(loaded.config).items() if k not in ignore}
    ref = {k: v for k, v in dataclasses.asdict(hf.config).items() if k not in ignore}
    assert ours == ref
    a = StandaloneRunner(loaded, len(IDS)).forward(IDS, logits_mode=LogitsMode.ALL).next_token_logits
    b = StandaloneRunner(hf, len(IDS)).forward(IDS, logits_mode=LogitsMode.ALL).next_token_logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
