"""Where a request ends: every end-of-sequence id of the checkpoint (config.json's, widened by
generation_config.json's, as HF's generate, vLLM and SGLang read them) and the tokenizer's, unless
``ignore_eos``; a tokenizer's eos no longer hides the config's (Gemma 3's ``<end_of_turn>`` stands
only in its generation config)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from specdec.engine.engine import Engine
from specdec.models.loaders import read_target_config
from specdec.models.weights import read_target_hf_config
from ..models.hf_checkpoints import write_hf_checkpoint


def test_generation_config_widens_the_eos(tmp_path):
    write_hf_checkpoint("llama", tmp_path)  # config.json: eos_token_id 2
    assert read_target_config(tmp_path).eos_token_ids == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert read_target_hf_config(tmp_path)["eos_token_id"] == [2, 7]
    assert read_target_config(tmp_path).eos_token_ids == (2, 7)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "do_sample": False}))
    assert read_target_hf_config(tmp_path)["eos_token_id"] == 2


def test_requests_stop_at_the_config_and_tokenizer_eos(tmp_path):
    write_hf_checkpoint("llama", tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    engine = Engine(str(tmp_path))
    engine.tokenizer = SimpleNamespace(eos_token_id=9)  # a tokenizer whose eos the config does not name
    assert engine.make_request(input_ids=[3, 4], sampling_params={"max_new_tokens": 4}).stop_ids == {2, 7, 9}
    ignoring = engine.make_request(input_ids=[3, 4], sampling_params={"max_new_tokens": 4, "ignore_eos": True,
                                                                      "stop_token_ids": [5]})
    assert ignoring.stop_ids == {5}
