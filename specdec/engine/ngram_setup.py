"""What the reference host adds for ``--speculative-algorithm NGRAM``: its settings from the flags
(refusing, by name, every flag that does not apply), each request's tokens on the host
(``TokenTable``, the ``specdec.host.TokenHistory`` the n-gram worker reads), and the start-up
warm-up of every verify size (``warm_up``).
"""

from __future__ import annotations

import numpy as np

from specdec.config import ConfigError, SpecAlgorithm, SpecConfig
from specdec.engine.args import EngineArgs
from specdec.ngram.config import (
    DEFAULT_BRANCH_LENGTH, DEFAULT_MAX_BFS_BREADTH, DEFAULT_MAX_MATCH_WINDOW, DEFAULT_MIN_BFS_BREADTH, DEFAULT_MIN_MATCH_WINDOW, NgramConfig,
)

NGRAM_FLAGS = (
    "speculative_ngram_min_match_window_size", "speculative_ngram_max_match_window_size",
    "speculative_ngram_min_bfs_breadth", "speculative_ngram_max_bfs_breadth", "speculative_ngram_match_type",
    "speculative_ngram_branch_length", "speculative_ngram_capacity",
)
# flags that ask for drafting on the host (trees, frequency order, the cross-request cache)
HOST_DRAFT_FLAGS = ("speculative_ngram_min_bfs_breadth", "speculative_ngram_max_bfs_breadth",
                    "speculative_ngram_match_type", "speculative_ngram_capacity", "speculative_ngram_branch_length")
