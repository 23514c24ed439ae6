"""Benchmark only: an acceptance drawn from a model by depth, parent rank and rank, along the real draft tree.

For full-size targets with random weights (``specdec bench --synthetic``) the target would accept
nothing, so verification runs in full and then the accepted path is drawn instead: every node p
draws which of its children the target "agrees" with — rank r with probability
q[depth(p), rank(p), r] from the hazards of ``specdec.eagle.acceptance`` (rank(p): p's own place
among its siblings, the root's 0), or none — and greedy verification walks the tree with that
child's token as the target's prediction at p. A drawn rank whose child the tree did not keep
rejects (as a real target would: the token it wanted was pruned). Where no child is drawn, the
target's argmax at p is the bonus token. No host sync: the argmax, one draw kernel
(``specdec.kernels.simulate_target_predict``) and the greedy walk.

Common random numbers: a node's draw is a hash of (seed, batch row, absolute position), not a
fresh random number. Every node at one depth of a tree shares it (only one of them lies on the
accepted path), and two policies run over the same requests see the same draw at the same token
position: a chain and a tree, or a deep chain and a shallow one, face the same "text". Comparing
them then measures the shapes, not two samples' luck (at 12 timed steps a point, independent draws
moved a point's mean committed length by 25 %).
"""

from __future__ import annotations

import numpy as np
import torch

from specdec.config import SpecConfig
from specdec.eagle.acceptance import AcceptanceModel
from specdec.eagle.verify import VerifyResult
from specdec.kernels import simulate_target_predict, verify_tree_greedy
from specdec.models.ops.topk import argmax


def child_cdf(hazards, device) -> torch.Tensor:
    """[S + 1, P, K] cumulative P(accepted child rank <= r) per parent depth and parent rank, from a
    [S, P, K] (or [S, K]: P = 1) hazard table; the last depth (leaves) 0."""
    cdf = torch.from_numpy(AcceptanceModel(np.asarray(hazards)).child_probs().cumsum(-1))  # [S, P, K]
    return torch.cat([cdf, torch.zeros_like(cdf[:1])]).to(device=device, dtype=torch.float32)


def simulate_tree_acceptance(
    candidates: torch.Tensor,  # [bs, N] tree tokens, root first
    logits: torch.Tensor,  # [bs * N, vocab]
    positions: torch.Tensor,  # [bs * N] seq_len + depth of each node
    seq_lens: torch.Tensor,  # [bs]
    retrive_index: torch.Tensor,  # [bs, N]
    retrive_next_token: torch.Tensor,  # [bs, N]
    retrive_next_sibling: torch.Tensor,  # [bs, N]
    cdf: torch.Tensor,  # [S + 1, P, K] from child_cdf, or [bs, S + 1, P, K] (DraftReplay.accept_cdf)
    *,
    num_steps: int,
    seed: int = 0,
) -> VerifyResult:
    bs, n = candidates.shape
    device = candidates.device
    target_predict = torch.empty_like(candidates)
    simulate_target_predict(candidates, argmax(logits).view(bs, n), positions.view(bs, n), seq_lens,
                            retrive_next_token, retrive_next_sibling, cdf, target_predict, seed=seed)
    predicts = torch.full((bs * n,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, num_steps + 1), -1, dtype=torch.int32, device=device)
    accept_length = torch.zeros(bs, dtype=torch.int32, device=device)
    verify_tree_greedy(predicts, accept_index, accept_length, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict)
    return VerifyResult(accept_index.long(), accept_length.long(), predicts.long())


def rank_probs(config: SpecConfig, device: torch.device) -> torch.Tensor | None:
    """[S, P, K] P(the accepted child at depth d has rank r | its parent, of rank p, reached) of the
    simulated acceptance model (benchmark only)."""
    if config.simulate_hazards is None:
        return None
    probs = torch.from_numpy(AcceptanceModel(np.asarray(config.simulate_hazards)).child_probs())  # [D, P, K]
    parents = min(config.topk, probs.shape[1])
    out = torch.zeros(config.num_steps, parents, config.topk, device=device)  # past the model: never accepted
    rows, cols = min(config.num_steps, probs.shape[0]), min(config.topk, probs.shape[2])
    out[:rows, :, :cols] = probs[:rows, :parents, :cols].to(device=device, dtype=out.dtype)
    return out
