"""The draft's selections in one launch each (ours, not sgl_kernel ops).

``select_frontier``: one draft step's next frontier (the torch reference is SGLang's
``select_top_k_tokens`` for steps after the first). Each of a request's K frontier branches
proposed K children (the draft's top-k); a child's score is its branch's score times its
probability. The K best of the K*K children become the next frontier: their scores, score indices
(the tree's parents), branches, tokens, and the features of their parents' rows, which the next
draft forward reads. In torch that is about a dozen small kernels a draft step (multiply, top-k,
divide, gathers, index arithmetic); here one.

``select_draft_nodes``: after the last draft step, the N-1 best of all the expansion's proposals
become the tree (the core of SGLang's ``organize_draft_results``): two sorts, a gather and their
copies in torch (about 45 us of a bs-1 step on an H100 at N = 64), one launch here.
"""

from __future__ import annotations

import torch

from specdec.kernels.common import check_tensor, matches
from specdec.kernels.dispatch import select_impl

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _check(scores, topk_p, topk_index, hidden, expand_scores, best_scores, parents, parent_branch, input_ids,
           hidden_out) -> torch.device:
    """Shapes from scores [bs, K]; topk_p / scores may be strided (a broadcast model row)."""
    if isinstance(scores, torch.Tensor) and scores.dim() == 2:
        (bs, k), device = scores.shape, scores.device
        if (scores.dtype == torch.float32 and isinstance(topk_p, torch.Tensor) and topk_p.dtype == torch.float32
                and topk_p.shape == (bs * k, k) and topk_p.device == device
                and matches(topk_index, torch.int64, (bs * k, k), device)
                and isinstance(hidden, torch.Tensor) and hidden.dim() == 2 and hidden.shape[0] == bs * k
                and matches(hidden, hidden.dtype, None, device) and hidden.dtype in _FLOATS
                and matches(expand_scores, torch.float32, (bs, k, k), device)
                and matches(best_scores, torch.float32, (bs, k), device)
                and matches(parents, torch.int64, (bs, k), device)
                and matches(parent_branch, torch.int64, (bs, k), device)
                and matches(input_ids, torch.int64, (bs * k,), device)
                and matches(hidden_out, hidden.dtype, tuple(hidden.shape), device)):
            return device
    if not (isinstance(scores, torch.Tensor) and scores.dim() == 2 and scores.dtype == torch.float32):
        raise ValueError(f"scores: expected a [bs, K] float32 tensor, got "
                         f"{getattr(scores, 'dtype', type(scores).__name__)} {tuple(getattr(scores, 'shape', ()))}")
    (bs, k), device = scores.shape, scores.device
    if not (isinstance(topk_p, torch.Tensor) and topk_p.dtype == torch.float32 and topk_p.shape == (bs * k, k)
            and topk_p.device == device):
        raise ValueError(f"topk_p: expected a [{bs * k}, {k}] float32 tensor on {device}, got "
                         f"{getattr(topk_p, 'dtype', type(topk_p).__name__)} {tuple(getattr(topk_p, 'shape', ()))}")
    check_tensor("topk_index", topk_index, dtype=torch.int64, shape=(bs * k, k), device=device)
    check_tensor("hidden", hidden, dtype=_FLOATS, dim=2, device=device)
    if hidden.shape[0] != bs * k:
        raise ValueError(f"hidden: expected {bs * k} rows (one per branch), got {hidden.shape[0]}")
    check_tensor("expand_scores", expand_scores, dtype=torch.float32, shape=(bs, k, k), device=device)
    check_tensor("best_scores", best_scores, dtype=torch.float32, shape=(bs, k), device=device)
    check_tensor("parents", parents, dtype=torch.int64, shape=(bs, k), device=device)
    check_tensor("parent_branch", parent_branch, dtype=torch.int64, shape=(bs, k), device=device)
    check_tensor("input_ids", input_ids, dtype=torch.int64, shape=(bs * k,), device=device)
    check_tensor("hidden_out", hidden_out, dtype=hidden.dtype, shape=tuple(hidden.shape), device=device)
    return device


def select_frontier(
    scores: torch.Tensor,  # [bs, K] fp32 cumulative score of each frontier branch (may be strided)
    topk_p: torch.Tensor,  # [bs*K, K] fp32 each branch's top-k draft probabilities (may be strided)
    topk_index: torch.Tensor,  # [bs*K, K] int64 their tokens
    hidden: torch.Tensor,  # [bs*K, H] each branch's draft features
    expand_scores: torch.Tensor,  # [bs, K, K] fp32, written: every child's score
    best_scores: torch.Tensor,  # [bs, K] fp32, written: the new frontier's scores, best first
    parents: torch.Tensor,  # [bs, K] int64, written: their score indices
    parent_branch: torch.Tensor,  # [bs, K] int64, written: the branch each extends
    input_ids: torch.Tensor,  # [bs*K] int64, written: their tokens
    hidden_out: torch.Tensor,  # [bs*K, H], written: hidden[their branch's row]
    *,
    parent_offset: int,  # score index of this step's first child: K + K*K*(step-1)
) -> None:
    """The next frontier of every request (see the ref)."""
    device = _check(scores, topk_p, topk_index, hidden, expand_scores, best_scores, parents, parent_branch,
                    input_ids, hidden_out)
    impl = select_impl("select_frontier", select_frontier_ref, device)
    impl(scores, topk_p, topk_index, hidden, expand_scores, best_scores, parents, parent_branch, input_ids,
         hidden_out, parent_offset=int(parent_offset))


