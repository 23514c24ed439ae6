"""specdec's n-gram drafter as a vLLM custom proposer (vLLM 0.26's ``custom_class`` method)::

    LLM(model, speculative_config={"method": "custom_class",
                                   "model": "specdec.ngram.vllm_proposer.NgramProposer",
                                   "num_speculative_tokens": 4})

vLLM builds the class with its ``VllmConfig`` and, after each step, calls ``propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` (``vllm/v1/spec_decode/custom_class_proposer.py``,
``gpu_model_runner.propose_draft_token_ids``); it verifies the chain drafts with its own rejection
sampler. Its drafts continue a short repeat past the history's end (``NgramLookup``'s ``repeat``): in
a run of one token the latest match leaves one token after it, so a draft cut there would be one
token a step. Nothing here imports vLLM: the config is read by attribute, so CI drives the class
through the same call without vLLM installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specdec.ngram.lookup import NgramLookup

# the match window when vLLM's prompt_lookup_min / _max are unset (SGLang's NGRAM defaults: 1 to 12)
DEFAULT_MIN_N, DEFAULT_MAX_N = 1, 12


class NgramProposer:
    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        model = getattr(vllm_config, "model_config", None)
        self.k = int(spec.num_speculative_tokens)
        self.lookup = NgramLookup(min_n=getattr(spec, "prompt_lookup_min", None) or DEFAULT_MIN_N,
                                  max_n=getattr(spec, "prompt_lookup_max", None) or DEFAULT_MAX_N, k=self.k,
                                  max_len=getattr(model, "max_model_len", None), repeat=True)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        """A chain draft per request of the batch ([] where it sampled nothing this step: vLLM
        skips speculation for it); ``token_ids_cpu`` [max_num_reqs, max_model_len], row i's first
        ``num_tokens_no_spec[i]`` tokens its history."""
        rows = [i for i, sampled in enumerate(sampled_token_ids) if sampled]
        drafts = dict(zip(rows, self.lookup.propose(token_ids_cpu, num_tokens_no_spec, rows)))
        return [drafts.get(i, []) for i in range(len(sampled_token_ids))]

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No weights: vLLM calls this on every drafter that has it."""
