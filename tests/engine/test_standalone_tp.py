"""STANDALONE under tensor parallelism on CPU (gloo, 2 ranks): the target sharded, the draft LM
(another architecture, smaller) replicated on every rank; greedy output equals tp 1 plain decoding."""

import pytest

pytest.importorskip("transformers")

from specdec.engine.engine import Engine  # noqa: E402

from ..models.hf_checkpoints import write_hf_checkpoint  # noqa: E402

PROMPTS = [[5, 17, 3, 88, 41, 9, 60], [2, 33, 71, 14, 52, 8, 95, 11, 4]]
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


def test_tp2_standalone_equals_tp1_plain(tmp_path):
    _, target = write_hf_checkpoint("qwen3", tmp_path / "target", seed=7, num_key_value_heads=1)
    _, draft = write_hf_checkpoint("llama", tmp_path / "draft", seed=8, num_hidden_layers=1, hidden_size=32,
                                   intermediate_size=48, num_attention_heads=2, num_key_value_heads=1)
    plain = [o["output_ids"] for o in Engine(str(target)).generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    spec = Engine(str(target), tp_size=2, speculative_algorithm="STANDALONE", speculative_draft_model_path=str(draft),
                  speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=5)
    try:
        assert spec.target_model.tp.size == 2 and spec.draft_model.model.tp.size == 1  # the draft whole
        out = spec.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [o["output_ids"] for o in out] == plain
        assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in out)
    finally:
        spec.shutdown()
