"""The target's half of a speculative decode step: verify forward, accepted path, KV commit.

    target_verify        one TARGET_VERIFY forward over each request's N tree nodes
    TreeVerifier         each request's accepted path: greedy or lossless sampling, or (benchmark
                         only) drawn from an acceptance model or a replayed trace
    commit_accepted_kv   the accepted nodes' target K/V moved to consecutive positions

``EAGLEWorker.launch_decode`` runs them in this order between the draft tree and the draft extend.
"""

from __future__ import annotations

import torch

from specdec.config import SpecConfig
from specdec.eagle.replay import DraftReplay
from specdec.eagle.simulate import child_cdf, simulate_tree_acceptance
from specdec.eagle.tree import BuiltTree
from specdec.eagle.verify import (
    VerifyResult,
    simulate_acceptance,
    verify_greedy,
    verify_sampling,
)
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode, LogitsOutput
from specdec.host import SamplingInfo, TargetKVCache, TargetModelRunner, shared_full
from specdec.kernels import compact_accepted_kv_locs


def target_verify(
    target: TargetModelRunner,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs]
    seq_lens_cpu: list[int] | None,
    tree: BuiltTree,
    tree_slots: torch.Tensor,  # [bs * N]
    *,
    num_draft_tokens: int,
    slot_tokens: torch.Tensor | None = None,
) -> LogitsOutput:
    """The target's logits [bs * N, vocab] and features [bs * N, F] at every tree node (and their argmax
    where a graph took it); ``slot_tokens``: as ``ForwardBatch.slot_tokens`` (the nodes' tokens recorded at
    their slots)."""
    bs, n = int(req_pool_indices.shape[0]), num_draft_tokens
    batch = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY,
        input_ids=tree.draft_tokens,
        positions=tree.positions,
        out_cache_loc=tree_slots,
        req_pool_indices=req_pool_indices,
        prefix_lens=seq_lens,
        extend_lens=shared_full(bs, n, torch.int64, seq_lens.device),
        req_to_token=req_to_token,
        kv_cache=target.kv_cache,
        attn_backend=target.attn_backend,
        logits_mode=LogitsMode.ALL,
        logits_dtype=None,  # the verify's [bs * N, vocab] unwidened: argmax reads them as they are
        capture_hidden_mode=CaptureHiddenMode.FULL,
        tree_mask=tree.tree_mask,
        prefix_lens_cpu=seq_lens_cpu,
        extend_lens_cpu=[n] * bs,
        slot_tokens=slot_tokens,
    )
    return target.forward(batch)


class TreeVerifier:
    """Each request's accepted path through its tree, under one worker's shape."""

    def __init__(self, config: SpecConfig, *, generator: torch.Generator | None,
                 replay: DraftReplay | None, simulate_seed: int) -> None:
        self.config = config
        self.generator = generator
        self.replay = replay  # benchmark only: the recorded paths a simulated step follows
        self.simulate_seed = simulate_seed
        self._simulate_cdf: torch.Tensor | None = None  # [S + 1, P, K] benchmark only

    def __call__(self, tree: BuiltTree, logits: torch.Tensor, sampling: SamplingInfo,
                 seq_lens: torch.Tensor, replay_keys: torch.Tensor | None = None,
                 predicts: torch.Tensor | None = None) -> VerifyResult:
        """``replay_keys`` [bs]: benchmark only, with a replayed trace: each request's key of the row it
        replays (its verify steps so far, as the draft's). ``predicts`` [bs * N]: the argmax of ``logits``
        where the verify graph took it (``specdec.eagle.output.greedy_ids``)."""
        cfg = self.config
        n = cfg.num_draft_tokens
        candidates = tree.draft_tokens.view(-1, n)
        bs = candidates.shape[0]
        if cfg.simulate_accept_length is not None:
            return simulate_acceptance(candidates, logits, tree.retrive_next_token, num_steps=cfg.num_steps,
                                       mean_committed=cfg.simulate_accept_length, generator=self.generator)
        cdf = self._simulated_cdf(replay_keys, logits.device)
        if cdf is not None:
            return simulate_tree_acceptance(
                candidates, logits, tree.positions, seq_lens, tree.retrive_index, tree.retrive_next_token,
                tree.retrive_next_sibling, cdf, num_steps=cfg.num_steps, seed=self.simulate_seed)
        retrive = (tree.retrive_index, tree.retrive_next_token, tree.retrive_next_sibling)
        if sampling.is_all_greedy:
            return verify_greedy(candidates, logits, *retrive, num_steps=cfg.num_steps, target_predict=predicts)
        row_to_request = torch.arange(bs, device=logits.device).repeat_interleave(n)
        uniforms = getattr(sampling, "uniforms", None)  # a host's per-request (seeded) draws
        return verify_sampling(
            candidates, sampling.probs(logits.float(), row_to_request), *retrive,
            num_steps=cfg.num_steps, threshold_single=cfg.accept_threshold_single,
            threshold_acc=cfg.accept_threshold_acc, generator=self.generator,
            coins=uniforms(bs, n, logits.device) if uniforms is not None else None,
        )

    def _simulated_cdf(self, replay_keys: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
        """Benchmark only: the simulated verify's cdf of the child rank each node accepts, each
        request's replayed path [bs, S + 1, 1, K] or the hazards model's [S + 1, P, K]; None when the
        target's own predictions decide."""
        cfg = self.config
        if self.replay is not None:
            return self.replay.accept_cdf(self.replay.rows(replay_keys, self.simulate_seed), cfg.num_steps, cfg.topk)
        if cfg.simulate_hazards is not None and self._simulate_cdf is None:
            cdf = child_cdf(cfg.simulate_hazards, device)  # [S + 1, P, K] of the model
            self._simulate_cdf = cdf[:, : cfg.topk, : cfg.topk].contiguous()
        return self._simulate_cdf


def commit_accepted_kv(
    req_to_token: torch.Tensor,
    kv_cache: TargetKVCache,
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs]
    result: VerifyResult,
    *,
    num_draft_tokens: int,
    topk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Move accepted nodes' target K/V to consecutive positions.

    Tree node t of request b was written at position seq_len + t; its i-th accepted node
    (root = 0th) belongs at seq_len + i. Since t >= i and moves read before they write,
    compaction never clobbers a node still to be moved. Returns each committed position's
    slot and which of the [bs, S+1] entries are committed (the rest is padding).
    """
    shape = result.accept_index.shape  # [bs, S+1]
    device = seq_lens.device
    src, dst, positions = (torch.empty(shape, dtype=torch.int64, device=device) for _ in range(3))
    compact_accepted_kv_locs(
        req_to_token, req_pool_indices, seq_lens, result.accept_index, result.accept_length,
        src, dst, positions, num_draft_tokens=num_draft_tokens,
    )
    # NOTE: a chain's node t sits at position seq_len + t, so its accepted nodes are in place
    if topk > 1:
        kv_cache.move(src, dst)  # [bs, S+1]: one group per request; padding is src == dst
    return dst, positions >= 0
