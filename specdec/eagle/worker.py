"""EAGLEWorker: turns each decode step of a host engine into draft -> verify -> commit -> extend.

    prefill   target EXTEND (capturing features) -> sample the first token
              -> draft EXTEND over the prompt shifted by one            (draft KV + root expansion)
    decode    draft tree (S steps, top-K) -> build_tree -> target TARGET_VERIFY over N nodes
              -> accept (greedy or lossless sampling) -> move accepted K/V into place, free the rest
              -> draft EXTEND over the committed tokens                 (draft KV + next root)

A standalone draft LM (STANDALONE) runs the same steps on tokens aligned with the target's
positions, without target features (``specdec.eagle.draft_inputs``: what the draft reads where).

The host owns requests, the request-to-token table and the slot allocator (``specdec.host``);
the worker owns the draft head, its KV cache (host slots + a scratch area for tree nodes + one
padding slot) and the per-request draft state. The host applies stop conditions to the committed
tokens it gets.

A decode step reads the device once: the committed tokens, copied while the draft extend runs.
``launch_decode`` queues a step and returns a ``PendingDecode`` whose ``result()`` is that read, so
a host may launch the next step from the pending one's device tensors first (overlap scheduling:
``slots_reserved``).
Every tensor between has a shape fixed by the batch size, so the draft loop and the draft extend
replay CUDA graphs (``capture_cuda_graphs``) and the host's runner may replay the verify forward.
A plain step (``launch_decode_plain``: the target decodes one token, no tree) keeps the draft in
step with a draft extend over that one token per request, which replays a graph of its own.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from specdec.attention import create_attention_backend
from specdec.attention.kv_dtype import KV_CACHE_DTYPES, is_fp8
from specdec.config import ConfigError, SpecConfig
from specdec.cuda_graph import WRITTEN
from specdec.eagle.acceptance import observe_paths
from specdec.eagle.draft import DraftRunner
from specdec.eagle.cuda_graphs import EAGLEDraftCudaGraphRunner, EAGLEDraftExtendCudaGraphRunner
from specdec.eagle.draft_inputs import draft_inputs
from specdec.eagle.heads import resolve_head
from specdec.eagle.output import (
    DecodeOutput,
    PendingDecode,
    copy_to_host_async,
    greedy_ids,
    pending_one_token,
    sample_next,
)
from specdec.eagle.replay import load_replay
from specdec.eagle.simulate import rank_probs
from specdec.eagle.state import DraftResources
from specdec.eagle.timing import PhaseTimer, maybe_host, maybe_phase
from specdec.eagle.tree import TreeMaskMode, build_tree
from specdec.eagle.verify_step import TreeVerifier, target_verify
from specdec.forward import CaptureHiddenMode, ForwardBatch, LogitsMode, to_device
from specdec.host import KVMemory, SamplingInfo, TargetModelRunner, step_slots
from specdec.kernels import CommitOutputs, commit_step
from specdec.kernels.commit import host_width

# the accepted paths of a verify step the adaptive policy's statistics take, at most (``_observed_rows``)
OBSERVED_PATHS_PER_STEP = 8
# ``carve_int64``'s parts start at multiples of this many elements (128 bytes)
CARVE_ALIGN = 16


def carve_int64(sizes: list[int], device) -> list[torch.Tensor]:
    """One int64 allocation cut into parts of ``sizes`` elements, each part 128-byte aligned.

    NOTE: Triton compiles a kernel variant per pointer alignment (16 bytes or not); parts packed end to
    end start at offsets that change with the batch size and the tree shape, so a kernel given them
    would build a variant in the middle of serving."""
    strides = [-(-n // CARVE_ALIGN) * CARVE_ALIGN for n in sizes]
    flat = torch.empty(sum(strides), dtype=torch.int64, device=device)
    return [part[:n] for part, n in zip(flat.split(strides), sizes)]


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
        resources: DraftResources | None = None,
        observe_paths: bool = False,
    ) -> None:
        """``resources``: the draft memory shared with other shapes' workers (default: this
        worker's own); ``observe_paths``: each step's result carries which draft ranks were tried
        and accepted at every depth (``specdec.eagle.acceptance``), at the cost of a few more
        columns in the step's one device read."""
        self.config = config
        self.target = target
        self.memory = memory
        self.generator = generator
        self.observe_paths = observe_paths
        self._observed_from = 0  # where the next step's sample of observed paths starts (``_observed_rows``)
        self.shape_name = f"{config.num_steps}x{config.topk}x{config.num_draft_tokens}"
        self.adapter = resolve_head(
            config, draft_model, hidden_size=target.hidden_size, target_aux_layers=target.aux_hidden_layers
        )
        self.device = next(draft_model.parameters()).device
        self.simulate_seed = self.generator.initial_seed() if self.generator is not None else 0
        # benchmark only: the recorded draft trees and target paths a simulated step replays
        self.replay = load_replay(config.simulate_trace, self.device) if config.simulate_trace else None
        if self.replay is not None:
            self.replay.check_shape(config.num_steps, config.topk)
        draft_attention = create_attention_backend(attention_backend)
        kv_dtype = KV_CACHE_DTYPES[config.draft_kv_cache_dtype]  # None: the head's own
        if kv_dtype is not None and is_fp8(kv_dtype) and not draft_attention.supports_fp8_kv_cache:
            raise ConfigError(f"--speculative-draft-kv-cache-dtype={config.draft_kv_cache_dtype}: the "
                              f"{draft_attention.name} attention backend reads no FP8 KV cache; use triton or "
                              "torch_native")
        if resources is None:
            resources = DraftResources.build(draft_model, memory, max_running_requests=max_running_requests,
                                             num_steps=config.num_steps, topk=config.topk,
                                             kv_cache_dtype=config.draft_kv_cache_dtype)
        if resources.root_topk < config.topk:
            raise ValueError(f"draft resources keep {resources.root_topk} root children, the shape needs {config.topk}")
        self.resources = resources
        self.inputs = draft_inputs(config.is_standalone, resources.park_base)  # what the draft reads where
        self.decode_hidden = self.inputs.decode_hidden  # what a plain decode step captures
        self.prefill_hidden = self.inputs.target_hidden  # what the target's prefill captures
        self.pad_slot = resources.pad_slot
        self.draft_kv = resources.kv
        self.state = resources.state
        self.draft = DraftRunner(
            draft_model,
            self.adapter,
            num_steps=config.num_steps,
            topk=config.topk,
            num_draft_tokens=config.num_draft_tokens,
            kv_cache=self.draft_kv,
            attn_backend=draft_attention,
            req_to_token=memory.req_to_token,
            scratch_base=memory.capacity,
            root_topk=resources.root_topk,
            rank_probs=rank_probs(config, memory.req_to_token.device),
            replay=self.replay,
            replay_seed=self.simulate_seed,
            replay_steps=self.state.replay_steps,
        )
        self.max_batch_size = max_running_requests  # the draft scratch area is sized for this
        self.verifier = TreeVerifier(config, generator=generator, replay=self.replay, simulate_seed=self.simulate_seed)
        self.draft_graph: EAGLEDraftCudaGraphRunner | None = None
        self.draft_extend_graph: EAGLEDraftExtendCudaGraphRunner | None = None  # verified steps: S + 1 tokens
        self.plain_extend_graph: EAGLEDraftExtendCudaGraphRunner | None = None  # plain steps: 1 token
        # set by a benchmark to time the phases of each decode step
        self.timer: PhaseTimer | None = None

    def verify_graph_sizes(self, batch_sizes: list[int]) -> dict[int, list[int]]:
        """The target's verify graphs to capture: batch sizes by tree size (tokens a request)."""
        return {self.config.num_draft_tokens: sorted(batch_sizes)}

    # ------------------------------------------------------------ CUDA graphs
    @torch.inference_mode()
    def capture_cuda_graphs(
        self, *, batch_sizes: list[int], max_seq_len: int, target_features: int, target_dtype: torch.dtype,
        use_graphs: bool = True, pool=None, draft_batch_sizes: list[int] | None = None, plain_steps: bool = True,
    ) -> int:
        """Capture the draft loop and the draft extends for each batch size; returns their bytes.

        ``max_seq_len`` bounds every request's length (it sizes the attention plans);
        ``use_graphs=False`` runs the same padded static path eagerly (for tests on CPU);
        ``draft_batch_sizes`` (default ``batch_sizes``) limits the draft loop's graphs (the draft
        extends are captured at every size); ``plain_steps``: capture the plain steps' one-token
        draft extend too (False: this worker runs no plain steps, e.g. a non-base adaptive shape).
        """
        if max(batch_sizes) > self.max_batch_size:
            raise ValueError(f"--cuda-graph-max-bs={max(batch_sizes)} exceeds "
                             f"max_running_requests={self.max_batch_size}")
        common = dict(max_seq_len=max_seq_len, device=self.device, use_graphs=use_graphs, pool=pool)
        self.draft_graph = EAGLEDraftCudaGraphRunner(self.draft, self.state,
                                                     batch_sizes=draft_batch_sizes or batch_sizes, **common)
        extend = dict(feature_size=target_features if self.inputs.needs_features else 0, feature_dtype=target_dtype,
                      pad_slot=self.pad_slot, batch_sizes=batch_sizes, **common)
        self.draft_extend_graph = EAGLEDraftExtendCudaGraphRunner(
            self.draft, self.state, num_tokens_per_req=self.config.num_steps + 1, **extend)
        if plain_steps:
            self.plain_extend_graph = EAGLEDraftExtendCudaGraphRunner(
                self.draft, self.state, num_tokens_per_req=1, name="plain draft extend", **extend)
        return sum(graph.capture() for graph in self.draft_graphs())

    def release_cuda_graphs(self) -> None:
        """Destroy the draft and draft-extend graphs; they run eagerly from now on."""
        for graph in self.draft_graphs():
            graph.runner.release()
        self.draft_graph = self.draft_extend_graph = self.plain_extend_graph = None

    def draft_graphs(self) -> list[EAGLEDraftCudaGraphRunner | EAGLEDraftExtendCudaGraphRunner]:
        """The draft graphs captured (or set up to run the padded path eagerly)."""
        return [g for g in (self.draft_graph, self.draft_extend_graph, self.plain_extend_graph) if g is not None]

    @property
    def plain_step_prefills(self) -> bool:
        """Whether a plain step (``launch_decode_plain``) of a request whose prompt's KV is cached but
        for its last token is that token's prefill: the target's KV and next token, and the draft's
        one-token extend (``prefill`` routes such prefills there too). Not under a replayed
        acceptance, whose rows ``prefill`` resets."""
        return self.inputs.one_token_prefill_is_plain_step and self.replay is None

    # ---------------------------------------------------------------- prefill
    def prefill(self, batch: ForwardBatch, sampling: SamplingInfo, *,
                next_tokens: list[int] | None = None) -> torch.Tensor:
        """Target EXTEND + draft EXTEND; returns the token after each request's new ones: [bs].

        The batch may extend a cached prefix (``prefix_lens``) whose target and draft KV are
        already in place. ``next_tokens``: the token after each request's new ones where the host
        knows it (a chunk of a longer prompt: the draft head's input at the chunk's last
        position), -1 where it is sampled; ``sampling`` covers the sampled requests, in order.
        Default: every request samples.
        """
        if self.inputs.needs_features and batch.capture_hidden_mode != CaptureHiddenMode.FULL:
            raise ValueError("speculative prefill needs capture_hidden_mode=FULL on the EXTEND batch")
        if batch.capture_hidden_mode != self.inputs.target_hidden:
            batch = dataclasses.replace(batch, capture_hidden_mode=self.inputs.target_hidden)
        out = self.target.forward(batch)
        extend_lens = batch.host_extend_lens()
        ends = to_device(extend_lens, torch.int64, batch.input_ids.device).cumsum(0) - 1
        logits = out.next_token_logits
        if batch.logits_mode == LogitsMode.ALL:  # the host asked for every position (prompt logprobs)
            sampling.record_prompt_logprobs(logits, batch.input_ids, extend_lens)
            logits = logits[ends]
        next_ids = sample_after_prefill(logits, sampling, next_tokens)
        if batch.num_tokens == batch.batch_size and self.inputs.one_token_prefill_is_plain_step:
            # one token a request (a prompt cached but for its last token): the plain step's draft extend,
            # its graph where one is captured (the target's forward replayed the decode graph likewise)
            self._draft_extend_plain(batch.req_pool_indices, batch.prefix_lens, batch.prefix_lens_cpu, next_ids,
                                     out.hidden_states, batch.out_cache_loc)
        else:
            ext = self.inputs.prefill(batch.input_ids, out.hidden_states, batch.positions, batch.out_cache_loc,
                                      extend_lens, next_ids, batch.req_pool_indices)
            topk_p, topk_index, hidden = self.draft.extend(
                input_ids=ext.input_ids, features=ext.features, positions=ext.positions,
                out_cache_loc=ext.out_cache_loc, req_pool_indices=batch.req_pool_indices,
                prefix_lens=batch.prefix_lens, extend_lens_cpu=ext.extend_lens_cpu,
                prefix_lens_cpu=batch.prefix_lens_cpu,
            )
            self.state.store(batch.req_pool_indices, topk_p, topk_index, hidden)
        if self.replay is not None:  # a new request's first verify step replays the row keyed 0
            self.state.replay_steps[batch.req_pool_indices] = 0
        return next_ids

    # ---------------------------------------------------------------- decode
    def decode(self, req_pool_indices, seq_lens, verified_ids, sampling, **kw) -> DecodeOutput:
        """One speculative decode step, waited for: ``launch_decode(...).result()``."""
        return self.launch_decode(req_pool_indices, seq_lens, verified_ids, sampling, **kw).result()

    def launch_decode(
        self,
        req_pool_indices: torch.Tensor,  # [bs]
        seq_lens: torch.Tensor,  # [bs] tokens in KV; the root (last committed token) is not
        verified_ids: torch.Tensor,  # [bs] last committed token of each request
        sampling: SamplingInfo,
        *,
        seq_lens_cpu: list[int] | None = None,  # host copies of seq_lens and req_pool_indices,
        rows_cpu: list[int] | None = None,  # when the host has them (saves reading the device)
        slots_reserved: bool = False,
    ) -> PendingDecode:
        """Queue one speculative decode step; its ``result()`` is the step's one read of the device.

        By default the step allocates the tree's KV slots (positions seq_len .. seq_len + N - 1)
        from the host's lists and ``result()`` frees the unaccepted ones: call it before the next
        step. ``slots_reserved=True`` (overlap scheduling, where the host launches a step before
        it knows the previous step's lengths): the host has already given those positions slots,
        the step reads them from ``req_to_token`` on the device and frees nothing.
        """
        cfg = self.config
        bs, n = int(req_pool_indices.shape[0]), cfg.num_draft_tokens
        if bs > self.max_batch_size:
            raise ValueError(f"decode batch of {bs} requests exceeds max_running_requests={self.max_batch_size}")
        # the step's slots come first, while the device may be idle (the host allocator may sync)
        tree_slots = step_slots(self.memory, req_pool_indices, seq_lens, n, seq_lens_cpu=seq_lens_cpu,
                                rows_cpu=rows_cpu, reserved=slots_reserved)
        with maybe_phase(self.timer, "draft"):
            self.inputs.place_root(self.draft_kv, req_pool_indices, tree_slots.view(bs, n)[:, 0])
            parent_list, top_index, draft_tokens = self._expand(req_pool_indices, seq_lens, seq_lens_cpu)
            tree = build_tree(
                verified_ids, parent_list, top_index, draft_tokens, seq_lens, 0,
                cfg.topk, cfg.num_steps, n, tree_mask_mode=TreeMaskMode.QLEN_ONLY,
            )
        with maybe_phase(self.timer, "verify"):
            verified = target_verify(self.target, self.memory.req_to_token, req_pool_indices, seq_lens,
                                     seq_lens_cpu, tree, tree_slots, num_draft_tokens=n)
            logits, features = verified.next_token_logits, verified.hidden_states  # [bs * N, vocab], [bs * N, F]
            if getattr(sampling, "needs_processing", False):  # penalties, logit_bias, grammar: per node
                logits = sampling.process(logits.float(), tree)
            keys = self.state.replay_steps[req_pool_indices] if self.replay is not None else None
            result = self.verifier(tree, logits, sampling, seq_lens, replay_keys=keys,
                                   predicts=greedy_ids(verified, sampling))
            if keys is not None:
                self.state.replay_steps[req_pool_indices] = keys + 1
        extend_graph = self._extend_graph(bs, seq_lens_cpu)
        with maybe_phase(self.timer, "commit"):
            out = self._commit_outputs(bs, extend_graph)
            commit_step(self.memory.req_to_token, req_pool_indices, seq_lens, result.accept_index,
                        result.accept_length, result.predicts, tree.retrive_next_token, tree.retrive_next_sibling,
                        out, num_draft_tokens=n, pad_slot=self.pad_slot, park_base=self.inputs.park_base)
            # NOTE: a chain's node t sits at position seq_len + t, so its accepted nodes are in place
            if cfg.topk > 1:
                self.target.kv_cache.move(out.src_locs, out.dst_locs)  # [bs, S+1]: padding is src == dst
            if getattr(sampling, "top_logprobs_num", None) is not None:
                sampling.record_logprobs(logits[out.nodes], out.tokens)  # each token under its node's logits
            host_view = copy_to_host_async(out.host)
        with maybe_phase(self.timer, "draft_extend"):
            self._draft_extend_verified(req_pool_indices, seq_lens, seq_lens_cpu, result.accept_length, out,
                                        features, extend_graph)

        def read() -> DecodeOutput:
            # the step's one read of the device; the draft extend keeps running meanwhile
            with maybe_host(self.timer, "read_wait"):
                host = host_view()
            width = cfg.num_steps + 1
            rows, old_lens, accept_host, tokens_host = _unpack([r[: 3 + width] for r in host])
            new_lens = [s + k + 1 for s, k in zip(old_lens, accept_host)]
            if not slots_reserved:
                self.memory.truncate(rows, [s + n for s in old_lens], new_lens)
            paths = None
            if self.observe_paths:
                links = np.asarray([r[3 + width:] for r in self._observed_rows(host)], dtype=np.int64)
                paths = observe_paths(links[:, :width], links[:, width : width + n], links[:, width + n :],
                                      max_depth=cfg.num_steps, max_topk=cfg.topk)
            return DecodeOutput(
                tokens=[t[: k + 1] for t, k in zip(tokens_host, accept_host)],
                seq_lens=new_lens,
                accept_lengths=accept_host,
                shape=self.shape_name,
                paths=paths,
            )

        return PendingDecode(out.next_seq_lens, out.next_tokens, read)

    def _observed_rows(self, host: list) -> list:
        """The rows of a read step whose accepted paths the policy observes: all of a small batch, else
        OBSERVED_PATHS_PER_STEP of them, a window that moves on each step so that every request is observed
        in turn. (Every path of a 5x4x8 tree, in numpy, took 158-214 us of host time a step at 32-128 requests
        on a 2-core CPU, 8 paths 30-40 us; under cProfile on an H200's host 0.24 ms a step at 32 requests, the
        most of specdec's own functions in a server's profile. The statistics need far fewer paths.)"""
        bs = len(host)
        if bs <= OBSERVED_PATHS_PER_STEP:
            return host
        start = self._observed_from % bs
        self._observed_from = start + OBSERVED_PATHS_PER_STEP
        return [host[(start + i) % bs] for i in range(OBSERVED_PATHS_PER_STEP)]

    def decode_plain(self, req_pool_indices, seq_lens, verified_ids, sampling, **kw) -> DecodeOutput:
        """One plain decode step, waited for: ``launch_decode_plain(...).result()``."""
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
        """One target token per request without a draft tree; the draft cache is kept in step.

        Used when speculation is off for these requests (per request, or above the batch-size
        threshold): the target decodes the root, then the draft head extends over the one
        committed token (one row per request: ``_draft_extend_plain``), so the requests can
        speculate again in any later step. Slots as in ``launch_decode``, for one position per
        request.
        """
        out_cache_loc = step_slots(self.memory, req_pool_indices, seq_lens, 1, seq_lens_cpu=seq_lens_cpu,
                                   rows_cpu=rows_cpu, reserved=slots_reserved)
        self.inputs.place_root(self.draft_kv, req_pool_indices, out_cache_loc)
        batch = ForwardBatch.decode(
            verified_ids, seq_lens, out_cache_loc, req_pool_indices,
            req_to_token=self.memory.req_to_token, kv_cache=self.target.kv_cache,
            attn_backend=self.target.attn_backend, capture_hidden_mode=self.decode_hidden,
            seq_lens_cpu=seq_lens_cpu,
        )
        out = self.target.forward(batch)
        next_ids = sample_next(out, sampling)  # [bs]
        pending = pending_one_token(seq_lens, next_ids, seq_lens_cpu)  # the copy is queued before the draft extend
        self._draft_extend_plain(req_pool_indices, seq_lens, seq_lens_cpu, next_ids, out.hidden_states, out_cache_loc)
        return pending

    # ---------------------------------------------------------------- phases
    def _expand(self, req_pool_indices, seq_lens, seq_lens_cpu) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        bs = int(req_pool_indices.shape[0])
        seq_lens, seq_lens_cpu = self.inputs.draft_lens(seq_lens, seq_lens_cpu)
        if self.draft_graph is not None and self.draft_graph.can_run(bs, seq_lens_cpu):  # reads the state itself
            return self.draft_graph(req_pool_indices=req_pool_indices, seq_lens=seq_lens, seq_lens_cpu=seq_lens_cpu)
        topk_p, topk_index, hidden = self.state.load(req_pool_indices)
        k = self.config.topk  # the state keeps the widest shape's topk
        return self.draft.expand(topk_p[:, :k], topk_index[:, :k], hidden, req_pool_indices=req_pool_indices,
                                 seq_lens=seq_lens, seq_lens_cpu=seq_lens_cpu)

    def _extend_graph(self, bs: int, seq_lens_cpu: list[int] | None) -> EAGLEDraftExtendCudaGraphRunner | None:
        """The draft-extend graph a step of ``bs`` requests replays, if any."""
        graph = self.draft_extend_graph  # (its prefix lengths are on the host where seq_lens_cpu is)
        return graph if graph is not None and graph.can_run(bs, seq_lens_cpu) else None

    def _commit_outputs(self, bs: int, extend_graph: EAGLEDraftExtendCudaGraphRunner | None) -> CommitOutputs:
        """``commit_step``'s outputs for ``bs`` requests: one fresh allocation, and the draft
        extend's inputs straight in the graph's buffers where it replays. NOTE: the lengths and
        tokens a step hands on are fresh (the next step reads them while this one's buffers are
        rewritten)."""
        cfg = self.config
        w = cfg.num_steps + 1
        host = host_width(cfg.num_steps, cfg.num_draft_tokens, observe=self.observe_paths)
        in_graph = extend_graph is not None
        sizes = [bs * w] * 3 + [bs] * 2 + [bs * host] + ([] if in_graph else [bs * w] * 3 + [bs])
        parts = carve_int64(sizes, self.device)
        src, dst, nodes, next_tokens, next_seq_lens, host_rows = parts[:6]
        if in_graph:
            rows = extend_graph.runner.rows
            tokens, positions, slots, committed = (rows(name, bs) for name in
                                                   ("input_ids", "positions", "out_cache_loc", "num_committed"))
        else:
            tokens, positions, slots, committed = parts[6:]
        return CommitOutputs(src.view(bs, w), dst.view(bs, w), nodes.view(bs, w), tokens.view(bs, w), next_tokens,
                             next_seq_lens, positions.view(bs, w), slots.view(bs, w), committed,
                             host_rows.view(bs, host))

    def _draft_extend_verified(self, req_pool_indices, seq_lens, seq_lens_cpu, accept_length: torch.Tensor,
                               out: CommitOutputs, features, graph: EAGLEDraftExtendCudaGraphRunner | None) -> None:
        """Draft extend over a verified step's S + 1 tokens per request, its inputs written by
        ``commit_step`` (into the graph's buffers where ``graph`` replays)."""
        bs, width = out.tokens.shape
        prefix, prefix_cpu = self.inputs.draft_lens(seq_lens, seq_lens_cpu)
        needs = self.inputs.needs_features
        if graph is not None:
            graph(seq_lens_cpu=prefix_cpu, input_ids=WRITTEN, positions=WRITTEN, out_cache_loc=WRITTEN,
                  num_committed=WRITTEN, req_pool_indices=req_pool_indices, seq_lens=prefix,
                  state_rows=req_pool_indices,
                  features=(lambda rows: torch.index_select(features, 0, out.nodes.flatten(), out=rows))
                  if needs else (lambda rows: None))
            return
        topk_p, topk_index, hidden = self.draft.extend(
            input_ids=out.tokens.flatten(), features=features[out.nodes.flatten()] if needs else None,
            positions=out.positions.flatten(), out_cache_loc=out.slots.flatten(), req_pool_indices=req_pool_indices,
            prefix_lens=prefix, extend_lens_cpu=[width] * bs, prefix_lens_cpu=prefix_cpu,
            output_rows=torch.arange(bs, device=prefix.device) * width + accept_length,
        )
        self.state.store(req_pool_indices, topk_p, topk_index, hidden)

    def _draft_extend_plain(
        self,
        req_pool_indices: torch.Tensor,  # [bs]
        seq_lens: torch.Tensor,  # [bs] tokens in KV before the step (the root is not)
        seq_lens_cpu: list[int] | None,
        next_ids: torch.Tensor,  # [bs] the committed token
        features: torch.Tensor | None,  # [bs, target_features] the target's at the root (EAGLE heads only)
        root_slots: torch.Tensor,  # [bs] the slots of the roots' position seq_len
    ) -> None:
        """A plain step's draft extend over its one committed token per request, which stores the
        new root expansions; replays the one-token draft-extend graph where one is captured for
        the batch. The draft KV before the token: up to the root (EAGLE) or with it (standalone)."""
        bs = int(req_pool_indices.shape[0])
        prefix, prefix_cpu = self.inputs.draft_lens(seq_lens, seq_lens_cpu)  # the token's position, [bs]
        needs = self.inputs.needs_features
        graph = self.plain_extend_graph
        if graph is not None and graph.can_run(bs, prefix_cpu):
            def write_slots(rows):
                self.inputs.plain_slots(root_slots, req_pool_indices, out=rows)

            graph(seq_lens_cpu=prefix_cpu, input_ids=next_ids, features=features if needs else (lambda rows: None),
                  positions=prefix, out_cache_loc=write_slots, req_pool_indices=req_pool_indices, seq_lens=prefix,
                  state_rows=req_pool_indices)
            return
        topk_p, topk_index, hidden = self.draft.extend(
            input_ids=next_ids, features=features if needs else None, positions=prefix,
            out_cache_loc=self.inputs.plain_slots(root_slots, req_pool_indices), req_pool_indices=req_pool_indices,
            prefix_lens=prefix, extend_lens_cpu=[1] * bs, prefix_lens_cpu=prefix_cpu,
        )
        self.state.store(req_pool_indices, topk_p, topk_index, hidden)


def sample_after_prefill(
    logits: torch.Tensor,  # [bs, vocab] at each request's last new token
    sampling: SamplingInfo,
    next_tokens: list[int] | None,
) -> torch.Tensor:  # [bs] int64
    """The token after each request's new ones: ``next_tokens[b]`` where it is known (>= 0), else
    drawn by ``sampling``, which covers just those requests, in order (None: all sample)."""
    if next_tokens is None:
        return sampling.sample(logits)
    out = to_device(next_tokens, torch.int64, logits.device)
    sampled = [b for b, t in enumerate(next_tokens) if t < 0]
    if sampled:
        rows = to_device(sampled, torch.int64, logits.device)
        out[rows] = sampling.sample(logits[rows]).to(torch.int64)
    return out


def _unpack(rows: list[list[int]]) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """Columns (request row, seq_len, accept length, committed tokens) of the step's host copy."""
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3:] for r in rows]
