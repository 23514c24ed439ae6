"""NgramWorker: speculative decoding without a draft model (SGLang's ``--speculative-algorithm NGRAM``).

    prefill   target EXTEND -> sample the first token                    (no draft model, no draft KV)
    decode    each request's draft tree from n-gram matches in its own tokens (host, ``tree.py``)
              -> the step's verify size (``budget.py``) -> target TARGET_VERIFY over bs x n nodes
              -> accept (greedy, or lossless sampling) -> move accepted K/V into place, free the rest
              or, when no request has a match, one plain decode step

Verification is EAGLE's (``specdec.eagle.verify_step``): the drafter is deterministic, so its
draft probabilities are one-hot and tree sampling's target-only rule is exactly lossless (sibling
tokens are distinct by construction). A request whose lookup finds nothing drafts no node: its row
verifies only its root, which is a plain decode step for that request.

The host provides each request's tokens (``specdec.host.TokenHistory``), current before each
step, so a step reads the tokens the last step committed: no overlap scheduling
(``slots_reserved`` is refused). Each verify size replays the host's target-verify CUDA graphs
(``verify_graph_sizes``); the worker itself captures nothing.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from specdec.config import SpecConfig
from specdec.eagle.output import DecodeOutput, PendingDecode, copy_to_host_async, pending_one_token
from specdec.eagle.tree import BuiltTree
from specdec.eagle.verify_step import TreeVerifier, commit_accepted_kv, target_verify
from specdec.eagle.worker import sample_after_prefill
from specdec.forward import CaptureHiddenMode, ForwardBatch, LogitsMode
from specdec.host import KVMemory, SamplingInfo, TargetModelRunner, TokenHistory, table_slots
from specdec.ngram.budget import DraftBudget
from specdec.ngram.config import NgramConfig
from specdec.ngram.tree import PackedTrees, build_tree, pack_trees


class NgramWorker:
    # the hidden states its plain decode step asks for (the host captures its decode graphs so)
    decode_hidden = CaptureHiddenMode.NULL

    def __init__(
        self,
        config: SpecConfig,
        ngram: NgramConfig,
        target: TargetModelRunner,
        memory: KVMemory,
        history: TokenHistory,
        *,
        max_running_requests: int,
        generator: torch.Generator | None = None,
    ) -> None:
        """``config``: the shared speculative settings (N = ``ngram.num_draft_tokens`` nodes, depth
        N - 1, thresholds, batch-size threshold); ``ngram``: the drafter's own."""
        self.config = config
        self.ngram = ngram
        self.target = target
        self.memory = memory
        self.history = history
        self.max_batch_size = max_running_requests
        self.budget = DraftBudget(ngram, memory.req_to_token.shape[0])
        # one verifier per verify size n: its accepted path is at most n - 1 nodes deep
        self.verifiers = {
            n: TreeVerifier(dataclasses.replace(config, num_steps=n - 1, num_draft_tokens=n),
                            generator=generator, replay=None, simulate_seed=0)
            for n in self.budget.sizes
        }

    # ------------------------------------------------------------ CUDA graphs (the host's verify graphs)
    def verify_graph_sizes(self, batch_sizes: list[int]) -> dict[int, list[int]]:
        """The target's verify graphs to capture: each verify size at the batch sizes that may use it."""
        out = {n: [bs for bs in sorted(batch_sizes) if self.budget.node_cap(bs) >= n - 1] for n in self.budget.sizes}
        return {n: sizes for n, sizes in out.items() if sizes}

    def capture_cuda_graphs(self, **_) -> int:
        """Nothing of its own to capture (no draft model); returns 0 bytes."""
        return 0

    def release_cuda_graphs(self) -> None:
        pass

    # ------------------------------------------------------------ prefill
    def prefill(self, batch: ForwardBatch, sampling: SamplingInfo, *,
                next_tokens: list[int] | None = None) -> torch.Tensor:
        """Target EXTEND; returns the token after each request's new ones: [bs] (as ``EAGLEWorker.prefill``)."""
        out = self.target.forward(dataclasses.replace(batch, capture_hidden_mode=CaptureHiddenMode.NULL))
        extend_lens = batch.host_extend_lens()
        logits = out.next_token_logits
        if batch.logits_mode == LogitsMode.ALL:  # the host asked for every position (prompt logprobs)
            sampling.record_prompt_logprobs(logits, batch.input_ids, extend_lens)
            ends = torch.tensor(extend_lens, device=logits.device).cumsum(0) - 1
            logits = logits[ends]
        self.budget.reset(batch.req_pool_indices.tolist())
        return sample_after_prefill(logits, sampling, next_tokens)

    # ------------------------------------------------------------ decode
    def decode(self, req_pool_indices, seq_lens, verified_ids, sampling, **kw) -> DecodeOutput:
        return self.launch_decode(req_pool_indices, seq_lens, verified_ids, sampling, **kw).result()

    def launch_decode(
        self,
        req_pool_indices: torch.Tensor,  # [bs]
        seq_lens: torch.Tensor,  # [bs] tokens in KV; the root is not
        verified_ids: torch.Tensor,  # [bs] the root: each request's last committed token
        sampling: SamplingInfo,
        *,
        seq_lens_cpu: list[int] | None = None,
        rows_cpu: list[int] | None = None,
        slots_reserved: bool = False,
    ) -> PendingDecode:
        """Draft, verify and commit one step; ``result()`` reads it and frees the rejected slots."""
        if slots_reserved:
            raise ValueError("NGRAM drafts from the tokens the last step committed: no overlap scheduling")
        rows = rows_cpu if rows_cpu is not None else req_pool_indices.tolist()
        histories = [self.history.token_ids[r, : self.history.num_tokens[r]] for r in rows]
        trees = [build_tree(h, self.ngram, max_nodes=m) for h, m in zip(histories, self.budget.limits(rows, len(rows)))]
        largest = max(len(t) for t in trees)
        if largest == 0:  # no request has a match: a plain step
            return self.launch_decode_plain(req_pool_indices, seq_lens, verified_ids, sampling,
                                            seq_lens_cpu=seq_lens_cpu, rows_cpu=rows)
        n = self.budget.step_size(largest)
        depths = [t.depth() for t in trees]
        tree = device_tree(pack_trees(trees, [int(h[-1]) for h in histories], n), verified_ids, seq_lens)
        if seq_lens_cpu is not None:
            tree_slots = self.memory.alloc_extend(rows, seq_lens_cpu, [n] * len(rows))
        else:
            tree_slots = self.memory.alloc_extend(req_pool_indices, seq_lens, torch.full_like(seq_lens, n))
        logits, _ = target_verify(self.target, self.memory.req_to_token, req_pool_indices, seq_lens, seq_lens_cpu,
                                  tree, tree_slots, num_draft_tokens=n)
        if getattr(sampling, "needs_processing", False):  # penalties, logit_bias, grammar: per node
            logits = sampling.process(logits.float(), tree)
        result = self.verifiers[n](tree, logits, sampling, seq_lens)
        commit_accepted_kv(self.memory.req_to_token, self.target.kv_cache, req_pool_indices, seq_lens, result,
                           num_draft_tokens=n, topk=self.config.topk)
        nodes = result.accept_index.clamp(min=0)  # [bs, n] accepted path, the root past k
        tokens = result.predicts[nodes]  # [bs, n] committed tokens, padding past k
        if getattr(sampling, "top_logprobs_num", None) is not None:
            sampling.record_logprobs(logits[nodes], tokens)  # each token under its node's logits
        accept = result.accept_length  # [bs]
        next_tokens = tokens.gather(1, accept[:, None]).squeeze(1)  # [bs] the bonus token
        host_view = copy_to_host_async(torch.cat([seq_lens[:, None], accept[:, None], tokens], 1))

        def read() -> DecodeOutput:
            host = host_view()
            old_lens, accepted = [r[0] for r in host], [r[1] for r in host]
            new_lens = [s + k + 1 for s, k in zip(old_lens, accepted)]
            self.memory.truncate(rows, [s + n for s in old_lens], new_lens)
            self.budget.observe(rows, depths, accepted)
            return DecodeOutput(tokens=[r[2: 3 + k] for r, k in zip(host, accepted)], seq_lens=new_lens,
                                accept_lengths=accepted, shape=f"ngram{n}")

        return PendingDecode(seq_lens + accept + 1, next_tokens, read)

    def decode_plain(self, req_pool_indices, seq_lens, verified_ids, sampling, **kw) -> DecodeOutput:
        return self.launch_decode_plain(req_pool_indices, seq_lens, verified_ids, sampling, **kw).result()

    def launch_decode_plain(
        self,
        req_pool_indices: torch.Tensor,  # [bs]
        seq_lens: torch.Tensor,  # [bs]
        verified_ids: torch.Tensor,  # [bs]
        sampling: SamplingInfo,
        *,
        seq_lens_cpu: list[int] | None = None,
        rows_cpu: list[int] | None = None,
        slots_reserved: bool = False,
    ) -> PendingDecode:
        """One target token per request (its DECODE graph replays); nothing of the drafter changes."""
        if slots_reserved:
            out_cache_loc = table_slots(self.memory.req_to_token, req_pool_indices, seq_lens, 1)
        elif seq_lens_cpu is not None and rows_cpu is not None:
            out_cache_loc = self.memory.alloc_extend(rows_cpu, seq_lens_cpu, [1] * len(rows_cpu))
        else:
            out_cache_loc = self.memory.alloc_extend(req_pool_indices, seq_lens, torch.ones_like(seq_lens))
        batch = ForwardBatch.decode(
            verified_ids, seq_lens, out_cache_loc, req_pool_indices,
            req_to_token=self.memory.req_to_token, kv_cache=self.target.kv_cache,
            attn_backend=self.target.attn_backend, capture_hidden_mode=self.decode_hidden, seq_lens_cpu=seq_lens_cpu,
        )
        next_ids = sampling.sample(self.target.forward(batch).next_token_logits)  # [bs]
        return pending_one_token(seq_lens, next_ids)


