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
) -> VerifyResult:
    bs, n = candidates.shape
    device = candidates.device
    predicts = torch.full((bs * n,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, num_steps + 1), -1, dtype=torch.int32, device=device)
    accept_length = torch.zeros(bs, dtype=torch.int32, device=device)
    target_predict = logits.argmax(dim=-1).view(bs, n)
    verify_tree_greedy(
        predicts, accept_index, accept_length, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, target_predict,
    )
    return VerifyResult(accept_index.long(), accept_length.long(), predicts.long())


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
) -> VerifyResult:
    """Lossless (at thresholds 1.0) tree sampling that treats draft tokens as proposals only."""
    bs, n = candidates.shape
    device = candidates.device
    vocab = target_probs.shape[-1]
    predicts = torch.full((bs * n,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, num_steps + 1), -1, dtype=torch.int32, device=device)
    accept_length = torch.zeros(bs, dtype=torch.int32, device=device)
    # NOTE: uniforms in (0, 1]: a zero coin would accept a draft token of probability zero.
    coins = 1.0 - torch.rand(bs, n, generator=generator, device=device)
    final_coins = 1.0 - torch.rand(bs, generator=generator, device=device)
    draft_probs = torch.zeros(bs, n, vocab, dtype=torch.float32, device=device)
    tree_speculative_sampling_target_only(
        predicts, accept_index, accept_length, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, coins, final_coins,
        target_probs.view(bs, n, vocab).contiguous(), draft_probs,
        threshold_single=threshold_single, threshold_acc=threshold_acc, deterministic=True,
    )
    return VerifyResult(accept_index.long(), accept_length.long(), predicts.long())


@dataclasses.dataclass(frozen=True)
class Commit:
    # [sum(k + 1)] committed tokens, request by request
    tokens: torch.Tensor
    # [sum(k + 1)] global node index each committed token's *input* position came from
    # (the root and the accepted nodes: their target features feed the draft extend)
    source_nodes: torch.Tensor
    # host copy of k + 1 per request
    num_committed: list[int]


def committed_tokens(result: VerifyResult) -> Commit:
    """Flatten each request's accepted path into its committed tokens."""
    lengths = (result.accept_length + 1).tolist()
    valid = result.accept_index >= 0  # [bs, S+1], True on the accepted path (root included)
    nodes = result.accept_index[valid]  # row-major: request by request, root first
    return Commit(tokens=result.predicts[nodes], source_nodes=nodes, num_committed=lengths)
