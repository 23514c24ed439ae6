"""EAGLEWorker: turns each decode step of a host engine into draft -> verify -> commit -> extend.

    prefill   target EXTEND (capturing features) -> sample the first token
              -> draft EXTEND over the prompt shifted by one            (draft KV + root expansion)
    decode    draft tree (S steps, top-K) -> build_tree -> target TARGET_VERIFY over N nodes
              -> accept (greedy or lossless sampling) -> move accepted K/V into place, free the rest
              -> draft EXTEND over the committed tokens                 (draft KV + next root)

The host owns requests, the request-to-token table and the slot allocator (``specdec.host``);
the worker owns the draft head, its KV cache (host slots + a scratch area for tree nodes) and
the per-request draft state. The host applies stop conditions to the committed tokens it gets.
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.attention import KVCache, create_attention_backend
from specdec.config import SpecConfig
from specdec.eagle.draft import DraftRunner
from specdec.eagle.heads import resolve_head
from specdec.eagle.state import DraftState
from specdec.eagle.tree import TreeMaskMode, build_tree
from specdec.eagle.verify import VerifyResult, committed_tokens, verify_greedy, verify_sampling
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode
from specdec.host import KVMemory, SamplingInfo, TargetModelRunner
from specdec.kernels import compact_accepted_kv_locs


@dataclasses.dataclass(frozen=True)
class DecodeOutput:
    # committed tokens of each request (accepted drafts + bonus)
    tokens: list[list[int]]
    # [bs] tokens in each request's KV cache after the step
    seq_lens: torch.Tensor
    # accepted draft tokens per request (committed - 1)
    accept_lengths: list[int]


class EAGLEWorker:
    def __init__(
        self,
        config: SpecConfig,
        target: TargetModelRunner,
        memory: KVMemory,
        draft_model: torch.nn.Module,
        *,
        attention_backend: str,
        max_running_requests: int,
        generator: torch.Generator | None = None,
    ) -> None:
        self.config = config
        self.target = target
        self.memory = memory
        self.generator = generator
        self.adapter = resolve_head(
            config, draft_model, hidden_size=target.hidden_size, target_aux_layers=target.aux_hidden_layers
        )
        dcfg = draft_model.config
        weight = next(draft_model.parameters())
        scratch = max_running_requests * max(config.num_steps - 1, 0) * config.topk
        self.draft_kv = KVCache(
            num_layers=dcfg.num_hidden_layers,
            num_slots=memory.capacity + scratch,
            num_kv_heads=dcfg.num_key_value_heads,
            head_dim=dcfg.head_dim,
            dtype=weight.dtype,
            device=weight.device,
        )
        self.draft = DraftRunner(
            draft_model,
            self.adapter,
            num_steps=config.num_steps,
            topk=config.topk,
            num_draft_tokens=config.num_draft_tokens,
            kv_cache=self.draft_kv,
            attn_backend=create_attention_backend(attention_backend),
            req_to_token=memory.req_to_token,
            scratch_base=memory.capacity,
        )
        self.state = DraftState(
            max_reqs=memory.req_to_token.shape[0],
            topk=config.topk,
            hidden_size=dcfg.hidden_size,
            dtype=weight.dtype,
            device=weight.device,
        )
        self.max_batch_size = max_running_requests  # the draft scratch area is sized for this

    # ---------------------------------------------------------------- prefill
    def prefill(self, batch: ForwardBatch, sampling: SamplingInfo) -> torch.Tensor:
        """Target EXTEND + draft EXTEND; returns the first sampled token of each request: [bs]."""
        if batch.capture_hidden_mode != CaptureHiddenMode.FULL:
            raise ValueError("speculative prefill needs capture_hidden_mode=FULL on the EXTEND batch")
        out = self.target.forward(batch)
        next_ids = sampling.sample(out.next_token_logits)
        extend_lens = batch.host_extend_lens()
        # Draft input at position p is (token p + 1, target feature p): shift each request left.
        ends = torch.tensor(extend_lens, device=batch.input_ids.device).cumsum(0) - 1
        shifted = torch.roll(batch.input_ids, -1)
        shifted[ends] = next_ids
        self._draft_extend(
            shifted, out.hidden_states, batch.positions, batch.out_cache_loc,
            batch.req_pool_indices, batch.prefix_lens, extend_lens,
        )
        return next_ids

    # ---------------------------------------------------------------- decode
    def decode(
        self,
        req_pool_indices: torch.Tensor,  # [bs]
        seq_lens: torch.Tensor,  # [bs] tokens in KV; the root (last committed token) is not
        verified_ids: torch.Tensor,  # [bs] last committed token of each request
        sampling: SamplingInfo,
    ) -> DecodeOutput:
        cfg = self.config
        bs, n = int(req_pool_indices.shape[0]), cfg.num_draft_tokens
        if bs > self.max_batch_size:
            raise ValueError(f"decode batch of {bs} requests exceeds max_running_requests={self.max_batch_size}")
        seq_lens_cpu = seq_lens.tolist()
        parent_list, top_index, draft_tokens = self.draft.expand(
            *self.state.load(req_pool_indices),
            req_pool_indices=req_pool_indices, seq_lens=seq_lens, seq_lens_cpu=seq_lens_cpu,
        )
        tree = build_tree(
            verified_ids, parent_list, top_index, draft_tokens, seq_lens, sum(seq_lens_cpu),
            cfg.topk, cfg.num_steps, n, tree_mask_mode=TreeMaskMode.QLEN_ONLY,
        )
        logits, features = self._target_verify(req_pool_indices, seq_lens, seq_lens_cpu, tree)
        candidates = tree.draft_tokens.view(bs, n)
        retrive = (tree.retrive_index, tree.retrive_next_token, tree.retrive_next_sibling)
        if sampling.is_all_greedy:
            result = verify_greedy(candidates, logits, *retrive, num_steps=cfg.num_steps)
        else:
            row_to_request = torch.arange(bs, device=logits.device).repeat_interleave(n)
            result = verify_sampling(
                candidates, sampling.probs(logits, row_to_request), *retrive,
                num_steps=cfg.num_steps, threshold_single=cfg.accept_threshold_single,
                threshold_acc=cfg.accept_threshold_acc, generator=self.generator,
            )
        commit = committed_tokens(result)
        slots, positions = self._commit_kv(req_pool_indices, seq_lens, result)
        self._draft_extend(
            commit.tokens, features[commit.source_nodes], positions, slots,
            req_pool_indices, seq_lens, commit.num_committed,
        )
        tokens = torch.split(commit.tokens, commit.num_committed)
        return DecodeOutput(
            tokens=[t.tolist() for t in tokens],
            seq_lens=seq_lens + torch.tensor(commit.num_committed, device=seq_lens.device),
            accept_lengths=[c - 1 for c in commit.num_committed],
        )

    def decode_plain(
        self,
        req_pool_indices: torch.Tensor,  # [bs]
        seq_lens: torch.Tensor,  # [bs]
        verified_ids: torch.Tensor,  # [bs]
        sampling: SamplingInfo,
    ) -> DecodeOutput:
        """One target token per request without a draft tree; the draft cache is kept in step.

        Used when speculation is off for these requests (per request, or above the batch-size
        threshold): the target decodes the root, then the draft head extends over the one
        committed token, so the requests can speculate again in any later step.
        """
        bs = int(req_pool_indices.shape[0])
        out_cache_loc = self.memory.alloc_extend(req_pool_indices, seq_lens, torch.ones_like(seq_lens))
        batch = ForwardBatch.decode(
            verified_ids, seq_lens, out_cache_loc, req_pool_indices,
            req_to_token=self.memory.req_to_token, kv_cache=self.target.kv_cache,
            attn_backend=self.target.attn_backend, capture_hidden_mode=CaptureHiddenMode.LAST,
        )
        out = self.target.forward(batch)
        next_ids = sampling.sample(out.next_token_logits)
        self._draft_extend(next_ids, out.hidden_states, seq_lens, out_cache_loc,
                           req_pool_indices, seq_lens, [1] * bs)
        return DecodeOutput(tokens=[[t] for t in next_ids.tolist()], seq_lens=seq_lens + 1, accept_lengths=[0] * bs)

    def _target_verify(self, req_pool_indices, seq_lens, seq_lens_cpu, tree) -> tuple[torch.Tensor, torch.Tensor]:
        bs, n = int(req_pool_indices.shape[0]), self.config.num_draft_tokens
        extend_lens = torch.full((bs,), n, dtype=torch.int64, device=seq_lens.device)
        out_cache_loc = self.memory.alloc_extend(req_pool_indices, seq_lens, extend_lens)
        batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            input_ids=tree.draft_tokens,
            positions=tree.positions,
            out_cache_loc=out_cache_loc,
            req_pool_indices=req_pool_indices,
            prefix_lens=seq_lens,
            extend_lens=extend_lens,
            req_to_token=self.memory.req_to_token,
            kv_cache=self.target.kv_cache,
            attn_backend=self.target.attn_backend,
            logits_mode=LogitsMode.ALL,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            tree_mask=tree.tree_mask,
            prefix_lens_cpu=seq_lens_cpu,
            extend_lens_cpu=[n] * bs,
        )
        out = self.target.forward(batch)
        return out.next_token_logits, out.hidden_states

    def _commit_kv(
        self,
        req_pool_indices: torch.Tensor,  # [bs]
        seq_lens: torch.Tensor,  # [bs]
        result: VerifyResult,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Move accepted nodes' target K/V to consecutive positions; free the rest of the tree.

        Tree node t of request b was written at position seq_len + t; its i-th accepted node
        (root = 0th) belongs at seq_len + i. Since t >= i and moves read before they write,
        compaction never clobbers a node still to be moved. Returns the committed positions'
        slots and positions, packed request by request ([sum(k+1)] each).
        """
        shape = result.accept_index.shape  # [bs, S+1]
        device = seq_lens.device
        src, dst, positions = (torch.empty(shape, dtype=torch.int64, device=device) for _ in range(3))
        compact_accepted_kv_locs(
            self.memory.req_to_token, req_pool_indices, seq_lens, result.accept_index, result.accept_length,
            src, dst, positions, num_draft_tokens=self.config.num_draft_tokens,
        )
        self.target.kv_cache.move(src.flatten(), dst.flatten())  # padding entries copy a slot onto itself
        n = self.config.num_draft_tokens
        self.memory.truncate(req_pool_indices, seq_lens + n, seq_lens + result.accept_length + 1)
        committed = positions >= 0  # [bs, S+1], row-major = request by request
        return dst[committed], positions[committed]

    def _draft_extend(
        self, input_ids, features, positions, out_cache_loc, req_pool_indices, prefix_lens, extend_lens_cpu
    ) -> None:
        topk_p, topk_index, hidden = self.draft.extend(
            input_ids=input_ids, features=features, positions=positions, out_cache_loc=out_cache_loc,
            req_pool_indices=req_pool_indices, prefix_lens=prefix_lens, extend_lens_cpu=extend_lens_cpu,
        )
        self.state.store(req_pool_indices, topk_p, topk_index, hidden)