def select_frontier_ref(
    scores: torch.Tensor,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden: torch.Tensor,
    expand_scores: torch.Tensor,
    best_scores: torch.Tensor,
    parents: torch.Tensor,
    parent_branch: torch.Tensor,
    input_ids: torch.Tensor,
    hidden_out: torch.Tensor,
    *,
    parent_offset: int,
) -> None:
    """Specification of ``select_frontier``.

    expand = scores[:, :, None] * topk_p.view(bs, K, K); the K largest of each request's flattened
    expand, largest first and equal scores in index order, are the new frontier: flat index
    j = r*K + c is child c of branch r.
    Example, K = 2, scores [.6 .3], topk_p [[.5 .2], [.9 .1]], tokens [[10 11], [12 13]]::

        expand [[.30 .12], [.27 .03]] -> best [.30 .27] at j = [0, 2]
        parent_branch [0, 1]   parents [0, 2] + parent_offset   input_ids [10, 12]
        hidden_out = hidden[[0, 1]]
    """
    bs, k = scores.shape
    expand = scores[:, :, None] * topk_p.reshape(bs, k, k)  # [bs, K, K]
    order = torch.sort(expand.flatten(1), dim=1, descending=True, stable=True)
    best = order.indices[:, :k]  # [bs, K] flat child index j = r*K + c
    expand_scores.copy_(expand)
    best_scores.copy_(order.values[:, :k])
    parents.copy_(best + parent_offset)
    parent_branch.copy_(best // k)
    input_ids.copy_(topk_index.reshape(bs, k * k).gather(1, best).flatten())
    rows = (parent_branch + torch.arange(bs, device=scores.device)[:, None] * k).flatten()  # [bs*K]
    hidden_out.copy_(hidden[rows])


def select_draft_nodes(
    scores: torch.Tensor,  # [bs, M] fp32 every proposal's score, M = K + (S-1)K^2 score indices
    tokens: torch.Tensor,  # [bs, M] int64 their tokens
    top_scores_index: torch.Tensor,  # [bs, N-1] int64, written: the kept score indices, ascending
    draft_tokens: torch.Tensor,  # [bs, N-1] int64, written: their tokens
) -> None:
    """The N-1 best proposals of every request (see the ref)."""
    device = _check_nodes(scores, tokens, top_scores_index, draft_tokens)
    impl = select_impl("select_draft_nodes", select_draft_nodes_ref, device)
    impl(scores, tokens, top_scores_index, draft_tokens)


def _check_nodes(scores, tokens, top_scores_index, draft_tokens) -> torch.device:
    if isinstance(scores, torch.Tensor) and scores.dim() == 2 and isinstance(top_scores_index, torch.Tensor):
        (bs, m), device = scores.shape, scores.device
        kept = (bs, top_scores_index.shape[-1])
        if (matches(scores, torch.float32, (bs, m), device) and matches(tokens, torch.int64, (bs, m), device)
                and matches(top_scores_index, torch.int64, kept, device)
                and matches(draft_tokens, torch.int64, kept, device) and kept[1] <= m):
            return device
    check_tensor("scores", scores, dtype=torch.float32, dim=2)
    (bs, m), device = scores.shape, scores.device
    check_tensor("tokens", tokens, dtype=torch.int64, shape=(bs, m), device=device)
    check_tensor("top_scores_index", top_scores_index, dtype=torch.int64, dim=2, device=device)
    if top_scores_index.shape[0] != bs or top_scores_index.shape[1] > m:
        raise ValueError(f"top_scores_index: expected [{bs}, at most {m}], got {tuple(top_scores_index.shape)}")
    check_tensor("draft_tokens", draft_tokens, dtype=torch.int64, shape=tuple(top_scores_index.shape), device=device)
    return device


def select_draft_nodes_ref(
    scores: torch.Tensor,
    tokens: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
) -> None:
    """Specification of ``select_draft_nodes``.

    The N-1 largest scores of each row, largest first and equal scores in index order (a stable
    descending sort, NaN first as torch sorts it), then their indices ascending and their tokens.
    A child's score is its parent's times p <= 1 and its index is larger, so on ties (confident
    drafts underflow to exactly 0 or saturate at 1) the parent still ranks first and the kept set
    contains every kept node's parent.
    Example, N - 1 = 3: scores [.6 .35 .30 .12 .315 .035], tokens [a b c d e f]
    -> top_scores_index [0, 1, 4], draft_tokens [a, b, e].
    """
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    kept = torch.sort(order[:, : top_scores_index.shape[1]]).values  # [bs, N-1]
    top_scores_index.copy_(kept)
    draft_tokens.copy_(torch.gather(tokens, 1, kept))
