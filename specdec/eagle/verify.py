"""Tree verification: pick the accepted path of each request and what it commits.

Glossary: accepted = draft tokens the target agrees with (k per request); bonus = the target's
own token after the last accepted node; committed = accepted + bonus (k + 1 tokens). Node
indices are global over the flattened batch (request b's nodes are b*N .. b*N + N - 1).

Worked example (N = 4, one request, tree root -> {1, 2}, 1 -> {3}):
    candidates       [r, a, b, c]        target argmax at nodes [a, c, x, y]
    verify walks     root: child 1 (a) == a -> accept; node 1: child 3 (c) == c -> accept;
                     node 3 is a leaf -> stop
    accept_index     [0, 1, 3]           accept_length k = 2
    committed        predicts[0, 1, 3] = [a, c, y]  (y is the bonus)
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.kernels import tree_speculative_sampling_target_only, verify_tree_greedy
from specdec.models.ops.topk import argmax


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    # [bs, S + 1] global node index of each accepted node, root first; -1 past the accepted path
    accept_index: torch.Tensor
    # [bs] accepted draft tokens per request (k)
    accept_length: torch.Tensor
    # [bs * N] token the target emits after each node (set on the accepted path)
    predicts: torch.Tensor


def verify_greedy(
    candidates: torch.Tensor,  # [bs, N] tree tokens, root first
    logits: torch.Tensor,  # [bs * N, vocab] target logits at each node
    retrive_index: torch.Tensor,  # [bs, N]
    retrive_next_token: torch.Tensor,  # [bs, N]
    retrive_next_sibling: torch.Tensor,  # [bs, N]
    *,
    num_steps: int,
    target_predict: torch.Tensor | None = None,  # [bs * N] the argmax of logits, where computed already
) -> VerifyResult:
    bs, n = candidates.shape
    sizes = [bs * n, bs * (num_steps + 1), bs]  # predicts, accept_index, accept_length
    # NOTE: the three outputs in one buffer take one fill and one widening (launches cost host time
    # between the graphs); untouched entries read -1, and the op writes every accept_length. Each starts
    # on 16 bytes, as Triton specializes a kernel on its pointers' alignment (a new batch size would
    # otherwise compile another variant)
    padded = [-(-size // 4) * 4 for size in sizes]
    out = torch.full((sum(padded),), -1, dtype=torch.int32, device=candidates.device)
    predicts, accept_index, accept_length = _unpad(out, padded, sizes)
    target_predict = (argmax(logits) if target_predict is None else target_predict).view(bs, n)
    verify_tree_greedy(
        predicts, accept_index.view(bs, num_steps + 1), accept_length, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, target_predict,
    )
    predicts, accept_index, accept_length = _unpad(out.long(), padded, sizes)
    return VerifyResult(accept_index.view(bs, num_steps + 1), accept_length, predicts)


def _unpad(buffer: torch.Tensor, padded: list[int], sizes: list[int]) -> list[torch.Tensor]:
    """Views of ``buffer``'s consecutive parts of ``padded`` entries, each cut to its ``sizes`` entry."""
    return [part[:size] for part, size in zip(buffer.split(padded), sizes)]


def verify_sampling(
    candidates: torch.Tensor,  # [bs, N]
    target_probs: torch.Tensor,  # [bs * N, vocab] fp32 after temperature / top-k / top-p
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    *,
    num_steps: int,
    threshold_single: float,
    threshold_acc: float,
    generator: torch.Generator | None = None,
    coins: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> VerifyResult:
    """Lossless (at thresholds 1.0) tree sampling that treats draft tokens as proposals only.

    ``coins``: the uniforms in (0, 1] ([bs, N] per node, [bs] final), when the host draws them
    (per-request seeds); otherwise drawn here from ``generator``."""
    bs, n = candidates.shape
    device = candidates.device
    vocab = target_probs.shape[-1]
    predicts = torch.full((bs * n,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, num_steps + 1), -1, dtype=torch.int32, device=device)
    accept_length = torch.zeros(bs, dtype=torch.int32, device=device)
    # NOTE: uniforms in (0, 1]: a zero coin would accept a draft token of probability zero.
    if coins is None:
        coins = (1.0 - torch.rand(bs, n, generator=generator, device=device),
                 1.0 - torch.rand(bs, generator=generator, device=device))
    coins, final_coins = coins
    draft_probs = torch.zeros(bs, n, vocab, dtype=torch.float32, device=device)
    tree_speculative_sampling_target_only(
        predicts, accept_index, accept_length, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, coins, final_coins,
        target_probs.view(bs, n, vocab).contiguous(), draft_probs,
        threshold_single=threshold_single, threshold_acc=threshold_acc, deterministic=True,
    )
    return VerifyResult(accept_index.long(), accept_length.long(), predicts.long())


def simulate_acceptance(
    candidates: torch.Tensor,  # [bs, N]
    logits: torch.Tensor,  # [bs * N, vocab]
    retrive_next_token: torch.Tensor,  # [bs, N] first child of each node, -1 for leaves
    *,
    num_steps: int,
    mean_committed: float,
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Benchmark only: accept k draft tokens along each request's first path, k drawn on the device.

    k + 1 = 1 + Binomial(S, (TAU - 1) / S), so the committed tokens per step average TAU (less
    where the first path is shorter than k). The accepted nodes commit their draft tokens; the
    last one is followed by the target's argmax, as a real bonus token would be. No host sync.
    """
    bs, n = candidates.shape
    device = candidates.device
    p = (mean_committed - 1.0) / num_steps
    draws = torch.rand(bs, num_steps, generator=generator, device=device) < p
    k = draws.sum(1)  # [bs]
    path = torch.zeros(bs, num_steps + 1, dtype=torch.int64, device=device)  # [bs, S+1] node per depth
    depth = torch.zeros(bs, dtype=torch.int64, device=device)  # deepest node on the first path
    for i in range(num_steps):
        child = retrive_next_token.gather(1, path[:, i : i + 1]).squeeze(1)
        path[:, i + 1] = child.clamp(min=0)
        depth = torch.where((child >= 0) & (depth == i), depth + 1, depth)
    k = torch.minimum(k, depth)
    steps = torch.arange(num_steps + 1, device=device)
    base = (torch.arange(bs, device=device) * n)[:, None]
    accept_index = torch.where(steps[None] <= k[:, None], base + path, -1)  # [bs, S+1]
    predicts = logits.argmax(dim=-1)  # [bs * N]
    # node i of the path emits the next path node's draft token; node k emits the argmax
    emitted = candidates.gather(1, path[:, 1:].contiguous())  # [bs, S]
    for i in range(num_steps):  # NOTE: nodes past the path are clamped to the root; i < k skips them
        node = base[:, 0] + path[:, i]  # [bs], distinct across requests
        predicts[node] = torch.where(i < k, emitted[:, i], predicts[node])
    return VerifyResult(accept_index, k, predicts)
