"""Logits processors: penalties, logit_bias, min_new_tokens and grammar masks, at every tree node.

They run on the target logits before temperature and the top-k / top-p / min-p filters, in
verification (every node of the draft tree) and in plain decoding and prefill (one node: the root).
A node's processors see what plain decoding would see after committing the node's path:

    output counts at node t = counts of the request's committed output tokens
                              + the draft tokens on the path root -> t (root excluded: committed)
    output length at node t = committed output tokens + depth(t)

so the target distribution at each tree position equals plain decoding's and verification stays
lossless (greedy: the same argmax; sampling: the same distribution).

    presence_penalty    logit -= p       if count > 0       (OpenAI; output tokens only)
    frequency_penalty   logit -= f * count                  (OpenAI; output tokens only)
    repetition_penalty  logit /= r if logit > 0 else *= r,  for tokens in the prompt or output (HF)
    logit_bias          logit += bias[token]
    min_new_tokens      stop tokens (EOS, stop_token_ids) get -inf while length < min_new_tokens
    grammar             tokens the grammar forbids after the node's path get -inf (where a finished
                        grammar allows only a stop token, min_new_tokens yields to it)

Worked example (one request, output so far [7], tree root -> a -> b, presence 1, frequency 0.5):
    node root: counts {7: 1}               -> logit[7] -= 1.5
    node a:    counts {7: 1, a: 1}         -> logit[7] -= 1.5, logit[a] -= 1.5
    node b:    counts {7: 1, a: 1, b: 1}   -> ... and logit[b] -= 1.5

Glossary: bs = requests; N = tree nodes per request (1 outside verification); V = vocab size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch


@dataclasses.dataclass(frozen=True)
class ProcessorBatch:
    """The processors of a batch's requests as tensors (neutral values where a request has none)."""

    # [bs] fp32
    presence: torch.Tensor
    frequency: torch.Tensor
    repetition: torch.Tensor
    # [bs, V] fp32 committed output token counts
    counts: torch.Tensor
    # [bs, V] bool tokens of the prompt (repetition_penalty also counts these)
    prompt_seen: torch.Tensor
    # [bs, V] fp32, or None when no request has a logit_bias
    bias: torch.Tensor | None
    # [bs, V] bool stop tokens of each request
    stop_mask: torch.Tensor
    # [bs] int64 tokens still needed before a stop token is allowed (min_new_tokens - outputs)
    min_left: torch.Tensor
    any_penalty: bool
    any_min_tokens: bool

    @classmethod
    def build(cls, requests: Sequence, vocab_size: int, device) -> "ProcessorBatch":
        """``requests``: objects with ``params``, ``prompt_ids``, ``output_ids``, ``stop_ids``."""
        bs = len(requests)
        params = [r.params for r in requests]
        counts = torch.zeros(bs, vocab_size, dtype=torch.float32)
        prompt_seen = torch.zeros(bs, vocab_size, dtype=torch.bool)
        stop_mask = torch.zeros(bs, vocab_size, dtype=torch.bool)
        bias = torch.zeros(bs, vocab_size, dtype=torch.float32) if any(p.logit_bias for p in params) else None
        for b, r in enumerate(requests):
            p = r.params
            if r.output_ids and (p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0):
                ids = torch.tensor(r.output_ids, dtype=torch.int64)
                counts[b].index_add_(0, ids, torch.ones(len(ids)))
            if p.repetition_penalty != 1.0:
                prompt_seen[b, torch.tensor(r.prompt_ids, dtype=torch.int64)] = True
            if p.min_new_tokens:
                stop_mask[b, [t for t in r.stop_ids if t < vocab_size]] = True
            if p.logit_bias:
                tokens, values = zip(*p.logit_bias)
                bias[b, list(tokens)] = torch.tensor(values, dtype=torch.float32)

        def put(x: torch.Tensor) -> torch.Tensor:
            return x.to(device)

        return cls(
            presence=put(torch.tensor([p.presence_penalty for p in params], dtype=torch.float32)),
            frequency=put(torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32)),
            repetition=put(torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32)),
            counts=put(counts), prompt_seen=put(prompt_seen), bias=None if bias is None else put(bias),
            stop_mask=put(stop_mask),
            # NOTE: capped at max_new_tokens: any int is valid, a tensor holds 64 bits
            min_left=put(torch.tensor([min(p.min_new_tokens, p.max_new_tokens) - len(r.output_ids)
                                       for p, r in zip(params, requests)])),
            any_penalty=any(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0 for p in params),
            any_min_tokens=any(p.min_new_tokens > len(r.output_ids) for p, r in zip(params, requests)),
        )


def path_counts(
    candidates: torch.Tensor,  # [bs, N] node tokens, root first
    ancestors: torch.Tensor,  # [bs, N, N] bool: row t = the nodes on the path root -> t (itself included)
    vocab_size: int,
) -> torch.Tensor:  # [bs, N, V] fp32: how often each token occurs on the path, root excluded
    bs, n = candidates.shape
    on_path = ancestors.clone()
    on_path[:, :, 0] = False  # the root token is committed: the request's counts hold it
    out = torch.zeros(bs, n, vocab_size, dtype=torch.float32, device=candidates.device)
    index = candidates[:, None, :].expand(bs, n, n).long()  # [bs, N, N] token of column j
    return out.scatter_add_(2, index, on_path.float())


def apply_processors(
    logits: torch.Tensor,  # [bs * N, V] target logits at each node, request by request
    batch: ProcessorBatch,
    *,
    candidates: torch.Tensor | None = None,  # [bs, N]; None: N = 1 (the root only)
    ancestors: torch.Tensor | None = None,  # [bs, N, N] bool
    grammar_mask: torch.Tensor | None = None,  # [bs, N, V] bool allowed tokens (True where no grammar)
) -> torch.Tensor:  # [bs * N, V] fp32 processed logits (a new tensor)
    bs, vocab = batch.counts.shape
    n = logits.shape[0] // bs
    out = logits.float().view(bs, n, vocab).clone()  # [bs, N, V]
    depth = torch.zeros(bs, n, dtype=torch.int64, device=out.device)
    if candidates is not None and n > 1:
        depth = ancestors.sum(-1) - 1  # [bs, N]
    if batch.any_penalty:
        counts = batch.counts[:, None, :]  # [bs, 1, V]
        if candidates is not None and n > 1:
            counts = counts + path_counts(candidates, ancestors, vocab)  # [bs, N, V]
        out -= batch.presence[:, None, None] * (counts > 0) + batch.frequency[:, None, None] * counts
        seen = (counts > 0) | batch.prompt_seen[:, None, :]
        rep = batch.repetition[:, None, None]
        out = torch.where(seen, torch.where(out > 0, out / rep, out * rep), out)
    if batch.bias is not None:
        out += batch.bias[:, None, :]
    allowed = grammar_mask  # [bs, N, V] or None
    if batch.any_min_tokens:
        banned = (depth < batch.min_left[:, None])[:, :, None] & batch.stop_mask[:, None, :]  # [bs, N, V]
        allowed = ~banned if allowed is None else allowed & ~banned
        if grammar_mask is not None:
            # NOTE: a finished grammar allows only a stop token: there min_new_tokens yields
            stuck = ~allowed.any(-1, keepdim=True)  # [bs, N, 1]
            allowed = torch.where(stuck, grammar_mask, allowed)
    if allowed is not None:
        out.masked_fill_(~allowed, float("-inf"))
    return out.view(bs * n, vocab)
