"""BatchSampling: one batch's sampling settings as the worker sees them (``specdec.host.SamplingInfo``).

Besides temperature / top-k / top-p / min-p (``sampling``) it runs the requests' logits processors
(``logits_process``: penalties, logit_bias, min_new_tokens, grammar masks) at every tree node,
draws each seeded request's random numbers from its own generator, and records logprobs.

Logprobs are log_softmax of the *processed* target logits (after penalties, logit_bias,
min_new_tokens and the grammar mask; before temperature, top-k, top-p, min-p), at the node that
emitted each committed token. Greedy logprobs are therefore the same with speculation on and off.

Everything beyond plain sampling is skipped when no request of the batch asks for it: the
per-request tensors are built on first use, and an all-greedy batch copies nothing to the device.

Glossary: bs = requests; N = tree nodes per request; V = vocab size; m = committed tokens per
request a step may emit (S + 1 with speculation, 1 otherwise); k = top logprobs per token.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from specdec.eagle.output import copy_to_host_async
from specdec.engine.batch_flags import BatchStatics
from specdec.engine.logits_process import ProcessorBatch, apply_processors
from specdec.engine.sampling import SamplingBatch, probs_from_logits, sample
from specdec.models.ops.topk import argmax

# a seeded request's verification coins a step: a fixed block (``BatchSampling.uniforms``), as many as
# the largest verify trees the defaults build (NGRAM's 12 nodes, EAGLE's up to 64)
SEEDED_COINS = 64


# the logprob reported for a token of probability zero (JSON has no -inf; OpenAI's value)
MIN_LOGPROB = -9999.0


@dataclasses.dataclass(frozen=True)
class StepLogprobs:
    """Logprobs of the tokens one step emitted, per request (host lists)."""

    # [bs][m] logprob of each emitted token
    token: list[list[float]]
    # [bs][m][k] (token id, logprob) of the k most likely tokens, best first
    top: list[list[list[tuple[int, float]]]]

    def of(self, i: int) -> tuple[list[float], list[list[tuple[int, float]]]]:
        """Request ``i``'s logprobs and top lists, as ``Request.append`` takes them."""
        return self.token[i], self.top[i]