# flags that mean nothing without a draft model (set: refused under NGRAM), and why
NOT_FOR_NGRAM = {
    "speculative_draft_model_path": "NGRAM has no draft model",
    "speculative_num_steps": "NGRAM's tree depth follows --speculative-num-draft-tokens",
    "speculative_eagle_topk": "NGRAM's branching is --speculative-ngram-max-bfs-breadth",
    "speculative_token_map": "NGRAM has no draft vocabulary",
    "speculative_draft_model_quantization": "NGRAM has no draft model",
    "speculative_adaptive_profile": "NGRAM's adaptive rule needs no step-cost profile",
    "speculative_simulate_accept_length": "simulated acceptance is for EAGLE benchmarks",
    "speculative_simulate_acceptance_model": "simulated acceptance is for EAGLE benchmarks",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def ngram_configs(args: EngineArgs, *, draft_model=None) -> tuple[SpecConfig, NgramConfig] | None:
    """The shared and the drafter's settings under NGRAM; None for another algorithm (or none).
    Raises ConfigError naming a flag that does not apply."""
    is_ngram = args.speculative and SpecAlgorithm.parse(args.speculative_algorithm) is SpecAlgorithm.NGRAM
    if not is_ngram:
        given = [_flag(f) for f in NGRAM_FLAGS if getattr(args, f) is not None]
        if given:
            raise ConfigError(f"{given[0]} applies only to --speculative-algorithm NGRAM")
        return None
    for name, why in NOT_FOR_NGRAM.items():
        if getattr(args, name) is not None:
            raise ConfigError(f"{_flag(name)} does not apply to --speculative-algorithm NGRAM: {why}")
    if args.speculative_draft_kv_cache_dtype != "auto":
        raise ConfigError("--speculative-draft-kv-cache-dtype does not apply to --speculative-algorithm NGRAM: "
                          "it has no draft KV cache")
    if draft_model is not None:
        raise ConfigError("--speculative-algorithm NGRAM takes no draft model")

    def get(name: str, default):
        value = getattr(args, "speculative_ngram_" + name)
        return default if value is None else value

    max_window = get("max_match_window_size", DEFAULT_MAX_MATCH_WINDOW)
    # specdec's default drafts chains on the device (a lookup then launches past the unread step, as a
    # plain one does); SGLang's trees (the BFS-breadth flags), PROB and the cross-request cache draft on
    # the host, each lookup reading the step before it (H200, SmolLM2-135M: a host lookup step took
    # 2.2-2.6 ms against 0.9-1.0 ms for a plain one, benchmarks/results/2026-11-29-h200-ngram-ahead)
    host_trees = [f for f in HOST_DRAFT_FLAGS if getattr(args, f) is not None]
    breadth = DEFAULT_MAX_BFS_BREADTH if host_trees else 1
    if args.speculative_ngram_branch_length is not None and args.speculative_ngram_capacity is None:
        raise ConfigError("--speculative-ngram-branch-length needs --speculative-ngram-capacity "
                          "(specdec's cross-request cache is off without a capacity)")
    ngram = NgramConfig(
        num_draft_tokens=args.speculative_num_draft_tokens or max_window,
        min_match_window=get("min_match_window_size", DEFAULT_MIN_MATCH_WINDOW), max_match_window=max_window,
        min_bfs_breadth=get("min_bfs_breadth", DEFAULT_MIN_BFS_BREADTH),
        max_bfs_breadth=get("max_bfs_breadth", breadth), match_type=get("match_type", "BFS"),
        adaptive=args.speculative_adaptive != "off", max_verify_rows=args.speculative_adaptive_max_verify_rows,
        cache_capacity=get("capacity", 0), cache_branch_length=get("branch_length", DEFAULT_BRANCH_LENGTH),
        device_lookup=not host_trees,
    )
    n = ngram.num_draft_tokens
    spec = SpecConfig(
        algorithm=SpecAlgorithm.NGRAM, draft_model_path=None, num_steps=n - 1, topk=ngram.max_bfs_breadth,
        num_draft_tokens=n, accept_threshold_single=args.speculative_accept_threshold_single,
        accept_threshold_acc=args.speculative_accept_threshold_acc,
        batch_size_threshold=args.speculative_batch_size_threshold,
    )
    return spec, ngram


class TokenTable:
    """Each request row's prompt + output on the host (``specdec.host.TokenHistory``), brought up to
    date incrementally: a row's owner appends only its new output tokens; a new owner rewrites it."""

    def __init__(self, max_reqs: int, max_context: int) -> None:
        self.token_ids = np.zeros((max_reqs, max_context), dtype=np.int32)  # [max_reqs, max_context]
        self.num_tokens = np.zeros(max_reqs, dtype=np.int64)  # [max_reqs]
        self._owner: list[object] = [None] * max_reqs

    def sync(self, reqs) -> None:
        """Rows of ``reqs`` (running ``Request``s) hold their prompt and output so far."""
        for req in reqs:
            row, prompt = req.row, len(req.prompt_ids)
            total = prompt + len(req.output_ids)
            if self._owner[row] is not req or self.num_tokens[row] > total:
                self._owner[row] = req
                self.token_ids[row, :prompt] = req.prompt_ids
                start = prompt
            else:
                start = int(self.num_tokens[row])
            if total > start:
                self.token_ids[row, start:total] = req.output_ids[start - prompt:]
            self.num_tokens[row] = total


# the warm-up's prompt (period 8, up to 32 tokens: short contexts take fewer) and its requests' sampling:
# each verify size's kernels compile per size and per greedy / sampled verification
WARM_UP_PROMPT = [3, 4, 5, 6, 7, 8, 9, 10] * 4
WARM_UP_PARAMS = ({"temperature": 0.0, "max_new_tokens": 3, "ignore_eos": True},
                  {"temperature": 1.0, "max_new_tokens": 3, "ignore_eos": True})


def warm_up(engine) -> dict[str, int]:
    """Run every verify size once before serving, greedy and sampled, and greedy for one request alone:
    the verify's eager kernels (acceptance, KV commit) are compiled per size, and a size first used by a
    request stalled its step 50-140 ms on an H200 (benchmarks/results/2026-11-29-h200-ngram/). Then the worker's
    statistics and the prefix cache start afresh. Returns the decode steps run, by shape."""
    worker, steps = engine.worker, engine.scheduler.decoder.spec_shape_steps
    prompt = WARM_UP_PROMPT[: max(engine.context_length - WARM_UP_PARAMS[0]["max_new_tokens"], 1)]
    try:
        for n in worker.budget.sizes:
            worker.force = n
            engine.generate(input_ids=[list(prompt)] * len(WARM_UP_PARAMS), sampling_params=list(WARM_UP_PARAMS))
            # NOTE: and one request alone: Triton specializes integer arguments equal to 1, so a batch of one
            # compiles kernels of its own (a fresh process's first 12-node lookup at one request stalled ~0.6 s
            # on an H200 after a warm-up of pairs alone: benchmarks/results/2026-11-29-h200-ngram-device)
            engine.generate(input_ids=[list(prompt)], sampling_params=[WARM_UP_PARAMS[0]])
        return dict(steps)
    finally:
        worker.forget_warm_up()
        steps.clear()
        engine.flush_cache()
