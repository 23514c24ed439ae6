"""What the reference host adds for ``--speculative-algorithm STANDALONE``: the draft LM loaded from
``--speculative-draft-model-path`` (any causal LM the model registry builds: HF directories,
GGUF, llama2.c), checked against the target's vocabulary and tokenizer, and every flag that does
not apply refused by name.

Under tensor parallelism each rank holds the whole draft (replicated, not sharded): a small draft
LM's forwards are cheap next to the target's, and every rank computes the same tree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from specdec.attention import create_attention_backend
from specdec.config import ConfigError, SpecAlgorithm
from specdec.eagle.standalone import StandaloneDraft, check_vocab
from specdec.engine.args import EngineArgs
from specdec.models.llama import LlamaForCausalLM

# flags that mean nothing for a standalone draft LM (set: refused), and why
NOT_FOR_STANDALONE = {
    "speculative_token_map": "a standalone draft LM predicts over the target's whole vocabulary (no hot-token map)",
    "speculative_simulate_acceptance_model": "simulated acceptance replays an EAGLE head's trees",
}
FLAG = "--speculative-draft-model-path"


def is_standalone(args: EngineArgs) -> bool:
    return args.speculative and SpecAlgorithm.parse(args.speculative_algorithm) is SpecAlgorithm.STANDALONE


def standalone_draft(args: EngineArgs, target_model: torch.nn.Module, tokenizer: Any,
                     draft_model: torch.nn.Module | None, *, dtype: torch.dtype) -> StandaloneDraft | None:
    """The draft of STANDALONE (``draft_model`` if given in memory, else loaded from the flag),
    checked against the target; None for another algorithm. Raises ConfigError / ValueError naming
    the flag at fault."""
    if not is_standalone(args):
        return None
    for name, why in NOT_FOR_STANDALONE.items():
        if getattr(args, name) is not None:
            raise ConfigError(f"--{name.replace('_', '-')} does not apply to --speculative-algorithm STANDALONE: {why}")
    draft_tokenizer = None
    if draft_model is None:
        from specdec.models.loaders import load_target
        from specdec.models.tokenizer import load_tokenizer

        path = args.speculative_draft_model_path
        _refuse_heads(path)
        draft_model = load_target(path, dtype=dtype, device=args.device, load_format=args.load_format,
                                  seed=args.random_seed + 1)
        draft_tokenizer = load_tokenizer(path)
    elif isinstance(draft_model, StandaloneDraft):
        draft_model = draft_model.model
    if not isinstance(draft_model, LlamaForCausalLM):  # every registry architecture is one
        raise ConfigError(f"{FLAG}: STANDALONE drafts with a causal LM of the model registry, not a "
                          f"{type(draft_model).__name__} (an EAGLE head needs --speculative-algorithm EAGLE or EAGLE3)")
    check_vocab(target_model.config, draft_model.config, tokenizer, draft_tokenizer, flag=FLAG)
    if getattr(draft_model.config, "has_sliding_layers", False) \
            and not create_attention_backend(args.attention).supports_sliding_window:
        raise ConfigError(f"{FLAG}: the draft model uses sliding-window attention, which --attention-backend "
                          f"{args.attention} does not have; use --attention-backend torch_native")
    return StandaloneDraft(draft_model)


def _refuse_heads(path: str | Path | None) -> None:
    """An EAGLE / EAGLE-3 head directory is not a standalone draft: say which algorithm it needs."""
    config = Path(path) / "config.json" if path is not None else None
    if config is None or not config.is_file():
        return
    archs = json.loads(config.read_text()).get("architectures") or []
    if any("Eagle" in a for a in archs):
        raise ConfigError(f"{FLAG} {path} is an EAGLE draft head ({archs[0]}), not a causal LM; use "
                          "--speculative-algorithm EAGLE or EAGLE3 for it")
