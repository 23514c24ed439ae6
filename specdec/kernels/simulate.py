"""The synthetic benchmark's drawn target predictions (not an sgl_kernel op; see
``specdec.eagle.simulate`` for the acceptance model they follow).

``simulate_target_predict`` writes, for every tree node, the token a simulated target predicts after
it: the token of the child its (seeded) draw picks, or its argmax where it draws none. Greedy
verification then walks the tree as if the target had produced those predictions. One launch on
CUDA (the reference is about 4 + 6 * K small torch kernels, K = the draw's ranks).
"""

from __future__ import annotations

import torch

from specdec.kernels.common import check_tensor, matches
from specdec.kernels.dispatch import select_impl
from specdec.kernels.position_hash import position_uniforms

def _check_inputs(candidates, argmax, positions, seq_lens, retrive_next_token, retrive_next_sibling, cdf,
                  target_predict) -> torch.device:
    """[bs, N] int64 node tensors, [bs] int64 seq_lens, a contiguous [>= 1, >= 1, K] fp32 cdf, on one
    device (fast path first, like the other ops); returns the device."""
    nodes = {"candidates": candidates, "argmax": argmax, "positions": positions,
             "retrive_next_token": retrive_next_token, "retrive_next_sibling": retrive_next_sibling,
             "target_predict": target_predict}
    if isinstance(candidates, torch.Tensor) and candidates.dim() == 2:
        device, shape = candidates.device, tuple(candidates.shape)
        if (all(matches(t, torch.int64, shape, device) for t in nodes.values())
                and matches(seq_lens, torch.int64, shape[:1], device)
                and matches(cdf, torch.float32, None, device) and _cdf_ok(cdf, shape[0])):
            return device
    check_tensor("candidates", candidates, dtype=torch.int64, dim=2)
    device, shape = candidates.device, tuple(candidates.shape)
    for name, t in nodes.items():
        check_tensor(name, t, dtype=torch.int64, shape=shape, device=device)
    check_tensor("seq_lens", seq_lens, dtype=torch.int64, shape=shape[:1], device=device)
    check_tensor("cdf", cdf, dtype=torch.float32, device=device)
    if not _cdf_ok(cdf, shape[0]):
        raise ValueError(f"cdf: expected a contiguous [depths >= 1, parent ranks >= 1, K] or [bs = {shape[0]}, "
                         f"depths, parent ranks, K], got {tuple(cdf.shape)}")
    return device


def _cdf_ok(cdf: torch.Tensor, bs: int) -> bool:
    """One cdf for the batch [S + 1, P, K], or one per request [bs, S + 1, P, K]; contiguous."""
    if cdf.dim() == 4 and cdf.shape[0] != bs:
        return False
    return cdf.dim() in (3, 4) and cdf.shape[-3] >= 1 and cdf.shape[-2] >= 1 and cdf.is_contiguous()


def simulate_target_predict(
    candidates: torch.Tensor,  # [bs, N] int64 tree tokens, root first
    argmax: torch.Tensor,  # [bs, N] int64 the target's argmax after each node
    positions: torch.Tensor,  # [bs, N] int64 seq_len + depth of each node
    seq_lens: torch.Tensor,  # [bs] int64
    retrive_next_token: torch.Tensor,  # [bs, N] int64 first child, -1 none
    retrive_next_sibling: torch.Tensor,  # [bs, N] int64 next sibling, -1 none
    cdf: torch.Tensor,  # [S + 1, P, K] or [bs, S + 1, P, K] fp32 P(drawn child rank <= r) per parent depth
    #                     and parent rank (per request: a replayed trace, specdec.eagle.replay)
    target_predict: torch.Tensor,  # [bs, N] int64, written
    *,
    seed: int,
) -> None:
    """Each node's simulated target prediction (see the ref)."""
    device = _check_inputs(candidates, argmax, positions, seq_lens, retrive_next_token, retrive_next_sibling, cdf,
                           target_predict)
    impl = select_impl("simulate_target_predict", simulate_target_predict_ref, device)
    impl(candidates, argmax, positions, seq_lens, retrive_next_token, retrive_next_sibling, cdf, target_predict,
         seed=int(seed))


def simulate_target_predict_ref(
    candidates: torch.Tensor,
    argmax: torch.Tensor,
    positions: torch.Tensor,
    seq_lens: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    cdf: torch.Tensor,
    target_predict: torch.Tensor,
    *,
    seed: int,
) -> None:
    """Specification of ``simulate_target_predict``.

    Node t of request b at depth d = clamp(positions - seq_len, 0, S), of rank p among its siblings
    (its place in its parent's link order, first child 0; the root 0; p clamped to P - 1), draws
    u = ``position_uniforms(positions, seed)[b, t]`` and the child rank r = #{j : cdf[d, p, j] <= u}
    (r = K: no child). Its r-th child in link order (first child, then siblings), if the tree kept
    one, is the drawn child and ``target_predict`` is its token; otherwise the node's argmax.
    Example, K = 2, cdf[d, p] = [.5, .8], a node whose children are [c0] only: u = .3 -> c0's token;
    u = .6 -> rank 1, not kept -> argmax; u = .9 -> argmax. A [bs, S + 1, P, K] cdf gives each
    request its own (request b reads cdf[b, d, p]); a 0/1 row draws the same rank whatever u.
    """
    bs, n = candidates.shape
    if cdf.dim() == 3:
        cdf = cdf.expand(bs, *cdf.shape)  # [bs, S + 1, P, K]
    parent_ranks, k = cdf.shape[2:]
    own_rank = torch.zeros(bs, n + 1, dtype=torch.int64, device=candidates.device)  # column n: no node
    child = retrive_next_token  # [bs, N] each node's r-th child in round r
    for r in range(k):
        own_rank.scatter_(1, torch.where(child >= 0, child, n), r)
        child = torch.where(child >= 0, retrive_next_sibling.gather(1, child.clamp(min=0)), -1)
    depth = (positions - seq_lens[:, None]).clamp(0, cdf.shape[1] - 1)  # [bs, N]
    u = position_uniforms(positions, seed)[..., None]  # [bs, N, 1]
    b = torch.arange(bs, device=candidates.device)[:, None]
    rank = (cdf[b, depth, own_rank[:, :n].clamp(max=parent_ranks - 1)] <= u).sum(-1)  # [bs, N] drawn; K = none
    child = retrive_next_token.clone()  # [bs, N] walk each node's children to its drawn rank
    for r in range(k - 1):
        sibling = retrive_next_sibling.gather(1, child.clamp(min=0))
        child = torch.where((rank > r) & (child >= 0), sibling, child)
    drawn = (child >= 0) & (rank < k)
    target_predict.copy_(torch.where(drawn, candidates.gather(1, child.clamp(min=0)), argmax))