class BatchSampling:
    def __init__(self, requests: Sequence[Any], device, generator: torch.Generator | None,
                 vocab_size: int | None = None, *, prompt_logprobs: Any = None,
                 statics: BatchStatics | None = None) -> None:
        """``requests``: objects with ``params`` (SamplingParams), ``prompt_ids``, ``output_ids``,
        ``stop_ids``, and ``grammar`` / ``generator`` (None when unused). ``prompt_logprobs``: a
        prefill step's ``PromptLogprobs`` recorder (its chunks may include requests not sampled).
        ``statics``: the batch's flags and parameter tensors kept from an earlier step of the same
        requests (``specdec.engine.batch_flags``; default: worked out here)."""
        statics = statics if statics is not None else BatchStatics(requests)
        self._statics = statics
        self._reqs = statics.requests
        self._params = statics.params
        self._device = device
        self._vocab_size = vocab_size
        self._processors: ProcessorBatch | None = None
        flags = statics.flags
        self.is_all_greedy = flags.all_greedy
        self.generator = generator
        self.needs_processing = flags.needs_processing
        # None: no request wants logprobs; else how many alternatives the batch computes
        self.top_logprobs_num = flags.top_logprobs_num
        # the step's prompt-logprob recorder (specdec.engine.prompt_logprobs), when one is wanted
        self.prompt_logprobs = prompt_logprobs
        self.wants_prompt_logprobs = prompt_logprobs is not None
        self._seeded = flags.seeded
        self._grammar = flags.grammar
        # the recorded logprobs' host copies under way (``record_logprobs``)
        self._recorded: tuple[Callable[[], list], ...] | None = None

    @property
    def batch(self) -> SamplingBatch:
        return self._statics.sampling_batch(self._device)

    # ------------------------------------------------------------ processors
    def process(self, logits: torch.Tensor, tree: Any = None) -> torch.Tensor:
        """The requests' processed logits: [bs * N, V] fp32 (``logits`` itself when none applies).

        ``tree``: None (one row per request: its root), or a draft tree with ``draft_tokens``
        [bs * N], ``tree_mask`` [bs * N * N] (QLEN_ONLY), ``retrive_next_token`` and
        ``retrive_next_sibling`` [bs, N] (local node indices, -1 for none).
        """
        if not self.needs_processing:
            return logits
        bs, vocab = len(self._reqs), logits.shape[1]
        if self._processors is None:
            self._processors = ProcessorBatch.build(self._reqs, vocab, logits.device)
        n = logits.shape[0] // bs
        candidates = ancestors = None
        if tree is not None:
            candidates = tree.draft_tokens.view(bs, n)
            ancestors = tree.tree_mask.view(bs, n, n).bool()
        return apply_processors(logits, self._processors, candidates=candidates, ancestors=ancestors,
                                grammar_mask=self._grammar_mask(tree, bs, n, vocab, logits.device))

    def _grammar_mask(self, tree: Any, bs: int, n: int, vocab: int, device) -> torch.Tensor | None:
        if not self._grammar:
            return None
        grammars = [getattr(r, "grammar", None) for r in self._reqs]
        mask = torch.ones(bs, n, vocab, dtype=torch.bool)
        for b, (g, r) in enumerate(zip(grammars, self._reqs)):
            if g is None:
                continue
            if tree is None:
                rows = g.tree_mask(torch.tensor([r.output_ids[-1] if r.output_ids else 0]),
                                   torch.tensor([-1]), torch.tensor([-1]))
            else:
                rows = g.tree_mask(tree.draft_tokens.view(bs, n)[b], tree.retrive_next_token[b],
                                   tree.retrive_next_sibling[b])
            # NOTE: a node whose token the grammar rejects has no allowed token; it is never
            # accepted (its parent's row forbids it), so any row keeps its softmax finite
            rows[~rows.any(1)] = True
            mask[b, :, : rows.shape[1]] = rows
        return mask.to(device)

    # ------------------------------------------------------------ distributions and draws
    def probs(self, logits: torch.Tensor, row_to_request: torch.Tensor) -> torch.Tensor:
        return probs_from_logits(logits, self.batch, row_to_request)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per request from its root logits [bs, V] (processors applied here): [bs]."""
        logits = self.process(logits)
        if self.is_all_greedy:
            tokens = argmax(logits)
        elif not self._seeded:
            tokens = sample(logits, self.batch, generator=self.generator)
        else:
            tokens = self._sample_seeded(logits)
        if self.top_logprobs_num is not None:
            self.record_logprobs(logits[:, None, :], tokens[:, None])
        return tokens

    def _sample_seeded(self, logits: torch.Tensor) -> torch.Tensor:
        probs = probs_from_logits(logits, self.batch)  # [bs, V]
        tokens = argmax(logits)
        for b, r in enumerate(self._reqs):
            if not self._params[b].is_greedy:
                gen = getattr(r, "generator", None) or self.generator
                tokens[b] = torch.multinomial(probs[b], 1, generator=gen)[0]
        return tokens

    def uniforms(self, bs: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Verification's coins: [bs, n] per node and [bs] for the final draw, in (0, 1].

        A seeded request draws from its own generator a block of max(n, SEEDED_COINS) + 1 numbers a
        step, so its output depends neither on the rest of the batch's draws nor (up to SEEDED_COINS
        nodes) on the step's verify size, which follows the batch (the largest tree, NGRAM's and
        adaptive speculation's choices)."""
        coins = 1.0 - torch.rand(bs, n, generator=self.generator, device=device)
        final = 1.0 - torch.rand(bs, generator=self.generator, device=device)
        block = max(n, SEEDED_COINS)
        for b, r in enumerate(self._reqs):
            gen = getattr(r, "generator", None)
            if gen is not None:
                own = 1.0 - torch.rand(block + 1, generator=gen, device=device)
                coins[b], final[b] = own[:n], own[block]
        return coins, final

    # ------------------------------------------------------------ logprobs
    def record_logprobs(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """Logprobs of ``tokens`` [bs, m] under processed ``logits`` [bs, m, V] (kept on the device)."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # [bs, m, V]
        token = logprobs.gather(2, tokens.long()[:, :, None]).squeeze(2)  # [bs, m]
        top_lp, top_ids = logprobs.topk(self.top_logprobs_num or 0, dim=-1)  # [bs, m, k]
        # copied while later work runs: under overlap the next step is queued before this one is read
        self._recorded = tuple(copy_to_host_async(x) for x in (token, top_ids, top_lp))

    def record_prompt_logprobs(self, logits: torch.Tensor, input_ids: torch.Tensor, lens: list[int]) -> None:
        """Every position's logits [sum(lens), V] of a prefill step: the host's prompt logprobs."""
        self.prompt_logprobs.record(logits)

    def take_logprobs(self) -> StepLogprobs | None:
        """The recorded logprobs as host lists, each request's top list cut to its own k."""
        if self._recorded is None:
            return None
        token, top_ids, top_lp = (read() for read in self._recorded)
        self._recorded = None
        # NOTE: tokens a processor forbids (-inf: a grammar, min_new_tokens) are left out of the
        # top lists; JSON has no -inf
        top = [[[(i, lp) for i, lp in zip(ids[:p.top_logprobs_num], lps[:p.top_logprobs_num]) if lp > -math.inf]
                for ids, lps in zip(i_b, l_b)] for i_b, l_b, p in zip(top_ids, top_lp, self._params)]
        return StepLogprobs(token=[[max(x, MIN_LOGPROB) for x in row] for row in token], top=top)
