"""Fixtures shared by the tensor-parallel tests on CPU (gloo)."""

import pytest


@pytest.fixture(scope="module")
def qwen3_tp_checkpoint(tmp_path_factory):
    """(target, EAGLE-3 head) directories: Qwen3 (q/k norms) with one KV head, so tp 2 replicates it;
    vocab 97 splits 49 + 48 (+1 padding row)."""
    pytest.importorskip("transformers")
    from specdec.models import load_target
    from specdec.models.config import default_eagle3_layers

    from ..models.hf_checkpoints import write_eagle3_head, write_hf_checkpoint

    root = tmp_path_factory.mktemp("tp")
    _, path = write_hf_checkpoint("qwen3", root / "target", seed=7, num_key_value_heads=1)
    target = load_target(path, aux_hidden_layers=default_eagle3_layers(2))
    return str(path), str(write_eagle3_head(target, root / "head", draft_vocab_size=80))
