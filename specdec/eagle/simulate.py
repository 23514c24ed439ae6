"""Benchmark only: an acceptance drawn from a per-depth, per-rank model, along the real draft tree.

For full-size targets with random weights (``specdec bench --synthetic``) the target would accept
nothing, so verification runs in full and then the accepted path is drawn instead: every node p
draws which of its children the target "agrees" with — rank r with probability q[depth(p), r] from
the hazards of ``specdec.eagle.acceptance``, or none — and greedy verification walks the tree with
that child's token as the target's prediction at p. A drawn rank whose child the tree did not keep
rejects (as a real target would: the token it wanted was pruned). Where no child is drawn, the
target's argmax at p is the bonus token. No host sync; K + a few device ops.

Common random numbers: a node's draw is a hash of (seed, batch row, absolute position), not a
fresh random number. Every node at one depth of a tree shares it (only one of them lies on the
accepted path), and two policies run over the same requests see the same draw at the same token
position: a chain and a tree, or a deep chain and a shallow one, face the same "text". Comparing
them then measures the shapes, not two samples' luck (at 12 timed steps a point, independent draws
moved a point's mean committed length by 25 %).
"""

from __future__ import annotations

import torch

from specdec.eagle.verify import VerifyResult
from specdec.kernels import verify_tree_greedy


def child_cdf(hazards: tuple[tuple[float, ...], ...], device) -> torch.Tensor:
    """[S + 1, K] cumulative P(accepted child rank <= r) per parent depth; the last row (leaves) 0."""
    h = torch.tensor(hazards, dtype=torch.float64)
    survive = torch.cumprod(torch.cat([torch.ones(h.shape[0], 1, dtype=h.dtype), 1 - h[:, :-1]], 1), 1)
    cdf = (h * survive).cumsum(1)
    return torch.cat([cdf, torch.zeros(1, h.shape[1], dtype=h.dtype)]).to(device=device, dtype=torch.float32)


def position_uniforms(positions: torch.Tensor, seed: int) -> torch.Tensor:  # [bs, N] int64 -> [bs, N] fp32
    """A uniform in [0, 1) per (seed, batch row, absolute position): a fixed integer hash (two
    multiply-xorshift rounds on 32 bits), so a row's draw at a position never depends on the shape."""
    mask = 0xFFFFFFFF
    rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
    # NOTE: products may wrap past int64; the low 32 bits, all that is kept, are still exact
    x = (positions.long() * 0x9E3779B1 + rows * 0x85EBCA77 + ((seed & mask) * 0xC2B2AE3D & mask)) & mask
    for shift, mult in ((16, 0x7FEB352D), (15, 0x846CA68B)):  # "lowbias32" (C. Wellons' hash prospector)
        x = ((x ^ (x >> shift)) * mult) & mask
    x = x ^ (x >> 16)
    return (x >> 8).float() / float(1 << 24)


def simulate_tree_acceptance(
    candidates: torch.Tensor,  # [bs, N] tree tokens, root first
    logits: torch.Tensor,  # [bs * N, vocab]
    positions: torch.Tensor,  # [bs * N] seq_len + depth of each node
    seq_lens: torch.Tensor,  # [bs]
    retrive_index: torch.Tensor,  # [bs, N]
    retrive_next_token: torch.Tensor,  # [bs, N]
    retrive_next_sibling: torch.Tensor,  # [bs, N]
    cdf: torch.Tensor,  # [S + 1, K] from child_cdf
    *,
    num_steps: int,
    seed: int = 0,
) -> VerifyResult:
    bs, n = candidates.shape
    device = candidates.device
    depth = (positions.view(bs, n) - seq_lens[:, None]).clamp(0, cdf.shape[0] - 1)  # [bs, N]
    u = position_uniforms(positions.view(bs, n), seed)[..., None]  # [bs, N, 1]
    rank = (cdf[depth] <= u).sum(-1)  # [bs, N] drawn child rank of each node; K = none
    child = retrive_next_token.clone()  # [bs, N] walk each node's children to its drawn rank
    for r in range(cdf.shape[1] - 1):
        sibling = retrive_next_sibling.gather(1, child.clamp(min=0))
        child = torch.where((rank > r) & (child >= 0), sibling, child)
    drawn = (child >= 0) & (rank < cdf.shape[1])
    argmax = logits.argmax(dim=-1).view(bs, n)
    target_predict = torch.where(drawn, candidates.gather(1, child.clamp(min=0)), argmax)
    predicts = torch.full((bs * n,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, num_steps + 1), -1, dtype=torch.int32, device=device)
    accept_length = torch.zeros(bs, dtype=torch.int32, device=device)
    verify_tree_greedy(predicts, accept_index, accept_length, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict)
    return VerifyResult(accept_index.long(), accept_length.long(), predicts.long())
