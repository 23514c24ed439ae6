"""Engine: the reference host's public API (``specdec.Engine``), SGLang's keyword names.

    engine = Engine("path/to/model", speculative_algorithm="EAGLE3",
                    speculative_draft_model_path="path/to/head")
    engine.generate("Once upon a time", {"temperature": 0, "max_new_tokens": 32})
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
from typing import Any, Callable

import torch

from specdec.attention import KVCache, create_attention_backend
from specdec.config import SpecConfig
from specdec.cuda_graph import default_batch_sizes
from specdec.engine.args import EngineArgs
from specdec.engine.deterministic import deterministic_args
from specdec.engine.memory import PagedKVMemory
from specdec.engine.ngram_setup import TokenTable, ngram_configs, warm_up as ngram_warm_up
from specdec.engine.model_runner import ModelRunner
from specdec.engine.prefix_cache import NoPrefixCache, RadixPrefixCache
from specdec.engine.request import Request
from specdec.engine.sampling import SamplingParams
from specdec.engine.scheduler import Scheduler
from specdec.engine.sizing import default_kv_tokens, graph_batch_sizes, parse_dtype, running_cap
from specdec.engine.standalone_setup import standalone_draft
from specdec.engine.tp_worker import MirroredScheduler, TPWorkers, rank_device
from specdec.forward import CaptureHiddenMode
from specdec.models.ops.gemv import cublas_without_workspace
from specdec.models.parallel import TPGroup


# the EngineArgs fields that make the subsystem's SpecConfig (SpecConfig.from_flags)
SPEC_CONFIG_FLAGS = (
    "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_num_draft_tokens", "speculative_accept_threshold_single", "speculative_accept_threshold_acc",
    "speculative_token_map", "speculative_batch_size_threshold", "speculative_draft_kv_cache_dtype",
    "speculative_simulate_accept_length", "speculative_simulate_acceptance_model",
)


def _bind_current_device(device: torch.device) -> None:
    """The calling thread's current CUDA device := ``device`` (an indexed GPU; otherwise nothing).

    NOTE: Triton launches on the current device, which is per thread; tensors on another GPU fail
    there as "cpu tensor?" (a data-parallel replica on cuda:1 failed every request so, twice: first
    unset, then set only in the thread that built the engine and not in the server's loop thread).
    """
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


# engines with tensor-parallel workers not yet shut down: the interpreter's exit shuts them down, so
# the workers get their shutdown call and the process group its collective teardown. NOTE: held
# strongly: an engine its user dropped is not collected before its workers stop (on two H200s an 8B
# engine at tp 2 dropped at the end of a function, then left to the interpreter's teardown, ended
# with a segfault or an abort after its last step: the daemon workers killed, the process group and
# rank 0's CUDA graphs freed in no set order)
_TP_ENGINES: set["Engine"] = set()


def _shut_down_at_exit(engine: "Engine") -> None:
    if not _TP_ENGINES:
        atexit.unregister(_shut_down_live_engines)  # NOTE: registered once at a time
        atexit.register(_shut_down_live_engines)
    _TP_ENGINES.add(engine)


def _shut_down_live_engines() -> None:
    for engine in list(_TP_ENGINES):
        engine.shutdown()


class Engine:
    def __init__(
        self,
        model_path: str | None = None,
        *,
        args: EngineArgs | None = None,
        target_model: torch.nn.Module | None = None,
        draft_model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        tp_group: TPGroup | None = None,
        **flags: Any,
    ) -> None:
        """Load a target (``model_path``) or take one built in memory (``target_model``).

        The settings are ``EngineArgs``: given whole as ``args``, or as its keywords (SGLang's flag
        names with ``_``), e.g. ``Engine(path, speculative_algorithm="EAGLE3", page_size=16)``.
        With ``tp_size > 1`` this engine is rank 0 and starts the other ranks (``tp_worker``);
        ``tp_group`` is how a worker builds its own rank's engine.
        """
        if args is None:
            args = EngineArgs(model_path=model_path, **flags)
        elif flags or model_path is not None:
            raise TypeError("Engine: give either args=EngineArgs(...) or its keywords, not both")
        self._tp_workers: TPWorkers | None = None
        if args.node_rank > 0 and tp_group is None:
            raise ValueError(f"--node-rank {args.node_rank}: that node follows node 0 and builds no Engine of its "
                             "own (specdec serve runs it)")
        if args.tp_size > 1 and tp_group is None:
            if target_model is not None or draft_model is not None or args.model_path is None:
                raise ValueError("--tp-size > 1: every rank loads its shard from --model-path (no in-memory models)")
            from specdec.models.loaders import read_target_config

            TPGroup(rank=0, size=args.tp_size).check(read_target_config(args.model_path))
            self._tp_workers, tp_group = TPWorkers.start(args, type(self))
            args = dataclasses.replace(args, device=rank_device(args.device, 0))
        if torch.device(args.device).type == "cuda":
            cublas_without_workspace()  # no split-K: a token's rows equal at every M (decode, verify)
        _bind_current_device(torch.device(args.device))
        try:
            self._load(args, target_model, draft_model, tokenizer, tp_group or TPGroup())
            if self._tp_workers is not None:
                self._tp_workers.wait_ready()  # the other ranks take this one's choices from now on
                self.relay_speculation_choices(send=self._tp_workers.relay_choice)
                self.scheduler = MirroredScheduler(self.scheduler, self._tp_workers)
                _shut_down_at_exit(self)
        except RuntimeError as e:  # under tensor parallelism: most likely a failed collective
            if self._tp_workers is not None:
                raise self._tp_workers.failure(e) from e
            raise
        except BaseException:
            if self._tp_workers is not None:
                self._tp_workers.shutdown()
            raise

    def shutdown(self) -> None:
        """Release the CUDA graphs, then stop the tensor-parallel workers (they release theirs).
        An engine with workers that is never shut down is shut down at the interpreter's exit.

        NOTE: the graphs go first: NCCL cannot tear down a communicator whose collectives a live
        graph captured (pytorch/pytorch#115388), and tensor-parallel shutdown tears it down.
        """
        _TP_ENGINES.discard(self)
        self.release_cuda_graphs()
        if self._tp_workers is not None:
            self._tp_workers.shutdown()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def bind_thread(self) -> None:
        """Make the calling thread's current CUDA device the engine's. The constructor binds its own
        thread; a loop that steps the engine on another thread (the server's) calls this first."""
        _bind_current_device(self.memory.req_to_token.device)

    def relay_speculation_choices(self, *, send: Callable[[str], None] | None = None,
                                  receive: Callable[[], str] | None = None) -> None:
        """Tensor parallelism: rank 0's speculation policy (adaptive EAGLE's shape, NGRAM's verify size)
        chooses each step and ``send``s the choice, the other ranks ``receive`` it (the workers'
        ``relay_choices``), so rank 0 may learn from its served step times. Without a policy, nothing."""
        relay = getattr(self.worker, "relay_choices", None)
        if relay is not None:
            relay(send=send, receive=receive)

    def watch_workers(self, listener: Callable[[Exception], None]) -> None:
        """Under tensor parallelism, ``listener(error)`` (from a monitor thread) once a rank fails
        or goes away; ``error`` names it. Without tensor parallelism, never."""
        if self._tp_workers is not None:
            self._tp_workers.add_failure_listener(listener)

    def release_cuda_graphs(self) -> None:
        """Destroy every captured graph (target and draft); the engine runs eagerly afterwards."""
        self.runner.release_cuda_graphs()
        if self.worker is not None:
            self.worker.release_cuda_graphs()
        self.cuda_graph_bytes = 0
        if str(self.runner.kv_cache.device).startswith("cuda"):
            torch.cuda.synchronize(self.runner.kv_cache.device)

    def _load(self, args: EngineArgs, target_model, draft_model, tokenizer, tp: TPGroup) -> None:
        from specdec.models.loaders import draft_aux_hidden_layers, load_draft_head, load_target, read_num_layers
        from specdec.models.quantize import quantize_draft_
        from specdec.models.tokenizer import load_tokenizer

        self.args = args
        torch_dtype = parse_dtype(args.dtype, args.device)
        self.spec_config = None
        ngram = ngram_configs(args, draft_model=draft_model)  # NGRAM: no draft model
        self.ngram_config = ngram[1] if ngram is not None else None
        if ngram is not None:
            self.spec_config = ngram[0]
        elif args.speculative:
            self.spec_config = SpecConfig.from_flags(
                args.speculative_algorithm, **{name: getattr(args, name) for name in SPEC_CONFIG_FLAGS})
            if draft_model is None and args.speculative_draft_model_path is None:
                raise ValueError("--speculative-draft-model-path is required with --speculative-algorithm")
        if target_model is None:
            if args.model_path is None:
                raise ValueError("--model-path is required")
            aux = None
            if self.spec_config is not None and self.spec_config.is_eagle3 and draft_model is None:
                aux = draft_aux_hidden_layers(args.speculative_draft_model_path, read_num_layers(args.model_path))
            target_model = load_target(args.model_path, dtype=torch_dtype, device=args.device, aux_hidden_layers=aux,
                                       tp=tp, load_format=args.load_format, seed=args.random_seed)
            if tokenizer is None:
                tokenizer = load_tokenizer(args.model_path)
        # --attention-backend auto: triton on CUDA (sliding-window models too), torch_native on CPU
        args = args.with_attention_resolved()
        args = deterministic_args(args)  # --enable-deterministic-inference: checked, switch set, no graphs
        self.args = args
        standalone = standalone_draft(args, target_model, tokenizer, draft_model, dtype=torch_dtype)
        if standalone is not None:  # STANDALONE: a causal LM of the target's tokenizer drafts
            draft_model = standalone
        elif self.spec_config is not None and draft_model is None and ngram is None:
            draft_model = load_draft_head(
                args.speculative_draft_model_path, target_model, dtype=torch_dtype, device=args.device,
                token_map=args.speculative_token_map, load_format=args.load_format, seed=args.random_seed,
                draft_tp=args.speculative_draft_tp,
            )
        if self.spec_config is not None and args.speculative_draft_model_quantization is not None:
            quantize_draft_(draft_model, args.speculative_draft_model_quantization)
        self.tokenizer = tokenizer
        self.target_model = target_model
        self.draft_model = draft_model
        self._build(target_model, draft_model, attention_backend=args.attention, page_size=args.page_size,
                    device=args.device, max_total_tokens=args.max_total_tokens,
                    max_running_requests=args.max_running_requests, context_length=args.context_length,
                    random_seed=args.random_seed, cuda_graph_max_bs=args.cuda_graph_max_bs,
                    cuda_graph_bs=args.cuda_graph_bs,
                    disable_cuda_graph=args.disable_cuda_graph, overlap_schedule=args.overlap_schedule)

    def _build(self, target_model, draft_model, *, attention_backend, page_size, device, max_total_tokens,
               max_running_requests, context_length, random_seed, cuda_graph_max_bs, cuda_graph_bs, disable_cuda_graph,
               overlap_schedule) -> None:
        from specdec.eagle.adaptive import AdaptiveEAGLEWorker
        from specdec.eagle.worker import EAGLEWorker

        cfg = target_model.config
        kv_layout = target_model.kv_layout  # this rank's KV heads under tensor parallelism
        self.context_length = int(context_length or min(cfg.max_position_embeddings, 8192))
        tree = self.spec_config.num_draft_tokens if self.spec_config else 1
        # a request may hold its context, the tokens of one step launched past its end, and a tree
        step_tokens = self.spec_config.num_steps + 1 if self.spec_config else 1
        max_context_len = self.context_length + step_tokens + tree + page_size
        backend = create_attention_backend(attention_backend)
        if getattr(cfg, "has_sliding_layers", False) and not backend.supports_sliding_window:
            raise ValueError(
                f"--attention-backend {attention_backend} has no sliding-window attention, which this model "
                f"uses (sliding_window={cfg.sliding_window}); use --attention-backend triton or torch_native"
            )
        # overlap scheduling (default on CUDA): launch each decode step before reading the last one.
        # NOTE: not by default with speculation on a backend that plans on the host (FlashInfer): it
        # needs the lengths an unread step decides, so its graphs could not replay
        overlap = str(device).startswith("cuda") and not (self.spec_config and backend.plans_on_host)
        if overlap_schedule is not None:
            overlap = bool(overlap_schedule)
        graph_sizes = graph_batch_sizes(device, backend, cuda_graph_max_bs, cuda_graph_bs,
                                              disable_cuda_graph, max_running_requests)
        max_running_requests = running_cap(graph_sizes, max_running_requests)
        prefill_tokens = self.args.prefill_graph_tokens if str(device).startswith("cuda") else []
        draft_kv = self.spec_config.draft_kv_cache_dtype if self.spec_config else "auto"
        num_slots = int(max_total_tokens or default_kv_tokens(
            device, target_model, draft_model, graph_sizes, tree, max_running_requests * max_context_len,
            draft_kv=draft_kv, prefill_graph_tokens=max(prefill_tokens, default=0)))
        num_slots = -(-num_slots // page_size) * page_size
        self.memory = PagedKVMemory(
            num_slots=num_slots, page_size=page_size, max_reqs=max_running_requests + 1,
            max_context_len=max_context_len, device=device,
        )
        weight = next(target_model.parameters())
        # NOTE: one slot past the allocator's: padding requests of CUDA graphs write there
        kv = KVCache(num_layers=kv_layout.num_layers, num_slots=num_slots + 1,
                     num_kv_heads=kv_layout.num_kv_heads, head_dim=kv_layout.head_dim,
                     dtype=weight.dtype, device=device)
        self.runner = ModelRunner(target_model, kv, backend)
        self.generator = torch.Generator(device=device).manual_seed(random_seed)
        worker, token_table = None, None
        adaptive = (self.spec_config is not None and self._adaptive(self.args.speculative_adaptive, graph_sizes)
                    and self.ngram_config is None)  # NGRAM sizes its steps itself (specdec.ngram.budget)
        if self.ngram_config is not None:
            from specdec.ngram.worker import NgramWorker

            token_table = TokenTable(self.memory.max_reqs, self.memory.max_context_len)
            # cost-aware steps where EAGLE's adaptive speculation would run (under tensor parallelism
            # rank 0's: the choice follows its host clock, and the other ranks take it)
            costs = self._adaptive(self.args.speculative_adaptive, graph_sizes)
            worker = NgramWorker(self.spec_config, self.ngram_config, self.runner, self.memory, token_table,
                                 max_running_requests=max_running_requests, generator=self.generator,
                                 learn_step_times=costs)
        elif self.spec_config is not None:
            extra = dict(max_verify_rows=self.args.speculative_adaptive_max_verify_rows) if adaptive else {}
            worker = (AdaptiveEAGLEWorker if adaptive else EAGLEWorker)(
                self.spec_config, self.runner, self.memory, draft_model, attention_backend=attention_backend,
                max_running_requests=max_running_requests, generator=self.generator, **extra)
        self.worker = worker
        self.cuda_graph_bytes = 0
        if graph_sizes:
            self.cuda_graph_bytes = self.capture_cuda_graphs(graph_sizes)
        if prefill_tokens:
            self.cuda_graph_bytes += self.capture_prefill_graphs(prefill_tokens)
        args = self.args
        cache = NoPrefixCache(self.memory) if args.disable_radix_cache else RadixPrefixCache(self.memory)
        self.scheduler = Scheduler(self.runner, self.memory, worker=worker,
                                   max_running_requests=max_running_requests, tree_tokens=tree,
                                   overlap=overlap, generator=self.generator, prefix_cache=cache,
                                   chunked_prefill_size=args.prefill_chunk_tokens,
                                   schedule_conservativeness=args.schedule_conservativeness,
                                   waiting_served_ratio=args.waiting_served_ratio,
                                   max_waiting_tokens=args.max_waiting_tokens,
                                   decode_admission=args.enable_decode_admission,
                                   tokenizer=self.tokenizer, token_table=token_table,
                                   chunk_rule=backend.prefill_chunk_rule(torch.device(device)))
        self._ids = itertools.count()
        self._grammar_backend = None
        self._finished: dict[str, Request] = {}
        if adaptive:
            from specdec.engine.spec_profile import start_adaptive_policy

            start_adaptive_policy(self, graph_sizes or default_batch_sizes(max_running_requests))
        tp_size = getattr(getattr(target_model, "tp", None), "size", 1)
        if self.ngram_config is not None and graph_sizes and tp_size == 1:
            ngram_warm_up(self)  # NOTE: one rank only (tensor-parallel followers would not join its requests)

    @staticmethod
    def _adaptive(setting: str, graph_sizes: list[int]) -> bool:
        """--speculative-adaptive: on, off, or auto = on when decode steps replay CUDA graphs."""
        if setting not in ("auto", "on", "off"):
            raise ValueError(f"--speculative-adaptive={setting!r}: choose auto, on or off")
        return setting == "on" or (setting == "auto" and bool(graph_sizes))

    # ------------------------------------------------------------ CUDA graphs
    def capture_cuda_graphs(self, batch_sizes: list[int], *, use_graphs: bool = True) -> int:
        """Capture target decode / verify and the worker's draft graphs; returns the bytes they hold.

        ``use_graphs=False`` sets up the same padded static path but runs it eagerly (CPU tests).
        """
        device = self.memory.req_to_token.device
        pool = torch.cuda.graph_pool_handle() if use_graphs and device.type == "cuda" else None
        bound = self.memory.max_context_len
        spec = self.worker is not None
        total = 0
        if spec:
            total += self.worker.capture_cuda_graphs(
                batch_sizes=batch_sizes, max_seq_len=bound, target_features=self.target_model.hidden_feature_size,
                target_dtype=next(self.target_model.parameters()).dtype, use_graphs=use_graphs, pool=pool)
        runner_graphs = self.runner.capture_cuda_graphs(
            batch_sizes=batch_sizes, req_to_token=self.memory.req_to_token, pad_slot=self.memory.capacity,
            max_seq_len=bound, decode_hidden=self._decode_hidden(),
            verify_sizes=self.worker.verify_graph_sizes(batch_sizes) if spec else {},
            slot_tokens=getattr(self.worker, "slot_tokens", None), pool=pool, use_graphs=use_graphs)
        return total + runner_graphs

    def capture_prefill_graphs(self, token_counts: list[int], *, use_graphs: bool = True) -> int:
        """Capture the target's piecewise prefill graphs (``specdec.cuda_graph.piecewise``) at
        ``token_counts``; returns the bytes they hold. ``use_graphs=False``: the same padded path,
        run eagerly (CPU tests)."""
        return self.runner.capture_prefill_graphs(token_counts, hidden=self._prefill_hidden(), use_graphs=use_graphs)

    def _prefill_hidden(self) -> CaptureHiddenMode:
        """What the target's prefill forward captures: EAGLE's every token's hidden state, nothing for a
        standalone draft model, NGRAM or plain decoding."""
        if self.worker is None:
            return CaptureHiddenMode.NULL
        return getattr(self.worker, "base", self.worker).prefill_hidden

    def _decode_hidden(self) -> CaptureHiddenMode:
        """What a plain decode step captures: the draft head's input (EAGLE), nothing (NGRAM, plain)."""
        if self.worker is None:
            return CaptureHiddenMode.NULL
        return getattr(getattr(self.worker, "base", self.worker), "decode_hidden", CaptureHiddenMode.LAST)

    # ------------------------------------------------------------ memory
    @property
    def kv_bytes_per_token(self) -> dict[str, int]:
        """KV cache bytes one token position takes: target, draft head, and both (this rank)."""
        def per_slot(kv: KVCache) -> int:
            return kv.nbytes() // kv.num_slots

        out = {"target": per_slot(self.runner.kv_cache)}
        resources = getattr(self.worker, "resources", None)  # NGRAM: no draft KV
        out["draft"] = per_slot(resources.kv) if resources is not None else 0
        out["total"] = out["target"] + out["draft"]
        return out

    def cache_stats(self) -> dict[str, float | int]:
        """Prefix cache and KV pool figures (``/metrics``, benchmarks)."""
        sched, cache = self.scheduler, self.scheduler.cache
        return {
            "cache_hit_rate": cache.stats.hit_rate,
            "cached_prompt_tokens": cache.stats.hit_tokens,
            "queried_prompt_tokens": cache.stats.queried_tokens,
            "prefill_tokens": sched.prefill_tokens,
            "cached_pages": cache.cached_pages,
            "evictable_pages": cache.cached_pages - cache.locked_pages,
            "free_pages": self.memory.num_free_pages(),
            "num_pages": self.memory.num_pages,
            "num_retracted_reqs": sched.num_retracted,
        }

    def flush_cache(self) -> int:
        """Drop the prefix cache's unused pages (SGLang's /flush_cache); returns the pages freed."""
        return self.scheduler.flush_cache()

    # ------------------------------------------------------------ requests
    def _stop_ids(self, params: SamplingParams) -> frozenset[int]:
        """The request's stop ids and, unless ``ignore_eos``, every end of sequence: the model config's
        (with its generation config's) and the tokenizer's."""
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops.update(self.target_model.config.eos_token_ids)
            if self.tokenizer is not None and getattr(self.tokenizer, "eos_token_id", None) is not None:
                stops.add(self.tokenizer.eos_token_id)
        return frozenset(stops)

    def make_request(self, prompt: str | None = None, input_ids: list[int] | None = None,
                     sampling_params: dict | SamplingParams | None = None, rid: str | None = None,
                     *, clamp_max_new_tokens: bool = False) -> Request:
        """Validate one request; raises ValueError naming the problem (nothing is queued).

        ``clamp_max_new_tokens``: a max_new_tokens past what the prompt leaves of the context is
        cut to fit (the server's choice; it rejects one above the context length itself)."""
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt (text) or input_ids")
        if input_ids is None:
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: send input_ids instead of text")
            input_ids = self.tokenizer.encode(prompt)
        vocab = self.target_model.config.vocab_size
        if not input_ids or any((not isinstance(t, int)) or t < 0 or t >= vocab for t in input_ids):
            raise ValueError(f"input_ids must be a non-empty list of token ids in [0, {vocab})")
        params = sampling_params if isinstance(sampling_params, SamplingParams) else SamplingParams.from_dict(sampling_params)
        total = len(input_ids) + params.max_new_tokens
        if clamp_max_new_tokens and total > self.context_length and len(input_ids) < self.context_length:
            params = dataclasses.replace(params, max_new_tokens=self.context_length - len(input_ids))
            total = self.context_length
        if total > self.context_length:
            raise ValueError(
                f"prompt ({len(input_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) = {total} "
                f"exceeds the context length {self.context_length}"
            )
        if params.stop and self.tokenizer is None:
            raise ValueError("sampling_params.stop: stop strings need a tokenizer; this model has none "
                             "(use stop_token_ids)")
        if params.logit_bias and params.logit_bias[-1][0] >= vocab:
            raise ValueError(f"sampling_params.logit_bias: token id {params.logit_bias[-1][0]} is not in [0, {vocab})")
        req = Request(rid=rid or f"req-{next(self._ids)}", prompt_ids=list(input_ids), params=params,
                      stop_ids=self._stop_ids(params))
        if params.grammar is not None:
            req.grammar = self._grammars().matcher(*params.grammar)
        if params.sampling_seed is not None:
            req.generator = torch.Generator(device=self.memory.req_to_token.device).manual_seed(params.sampling_seed)
        need = self.scheduler.worst_case_tokens(len(input_ids), params.max_new_tokens)
        if need > self.memory.capacity:
            raise ValueError(f"request needs {need} KV slots; the KV cache holds {self.memory.capacity}")
        return req

    def _grammars(self):
        """The grammar compiler of this engine's tokenizer (built on the first structured request)."""
        if self._grammar_backend is None:
            from specdec.engine.grammar import GrammarBackend

            eos = self._stop_ids(SamplingParams())  # EOS: what a finished grammar allows
            self._grammar_backend = GrammarBackend(self.tokenizer, self.target_model.config.vocab_size, sorted(eos))
        return self._grammar_backend

    def add_request(self, req: Request) -> None:
        self.scheduler.add(req)

    def abort(self, rid: str) -> Request | None:
        return self.scheduler.abort(rid)

    def step(self) -> list[Request]:
        return self.scheduler.step()

    def generate(self, prompt: str | list[str] | None = None, sampling_params: dict | list[dict] | None = None,
                 input_ids: list[int] | list[list[int]] | None = None) -> dict | list[dict]:
        """Run requests to completion; one dict (``output_ids``, ``text``, ``meta_info``) each."""
        single = isinstance(prompt, str) or (input_ids is not None and input_ids and isinstance(input_ids[0], int))
        prompts = [prompt] if isinstance(prompt, str) else prompt
        ids = [input_ids] if single and input_ids is not None else input_ids
        n = len(prompts) if prompts is not None else len(ids or [])
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * n
        if len(params) != n:
            raise ValueError(f"got {len(params)} sampling_params for {n} prompts")
        reqs = [self.make_request(prompts[i] if prompts is not None else None,
                                  ids[i] if ids is not None else None, params[i]) for i in range(n)]
        for req in reqs:
            self.add_request(req)
        while any(not r.finished for r in reqs):
            self.step()
        if not any(not r.finished for r in self.scheduler.running):
            self.scheduler.drain()  # the step launched past the last request's end holds its KV
        results = [r.result(self.tokenizer) for r in reqs]
        return results[0] if single else results
