"""Models: the Llama-family target (hidden-state capture), EAGLE / EAGLE-3 draft heads, loaders.

``tests/builders.py`` holds tiny random models and the perfect-draft fixture for tests.
"""

from specdec.models.eagle import EagleDraftModel
from specdec.models.eagle3 import Eagle3DraftModel
from specdec.models.llama import KVLayout, LlamaConfig, LlamaForCausalLM, default_eagle3_layers
from specdec.models.loaders import (
    draft_aux_hidden_layers,
    load_draft_head,
    load_hf_llama,
    load_llama2c,
    load_target,
    read_num_layers,
    save_draft_head,
)
from specdec.models.tokenizer import load_tokenizer

__all__ = [
    "Eagle3DraftModel",
    "EagleDraftModel",
    "KVLayout",
    "LlamaConfig",
    "LlamaForCausalLM",
    "default_eagle3_layers",
    "draft_aux_hidden_layers",
    "load_draft_head",
    "load_hf_llama",
    "load_llama2c",
    "load_target",
    "load_tokenizer",
    "read_num_layers",
    "save_draft_head",
]
