"""DraftRunner: the draft head's two jobs, extending its KV cache and expanding the draft tree.

Tree expansion for one decode step (S = num_steps, K = topk):

    select step 0       root's top-K children (kept from the last draft extend)   -> frontier F1
    forward 1..S-1      draft head over the K frontier nodes of each request (one token each,
                        position = seq_len + i - 1), then keep the K best of their K*K children
                        by cumulative probability                                 -> frontier F(i+1)

Every frontier node writes its draft K/V into a scratch slot owned by the worker (past the host's
KV capacity), and attends to the request's prefix plus the scratch slots of its own ancestors,
nothing else: ``ancestors`` is re-gathered from each new node's parent branch every step.
Example with K=2: after step 2, branch 0 may extend F2[1] and branch 1 extend F2[1] too; both
then see [prefix, F1[p], F2[1], self], never the KV of F2[0].
"""

from __future__ import annotations

import torch

from specdec.eagle.heads import DraftHeadAdapter
from specdec.eagle.tree import organize_draft_results, select_top_k_tokens
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode, LogitsOutput
from specdec.kernels import draft_scratch_slots
from specdec.models.ops.topk import softmax_topk


class DraftRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        adapter: DraftHeadAdapter,
        *,
        num_steps: int,
        topk: int,
        num_draft_tokens: int,
        kv_cache,
        attn_backend,
        req_to_token: torch.Tensor,
        scratch_base: int,
        root_topk: int | None = None,
        rank_probs: torch.Tensor | None = None,
        replay=None,
        replay_seed: int = 0,
        replay_steps: torch.Tensor | None = None,
    ) -> None:
        """``root_topk``: children of the root an extend keeps (default ``topk``; more when
        several tree shapes share the draft state)."""
        self.model = model
        self.adapter = adapter
        self.num_steps = num_steps
        self.topk = topk
        self.num_draft_tokens = num_draft_tokens
        self.kv_cache = kv_cache
        self.attn_backend = attn_backend
        self.req_to_token = req_to_token
        self.scratch_base = scratch_base
        self.root_topk = root_topk or topk
        # benchmark only ([S, P, K], simulated acceptance): each depth's child probabilities by parent rank
        # and rank replace the head's, so the tree is the best-first tree of the acceptance model the
        # verify draws from
        self.rank_probs = rank_probs
        # benchmark only (a specdec.eagle.replay.DraftReplay): each request's tree follows the recorded
        # probabilities of the trace row its (seed, batch row, verify steps so far) picks, as the
        # verify's path does; ``replay_steps`` [max_reqs + 1] the counts (``DraftState.replay_steps``)
        self.replay = replay
        self.replay_seed = replay_seed
        self.replay_steps = replay_steps
        # measurement only (eager): called with each expansion's lists (specdec.eagle.replay.TraceRecorder)
        self.observer = None

    def _forward(self, batch: ForwardBatch) -> LogitsOutput:
        self.attn_backend.init_forward_metadata(batch)
        return self.model(batch)

    def _root_topk(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k most likely draft tokens of each row (as target ids) and their probabilities:
        [rows, k] each (two kernels on a GPU, not softmax + torch's radix top-k and a gather: see
        specdec.models.ops.topk)."""
        return softmax_topk(logits, k, id_map=self.adapter.target_ids)

    def extend(
        self,
        *,
        input_ids: torch.Tensor,  # [num_tokens] committed tokens, shifted one ahead of `features`
        features: torch.Tensor,  # [num_tokens, target_features] target features at those positions
        positions: torch.Tensor,  # [num_tokens]
        out_cache_loc: torch.Tensor,  # [num_tokens] the same slots the target used
        req_pool_indices: torch.Tensor,  # [bs]
        prefix_lens: torch.Tensor,  # [bs]
        extend_lens_cpu: list[int],
        output_rows: torch.Tensor | None = None,  # [bs] each request's last real token (padded input)
        prefix_lens_cpu: list[int] | None = None,
        static_max_seq_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draft KV for the new tokens; returns the root expansion (topk_p, topk_index, hidden).

        With ``output_rows`` the requests may carry padding tokens after their real ones (causal
        attention keeps them invisible to the real ones); the root expansion is read at those rows.
        """
        batch = ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND,
            input_ids=input_ids,
            positions=positions,
            out_cache_loc=out_cache_loc,
            req_pool_indices=req_pool_indices,
            prefix_lens=prefix_lens,
            extend_lens=_device_lens(extend_lens_cpu, input_ids.device),
            req_to_token=self.req_to_token,
            kv_cache=self.kv_cache,
            attn_backend=self.attn_backend,
            logits_mode=LogitsMode.LAST,
            logits_dtype=None,  # read only by softmax_topk, which widens them
            capture_hidden_mode=CaptureHiddenMode.LAST,
            spec_hidden_states=features,
            prefix_lens_cpu=prefix_lens_cpu,
            extend_lens_cpu=extend_lens_cpu,
            output_rows=output_rows,
            static_max_seq_len=static_max_seq_len,
        )
        out = self._forward(batch)
        topk_p, topk_index = self._root_topk(out.next_token_logits, self.root_topk)
        return topk_p, topk_index, out.hidden_states

    def expand(
        self,
        root_topk_p: torch.Tensor,  # [bs, K]
        root_topk_index: torch.Tensor,  # [bs, K]
        root_hidden: torch.Tensor,  # [bs, hidden]
        *,
        req_pool_indices: torch.Tensor,  # [bs]
        seq_lens: torch.Tensor,  # [bs] tokens in KV (the root itself is not)
        seq_lens_cpu: list[int] | None = None,
        static_max_seq_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Grow the draft tree; returns organize_draft_results' (parent_list, top_scores_index, draft_tokens).

        Reads no device value on the host when the backend plans statically
        (``static_max_seq_len``), so the whole loop can be captured as one CUDA graph.
        """
        bs, k = root_topk_p.shape
        device = root_topk_p.device
        if self.rank_probs is not None:
            root_topk_p = self.rank_probs[0, 0, :k].expand(bs, k)
        if self.replay is not None:
            rows = self.replay.rows(self.replay_steps[req_pool_indices], self.replay_seed)  # [bs] trace rows
            # [bs, K] each; the depth-1 frontier's recorded slots and its children's probabilities [bs*K, K]
            root_topk_p, trace_slots, replay_child_p = self.replay.root(rows, k, children=self.num_steps > 1)
        score_list, token_list, parents_list = [], [], []
        sel = select_top_k_tokens(0, root_topk_p, root_topk_index, root_hidden, None, k)
        # [bs*K, S-1] each frontier node's ancestor scratch slots, itself last; two buffers
        # because a step reads its parents' rows while writing permuted rows.
        width = max(self.num_steps - 1, 1)
        ancestors_in, ancestors_out = (torch.empty(bs * k, width, dtype=torch.int64, device=device) for _ in range(2))
        slots = torch.empty(bs * k, dtype=torch.int64, device=device)  # [bs*K] this step's scratch slots
        branch_positions = seq_lens.repeat_interleave(k)  # [bs*K] each branch's first draft position
        branches = torch.full((bs,), k, dtype=torch.int64, device=device)  # [bs] query rows per request
        for step in range(self.num_steps):
            score_list.append(sel.tree_info[0])
            token_list.append(sel.tree_info[1])
            parents_list.append(sel.tree_info[2])
            if step == self.num_steps - 1:
                break
            draft_scratch_slots(sel.parent_branch, ancestors_in, ancestors_out, slots,
                                scratch_base=self.scratch_base, num_steps=self.num_steps, step=step)
            ancestors_in, ancestors_out = ancestors_out, ancestors_in
            ancestors = ancestors_in[:, : step + 1]
            batch = ForwardBatch(
                forward_mode=ForwardMode.DECODE,
                input_ids=sel.input_ids,
                positions=branch_positions + step,
                out_cache_loc=slots,
                req_pool_indices=req_pool_indices,
                prefix_lens=seq_lens,
                extend_lens=branches,
                req_to_token=self.req_to_token,
                kv_cache=self.kv_cache,
                attn_backend=self.attn_backend,
                logits_mode=LogitsMode.ALL,
                logits_dtype=None,  # read only by softmax_topk, which widens them
                capture_hidden_mode=CaptureHiddenMode.FULL,
                draft_ancestors=ancestors,
                spec_hidden_states=sel.hidden_states,
                prefix_lens_cpu=seq_lens_cpu,
                extend_lens_cpu=[k] * bs,
                static_max_seq_len=static_max_seq_len,
            )
            out = self._forward(batch)
            topk_p, topk_index = self._root_topk(out.next_token_logits, k)  # [bs*K, K]
            if self.rank_probs is not None:
                topk_p = model_child_probs(self.rank_probs[step + 1], sel.tree_info[2], k)
            if self.replay is not None:
                topk_p = replay_child_p
            sel = select_top_k_tokens(step + 1, topk_p, topk_index, out.hidden_states, sel.scores, k)
            if self.replay is not None and step + 2 < self.num_steps:
                trace_slots, replay_child_p = self.replay.advance(rows, trace_slots, sel.tree_info[2], step + 1, k)
        if self.observer is not None:
            self.observer(score_list, token_list, parents_list, req_pool_indices, seq_lens)
        return organize_draft_results(score_list, token_list, parents_list, self.num_draft_tokens)



def model_child_probs(probs: torch.Tensor, frontier_parents: torch.Tensor, k: int) -> torch.Tensor:
    """[bs*K, K] an acceptance model's child probabilities under each frontier node, by its rank among
    its siblings (benchmark only).

    ``probs``: [P, >= K] the model's row per parent rank at the children's depth (ranks past P - 1 take
    the last). ``frontier_parents``: a draft step's ``tree_info[2]``, whose last K columns name the
    frontier by score index: step 0's are 0..K-1, a later step's K*K*(i-1) + K + branch*K + rank, so a
    node's rank among its siblings (its place in its parent's top-k) is the index mod K.
    """
    rank = (frontier_parents[:, -k:] % k).clamp(max=probs.shape[0] - 1)  # [bs, K]
    return probs[rank][..., :k].reshape(-1, k)


def _device_lens(lens: list[int], device: torch.device) -> torch.Tensor:
    """[bs] int64 on ``device``; equal lengths are filled on the device (no copy, capturable)."""
    if lens and all(n == lens[0] for n in lens):
        return torch.full((len(lens),), lens[0], dtype=torch.int64, device=device)
    return torch.tensor(lens, dtype=torch.int64, device=device)
