"""Models: targets of every registered architecture (Llama, Mistral, Qwen2, Qwen3, Gemma 3; hidden-state
capture, tensor parallelism), EAGLE / EAGLE-3 draft heads, loaders.

``tests/builders.py`` holds tiny random models and the perfect-draft fixture for tests.
"""

from specdec.models.eagle import EagleDraftModel
from specdec.models.eagle3 import Eagle3DraftModel
from specdec.models.config import KVLayout, LlamaConfig, default_eagle3_layers
from specdec.models.gemma3 import Gemma3ForCausalLM
from specdec.models.llama import LlamaForCausalLM
from specdec.models.loaders import (
    draft_aux_hidden_layers,
    load_draft_head,
    load_hf_llama,
    load_hf_target,
    load_llama2c,
    load_target,
    read_num_layers,
    save_draft_head,
)
from specdec.models.parallel import TPGroup
from specdec.models.registry import ARCHITECTURES
from specdec.models.tokenizer import load_tokenizer

__all__ = [
    "ARCHITECTURES",
    "Gemma3ForCausalLM",
    "TPGroup",
    "load_hf_target",
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
