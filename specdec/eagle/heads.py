"""How a draft head plugs into the worker, resolved once at construction (EAGLE vs EAGLE-3 vs a
standalone draft LM).

EAGLE-1/2 heads condition on the target's final hidden state and predict over the target vocab.
EAGLE-3 heads condition on the concatenated inputs of three target layers and predict over a
reduced draft vocab that ``d2t`` maps back to target ids (``target = draft + d2t[draft]``).
A standalone draft (``specdec.eagle.standalone``) reads no target features and predicts over the
target vocab itself.
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.config import SpecConfig


@dataclasses.dataclass(frozen=True)
class DraftHeadAdapter:
    # features per token the head expects from the target (H for EAGLE, 3H for EAGLE-3)
    target_feature_size: int
    # [draft vocab] int64 target id of each draft id (None: the same ids, EAGLE's full vocab);
    # the draft's top-k kernel reads it, so the mapping costs no kernel of its own
    target_ids: torch.Tensor | None = None


def resolve_head(
    config: SpecConfig,
    draft_model: torch.nn.Module,
    *,
    hidden_size: int,
    target_aux_layers: tuple[int, ...] | None,
) -> DraftHeadAdapter:
    """Check that target capture and draft head agree, and say how to talk to the head."""
    standalone = bool(getattr(draft_model, "standalone", False))
    if config.is_standalone != standalone:
        raise ValueError("--speculative-algorithm STANDALONE needs a causal LM as the draft (StandaloneDraft)"
                         if config.is_standalone else
                         f"--speculative-algorithm {config.algorithm.value} got a standalone draft LM; use STANDALONE")
    if standalone:
        return DraftHeadAdapter(0)
    d2t = getattr(draft_model, "d2t", None)
    if config.is_eagle3:
        if d2t is None:
            raise ValueError(
                "--speculative-algorithm EAGLE3 needs an EAGLE-3 draft head "
                f"(LlamaForCausalLMEagle3); got {type(draft_model).__name__}"
            )
        if not target_aux_layers:
            raise ValueError("EAGLE3: the target must capture auxiliary hidden states (aux_hidden_layers)")
        d2t = d2t.to(torch.int64)
        return DraftHeadAdapter(len(target_aux_layers) * hidden_size, torch.arange(len(d2t), device=d2t.device) + d2t)
    if d2t is not None:
        raise ValueError(
            "--speculative-algorithm EAGLE got an EAGLE-3 draft head; use --speculative-algorithm EAGLE3"
        )
    if target_aux_layers:
        raise ValueError("EAGLE: the target must capture its final hidden state, not auxiliary layers")
    hot = getattr(draft_model, "hot_token_ids", None)
    if hot is not None:  # EAGLE-2 reduced vocabulary (--speculative-token-map)
        return DraftHeadAdapter(hidden_size, hot.to(torch.int64))
    return DraftHeadAdapter(hidden_size)