def device_tree(
    packed: PackedTrees,
    verified_ids: torch.Tensor,  # [bs] the roots
    seq_lens: torch.Tensor,  # [bs]
) -> BuiltTree:
    """The packed host trees on the device, in one copy: what ``build_tree`` gives EAGLE's verify
    (QLEN_ONLY mask [bs * n * n], positions seq_len + depth, local child / sibling links)."""
    bs, n = packed.tokens.shape
    host = np.concatenate([packed.tokens, packed.depth, packed.next_token, packed.next_sibling,
                           packed.mask.reshape(bs, n * n)], axis=1)  # [bs, 4n + n*n] int64
    device = torch.from_numpy(host).to(seq_lens.device, non_blocking=True)
    tokens, depth, next_token, next_sibling = device[:, : 4 * n].view(bs, 4, n).unbind(1)  # [bs, n] each
    tokens = torch.cat([verified_ids[:, None].to(tokens.dtype), tokens[:, 1:]], 1)  # [bs, n] root from the device
    return BuiltTree(
        tree_mask=device[:, 4 * n:].flatten().bool(),
        positions=(seq_lens[:, None] + depth).flatten(),
        retrive_index=torch.arange(bs * n, device=seq_lens.device).view(bs, n),
        retrive_next_token=next_token.contiguous(),
        retrive_next_sibling=next_sibling.contiguous(),
        draft_tokens=tokens.flatten(),
    )
