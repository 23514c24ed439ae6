"""``select_frontier``: one draft step's next frontier in one launch (ours, not an sgl_kernel op;
the torch reference is SGLang's ``select_top_k_tokens`` for steps after the first).

Each of a request's K frontier branches proposed K children (the draft's top-k); a child's score is
its branch's score times its probability. The K best of the K*K children become the next
frontier: their scores, score indices (the tree's parents), branches, tokens, and the features of
their parents' rows, which the next draft forward reads. In torch that is about a dozen small
kernels a draft step (multiply, top-k, divide, gathers, index arithmetic); here one.
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
