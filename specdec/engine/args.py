"""``EngineArgs``: every engine flag, once — the engine, the server, the benchmarks and the trainer
read it, and ``specdec.cli`` turns its fields into command-line flags.

Field ``foo_bar`` is the flag ``--foo-bar`` (SGLang's names); a field's metadata carries its help
text and, where the flag differs from the plain form, how argparse should take it. Fields whose
metadata says ``cli=False`` are engine keywords without a flag (in-process use and benchmarks).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specdec.config import DRAFT_KV_CACHE_DTYPES

# NOTE: no torch here: the HTTP benchmark client imports this module's ``flag`` without loading torch


def flag(help: str, **argparse_options: Any) -> dict:
    """Field metadata: the flag's help text plus argparse options (choices, action, flag name...)."""
    return {"help": help, **argparse_options}


MODEL = "model and engine"
MEMORY = "KV cache and scheduling"
SPEC = "speculative decoding"
# --chunked-prefill-size when unset (SGLang's on an 80 GB GPU); -1 turns chunking off
DEFAULT_CHUNKED_PREFILL_SIZE = 8192
# while requests decode, new ones are prefilled once they are this share of the decoding ones, or
# after this many decode steps (``Scheduler._prefill_turn``): up to 10 decoding requests, at once
DEFAULT_WAITING_SERVED_RATIO = 0.1
DEFAULT_MAX_WAITING_TOKENS = 16
# --max-running-requests when unset. On a GPU 256, each batch size replayed as a CUDA graph (vLLM
# 0.26 admits 1024 on an H100 / H200 and 256 elsewhere, with graphs up to 512; more here would
# lengthen start-up, the graphs' capture and the adaptive profile, for batches a 135M-8B model
# rarely reaches); on CPU, where a step costs in proportion to its batch, fewer
DEFAULT_MAX_RUNNING_REQUESTS = {"cuda": 256, "cpu": 64}
AUTO = "auto"


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineArgs:
    """The reference engine's settings, named after SGLang's server flags (``Engine(**kwargs)``)."""

    # ------------------------------------------------------------------ model and engine
    model_path: str | None = dataclasses.field(default=None, metadata=flag(
        "target model: HF directory (config.json + safetensors), llama2.c .bin or .gguf", group=MODEL))
    load_format: str = dataclasses.field(default="auto", metadata=flag(
        "auto: read the weights; dummy: read only the configs of --model-path and the draft head, random "
        "weights of their shapes (benchmarks; SGLang's and vLLM's name)", group=MODEL, choices=["auto", "dummy"]))
    device: str = dataclasses.field(default=AUTO, metadata=flag(
        "auto (cuda when a GPU is visible, else cpu), cpu or cuda[:N]", group=MODEL))
    dtype: Any = dataclasses.field(default="auto", metadata=flag(  # a name or a torch.dtype
        "auto, float32, bfloat16, float16 (auto: bf16 on GPU, fp32 on CPU)", group=MODEL, type=str))
    attention_backend: str = dataclasses.field(default=AUTO, metadata=flag(
        "attention implementation: auto (triton on CUDA, so every decode step replays CUDA graphs, sliding-window "
        "models' too; torch_native otherwise) or one available here: {backends}", group=MODEL))
    prefill_attention_backend: str | None = dataclasses.field(default=None, metadata=flag(
        "attention for prefill and chunked-prefill forwards (default: --attention-backend), e.g. fa4", group=MODEL))
    decode_attention_backend: str | None = dataclasses.field(default=None, metadata=flag(
        "attention for decode, draft, verify and draft-extend forwards (default: --attention-backend)", group=MODEL))
    page_size: int = dataclasses.field(default=1, metadata=flag("KV cache page size in tokens", group=MODEL))
    max_total_tokens: int | None = dataclasses.field(default=None, metadata=flag(
        "KV cache capacity in tokens", group=MODEL))
    max_running_requests: int | None = dataclasses.field(default=None, metadata=flag(
        "requests decoded together (default: 256 on CUDA, 64 on CPU)", group=MODEL))
    context_length: int | None = dataclasses.field(default=None, metadata=flag(
        "longest prompt + output", group=MODEL))
    random_seed: int = dataclasses.field(default=0, metadata=flag("seed of the engine's sampler", group=MODEL))
    tp_size: int = dataclasses.field(default=1, metadata=flag(
        "tensor-parallel ranks: the engine starts tp_size - 1 worker processes (NCCL on CUDA, rank r on "
        "cuda:r; gloo on CPU)", group=MODEL))
    nnodes: int = dataclasses.field(default=1, metadata=flag(
        "nodes the --tp-size ranks are spread over evenly (node k: ranks k*tp/nnodes ...; rank r on its node's "
        "cuda:r %% (tp/nnodes)); node 0 serves HTTP, every other node runs specdec serve with the same flags "
        "and its --node-rank", group=MODEL))
    node_rank: int = dataclasses.field(default=0, metadata=flag(
        "this node's index among --nnodes (0 serves HTTP; k > 0 runs its ranks and follows node 0)", group=MODEL))
    dist_init_addr: str | None = dataclasses.field(default=None, metadata=flag(
        "node 0's HOST:PORT, reachable from every node: torch.distributed's store listens there and rank 0's "
        "control channel at PORT+1 (required with --nnodes > 1; default 127.0.0.1 and free ports)", group=MODEL))
    dist_timeout: int = dataclasses.field(default=600, metadata=flag(
        "seconds every node has to join (node 0 then fails naming the nodes missing; another node gives up "
        "reaching node 0)", group=MODEL))
    disable_custom_all_reduce: bool = dataclasses.field(default=False, metadata=flag(
        "all-reduce every message with NCCL (SGLang's flag). By default, under --tp-size > 1 on one host's GPUs, "
        "messages up to 1 MiB (a decode step's bs x hidden) are summed by a one-shot kernel over peer memory "
        "(torch's symmetric memory, CUDA IPC, no NVLink multicast), inside CUDA graphs too", group=MODEL))
    cuda_graph_max_bs: int | None = dataclasses.field(default=None, metadata=flag(
        "largest decode batch replayed as a CUDA graph (default: --max-running-requests, so every batch the "
        "engine runs replays one); below --max-running-requests it bounds the running batch too: a decode "
        "batch never runs eagerly", group=MODEL))
    cuda_graph_bs: tuple[int, ...] | None = dataclasses.field(default=None, metadata=flag(
        "the decode batch sizes replayed as CUDA graphs (default: 1-8, then steps of 8 to 64, then of 32, "
        "up to --cuda-graph-max-bs)", group=MODEL, type=int, nargs="+", metavar="BS"))
    disable_cuda_graph: bool = dataclasses.field(default=False, metadata=flag(
        "run every forward eagerly (CUDA graphs are used on CUDA with the triton backend)", group=MODEL))
    disable_piecewise_cuda_graph: bool = dataclasses.field(default=False, metadata=flag(
        "run prefill forwards eagerly (SGLang's flag). By default on CUDA a prefill of up to "
        "--piecewise-cuda-graph-max-tokens tokens replays CUDA graphs of the model's pieces between attention "
        "calls, captured per token count (attention runs eagerly between them): a few launches a layer "
        "instead of a dozen", group=MODEL))
    piecewise_cuda_graph_max_tokens: int | None = dataclasses.field(default=None, metadata=flag(
        "largest prefill, in tokens, that replays piecewise CUDA graphs (default: --chunked-prefill-size, at "
        "most 8192)", group=MODEL))
    piecewise_cuda_graph_tokens: tuple[int, ...] | None = dataclasses.field(default=None, metadata=flag(
        "the token counts captured (default: 8, 16, 24, 32, then steps of about x1.5 up to "
        "--piecewise-cuda-graph-max-tokens; given, those up to it where it is given too); a prefill is padded to "
        "the next one", group=MODEL, type=int, nargs="+", metavar="TOKENS"))
    # NOTE: None = the engine decides (on by default on CUDA); the flag can only turn it off
    overlap_schedule: bool | None = dataclasses.field(default=None, metadata=flag(
        "read each decode step before launching the next (overlap scheduling, the default on CUDA, launches "
        "step t+1 from step t's device-resident outputs while the host reads step t)", group=MODEL,
        flag="--disable-overlap-schedule", action="store_const", const=False))
    enable_deterministic_inference: bool = dataclasses.field(default=False, metadata=flag(
        "batch-invariant kernels (SGLang's flag): a row's result depends on neither the batch nor the draft "
        "tree, so greedy speculative output equals plain decoding bit for bit in bf16 too; attention one query "
        "row at a time over its own KV in fixed position splits (triton, torch_native), fixed-tiling GEMMs, fp32 "
        "logits; CUDA graphs stay on",
        group=MODEL))

    # ------------------------------------------------------------------ KV cache and scheduling
    disable_radix_cache: bool = dataclasses.field(default=False, metadata=flag(
        "no prefix cache: every request prefills its whole prompt (by default a radix tree over token ids "
        "keeps finished requests' target and draft KV pages for later requests with the same prefix)",
        group=MEMORY))
    chunked_prefill_size: int | None = dataclasses.field(default=None, metadata=flag(
        f"most prompt tokens one prefill step computes; a longer prompt is prefilled in chunks, alternating "
        f"with decode steps (default {DEFAULT_CHUNKED_PREFILL_SIZE}; -1: no chunking)", group=MEMORY))
    schedule_conservativeness: float = dataclasses.field(default=1.0, metadata=flag(
        "how much KV admission promises each request's output (> 1: fewer requests at once, fewer "
        "retractions when the KV pool runs full)", group=MEMORY))
    waiting_served_ratio: float = dataclasses.field(default=DEFAULT_WAITING_SERVED_RATIO, metadata=flag(
        "while requests decode, new requests are prefilled once they number at least this times the decoding "
        "ones, or once the oldest has waited --max-waiting-tokens decode steps: fewer, larger prefill steps at "
        f"large batches (default {DEFAULT_WAITING_SERVED_RATIO}; 0: at the first chance; TGI's flag)", group=MEMORY))
    max_waiting_tokens: int = dataclasses.field(default=DEFAULT_MAX_WAITING_TOKENS, metadata=flag(
        "the most decode steps a new request waits for others to be prefilled with "
        f"(default {DEFAULT_MAX_WAITING_TOKENS}; TGI's flag)", group=MEMORY))
    enable_decode_admission: bool = dataclasses.field(default=False, metadata=flag(
        "while requests decode, a new request whose prompt the prefix cache holds but for its last token "
        "joins their next decode step instead of a prefill step (plain decoding, EAGLE, EAGLE-3; on the H200 "
        "it removed the prefill steps but left throughput unchanged and the time to first token 2-24 ms "
        "longer, hence off)", group=MEMORY))

    # ------------------------------------------------------------------ speculative decoding
    speculative_algorithm: str | None = dataclasses.field(default=None, metadata=flag(
        "turn on speculative decoding with an EAGLE or EAGLE-3 draft head, NGRAM (no draft model: drafts "
        "looked up in each request's own prompt and output), or STANDALONE (a small causal LM of the target's "
        "tokenizer drafts)", group=SPEC,
        choices=["EAGLE", "EAGLE3", "NGRAM", "STANDALONE"]))
    speculative_draft_model_path: str | None = dataclasses.field(default=None, metadata=flag(
        "draft head directory (SGLang/EAGLE format); STANDALONE: the draft LM (any model path --model-path takes)",
        group=SPEC))
    speculative_num_steps: int | None = dataclasses.field(default=None, metadata=flag(
        "draft tree depth (default 5)", group=SPEC))
    speculative_eagle_topk: int | None = dataclasses.field(default=None, metadata=flag(
        "branching per draft step (default 4)", group=SPEC))
    speculative_num_draft_tokens: int | None = dataclasses.field(default=None, metadata=flag(
        "tree nodes verified per request, root included (default 8; steps+1 when topk=1; NGRAM: "
        "--speculative-ngram-max-match-window-size)", group=SPEC))
    speculative_accept_threshold_single: float = dataclasses.field(default=1.0, metadata=flag(
        "accept a draft token whose target probability reaches this (1.0 = lossless)", group=SPEC))
    speculative_accept_threshold_acc: float = dataclasses.field(default=1.0, metadata=flag(
        "divide the accumulated acceptance probability by this (1.0 = lossless)", group=SPEC))
    speculative_token_map: str | None = dataclasses.field(default=None, metadata=flag(
        "reduced draft vocabulary file (EAGLE-2 style)", group=SPEC))
    speculative_draft_model_quantization: str | None = dataclasses.field(default=None, metadata=flag(
        "fp8: give the draft head's linear weights FP8 copies (e4m3, a scale per output row) that its GEMMs "
        "read on a GPU: up to 16 tokens with 16-bit activations, past that (where it pays) with FP8 activations "
        "on FP8 tensor cores; speculation stays lossless, acceptance may change slightly", group=SPEC,
        choices=["fp8"]))
    speculative_draft_kv_cache_dtype: str = dataclasses.field(default="auto", metadata=flag(
        "the draft head's KV cache: auto (the head's dtype) or fp8_e4m3 (e4m3 values at scale 1, saturating; "
        "the attention widens them to the queries' dtype): half the bytes its attention reads; speculation "
        "stays lossless, acceptance may change slightly (triton and torch_native attention)", group=SPEC,
        choices=list(DRAFT_KV_CACHE_DTYPES)))
    speculative_draft_tp: str = dataclasses.field(default="auto", metadata=flag(
        "an EAGLE / EAGLE-3 head under --tp-size > 1: shard its layer over the ranks as the target's are (heads, "
        "MLP, its own lm_head; two all-reduces and a gather per draft forward), or replicate it whole on every "
        "rank (no collectives; tp times the weight bytes read). auto: shard when its attention heads and "
        "intermediate size divide by --tp-size and its hidden size is at least 4096 (an 8B model's head: "
        "measured 1-5 %% faster sharded on two H200s); replicate smaller heads, whose forwards are too short "
        "to pay for the collectives. A STANDALONE draft LM is always replicated", group=SPEC,
        choices=["auto", "shard", "replicate"]))
    speculative_batch_size_threshold: int | None = dataclasses.field(default=None, metadata=flag(
        "decode without speculation while more than this many requests run (the draft cache stays in step); "
        "default: always speculate", group=SPEC))
    speculative_adaptive: str = dataclasses.field(default="auto", metadata=flag(
        "adaptive speculation: each decode step picks the tree shape within the steps / topk / draft-tokens "
        "bounds (chains and the configured tree), or no speculation, that commits the most tokens per second "
        "at its batch size and context, from step costs measured at start-up and acceptance learnt online. "
        "auto: on on CUDA with CUDA graphs", group=SPEC, choices=["auto", "on", "off"]))
    speculative_adaptive_max_verify_rows: int = dataclasses.field(default=512, metadata=flag(
        "adaptive speculation captures a shape's verify and draft graphs, and chooses the shape, only at batch "
        "sizes whose verify has at most this many rows (batch size x draft tokens); 0: every captured batch "
        "size", group=SPEC))
    speculative_adaptive_profile: str | None = dataclasses.field(default=None, metadata=flag(
        "JSON file of measured step costs for adaptive speculation: read when it exists, else measured at "
        "start-up and written there (default: a cache per device and model under ~/.cache/specdec)", group=SPEC))
    # NGRAM only (SGLang's names; None: SGLang's default, so that a flag given without NGRAM is refused)
    speculative_ngram_min_match_window_size: int | None = dataclasses.field(default=None, metadata=flag(
        "NGRAM: shortest n-gram of the request's latest tokens matched against its earlier ones (default 1)",
        group=SPEC))
    speculative_ngram_max_match_window_size: int | None = dataclasses.field(default=None, metadata=flag(
        "NGRAM: longest n-gram matched; the longest that matches drafts (default 12)", group=SPEC))
    speculative_ngram_min_bfs_breadth: int | None = dataclasses.field(default=None, metadata=flag(
        "NGRAM: draft-tree children of the root for the longest match (default 1)", group=SPEC))
    speculative_ngram_max_bfs_breadth: int | None = dataclasses.field(default=None, metadata=flag(
        "NGRAM: draft-tree children of the root for the shortest match; 1 drafts chains (default 10). A "
        "BFS-breadth, match-type or cache flag drafts on the host, each lookup reading the step before; "
        "without them NGRAM drafts chains on the device", group=SPEC))
    speculative_ngram_match_type: str | None = dataclasses.field(default=None, metadata=flag(
        "NGRAM: BFS (children by recency) or PROB (by frequency, nodes by path probability) (default BFS)",
        group=SPEC, choices=["BFS", "PROB"]))
    speculative_ngram_branch_length: int | None = dataclasses.field(default=None, metadata=flag(
        "NGRAM: longest window of a finished request the cross-request cache stores (default 18)", group=SPEC))
    speculative_ngram_capacity: int | None = dataclasses.field(default=None, metadata=flag(
        "NGRAM: tokens the cross-request cache of finished requests holds, LRU (default: no cache)", group=SPEC))
    # benchmark-only: commit a drawn number of tokens per verify step (bench --synthetic)
    speculative_simulate_accept_length: float | None = dataclasses.field(default=None, metadata=flag(
        "simulated mean committed tokens per verify step (benchmarks only)", group=SPEC, cli=False))
    # benchmark-only: draw each step's accepted path from an acceptance model by depth, parent rank and rank (JSON)
    speculative_simulate_acceptance_model: str | None = dataclasses.field(default=None, metadata=flag(
        "acceptance model JSON, or draft trace .npz, for simulated acceptance (benchmarks only)", group=SPEC,
        cli=False))

    def __post_init__(self) -> None:
        if self.device == AUTO:
            object.__setattr__(self, "device", _visible_device())
        if self.max_running_requests is None:
            kind = "cuda" if str(self.device).startswith("cuda") else "cpu"
            object.__setattr__(self, "max_running_requests", DEFAULT_MAX_RUNNING_REQUESTS[kind])
        for name in ("page_size", "max_running_requests", "tp_size", "nnodes", "dist_timeout"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)}: expected >= 1")
        for name in ("max_total_tokens", "context_length", "cuda_graph_max_bs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')}={value}: expected >= 1")
        self._check_nodes()
        if self.speculative_draft_tp == "shard" and self.speculative_algorithm in ("NGRAM", "STANDALONE"):
            raise ValueError(f"--speculative-draft-tp shard: {self.speculative_algorithm} has no draft head to shard")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size < 1 \
                and self.chunked_prefill_size != -1:
            raise ValueError(f"--chunked-prefill-size={self.chunked_prefill_size}: expected >= 1, or -1 (no chunking)")
        if self.speculative_adaptive_max_verify_rows < 0:
            raise ValueError(f"--speculative-adaptive-max-verify-rows={self.speculative_adaptive_max_verify_rows}: "
                             "expected >= 0 (0: no limit)")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"--load-format={self.load_format!r}: choose auto or dummy")
        if not self.schedule_conservativeness > 0:
            raise ValueError(f"--schedule-conservativeness={self.schedule_conservativeness}: expected > 0")
        if not 0 <= self.waiting_served_ratio < float("inf"):
            raise ValueError(f"--waiting-served-ratio={self.waiting_served_ratio}: expected a number >= 0")
        if self.max_waiting_tokens < 0:
            raise ValueError(f"--max-waiting-tokens={self.max_waiting_tokens}: expected >= 0")
        if self.piecewise_cuda_graph_max_tokens is not None and self.piecewise_cuda_graph_max_tokens < 1:
            raise ValueError(f"--piecewise-cuda-graph-max-tokens={self.piecewise_cuda_graph_max_tokens}: expected >= 1")
        if self.piecewise_cuda_graph_tokens is not None:
            counts = tuple(sorted(set(self.piecewise_cuda_graph_tokens)))
            most = self.piecewise_cuda_graph_max_tokens
            if not counts or counts[0] < 1 or (most is not None and counts[0] > most):
                raise ValueError(f"--piecewise-cuda-graph-tokens={list(self.piecewise_cuda_graph_tokens)}: "
                                 "expected token counts >= 1" + (f", some up to {most} "
                                 "(--piecewise-cuda-graph-max-tokens)" if most is not None else ""))
            object.__setattr__(self, "piecewise_cuda_graph_tokens", counts)
        if self.cuda_graph_bs is not None:
            sizes = tuple(sorted(set(self.cuda_graph_bs)))
            if not sizes or sizes[0] < 1 or sizes[-1] > self.max_running_requests:
                raise ValueError(f"--cuda-graph-bs={list(self.cuda_graph_bs)}: expected batch sizes in "
                                 f"1..--max-running-requests ({self.max_running_requests})")
            object.__setattr__(self, "cuda_graph_bs", sizes)

    def _check_nodes(self) -> None:
        if self.tp_size % self.nnodes:
            raise ValueError(f"--nnodes {self.nnodes} does not divide --tp-size {self.tp_size}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank}: expected 0..{self.nnodes - 1} (--nnodes {self.nnodes})")
        if self.nnodes > 1 and self.dist_init_addr is None:
            raise ValueError(f"--nnodes {self.nnodes}: give --dist-init-addr HOST:PORT (node 0's address)")
        if self.dist_init_addr is not None:
            host, _, port = self.dist_init_addr.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65535:
                raise ValueError(f"--dist-init-addr {self.dist_init_addr!r}: expected HOST:PORT (PORT+1 is used too)")

    @property
    def prefill_chunk_tokens(self) -> int | None:
        """Most prompt tokens per prefill step (None: no limit)."""
        size = self.chunked_prefill_size or DEFAULT_CHUNKED_PREFILL_SIZE
        return None if size == -1 else size

    @property
    def prefill_graph_tokens(self) -> list[int]:
        """The token counts whose prefill forwards replay piecewise CUDA graphs (on CUDA; [] if off)."""
        from specdec.cuda_graph.piecewise import default_token_counts  # NOTE: imports torch

        if self.disable_piecewise_cuda_graph or self.disable_cuda_graph:
            return []
        if self.piecewise_cuda_graph_tokens is not None:
            most = self.piecewise_cuda_graph_max_tokens
            return [t for t in self.piecewise_cuda_graph_tokens if most is None or t <= most]
        most = self.piecewise_cuda_graph_max_tokens or min(self.prefill_chunk_tokens or 8192, 8192)
        return default_token_counts(most)

    @property
    def attention(self) -> str:
        """The attention backend name the engine builds: one, or ``PREFILL:DECODE`` (``specdec.attention.hybrid``);
        ``auto`` where the engine resolves it against the model (``with_attention_resolved``)."""
        prefill = self.prefill_attention_backend or self.attention_backend
        decode = self.decode_attention_backend or self.attention_backend
        return prefill if prefill == decode else f"{prefill}:{decode}"

    def with_attention_resolved(self) -> "EngineArgs":
        """``--attention-backend auto`` made concrete: triton on CUDA where it is installed (sliding-window
        models too, under CUDA graphs), torch_native otherwise. Backends named explicitly stay as given
        (the engine refuses one without sliding windows for such a model)."""
        if self.attention_backend != AUTO:
            return self
        return dataclasses.replace(self, attention_backend=_auto_attention(self.device))

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    def without_speculation(self) -> "EngineArgs":
        """The same engine decoding plainly: every speculative setting back to its default."""
        return dataclasses.replace(self, **{f.name: f.default for f in dataclasses.fields(self)
                                            if f.name.startswith("speculative_")})


def _visible_device() -> str:
    """``--device auto``: cuda when torch sees a GPU, else cpu (torch imported only here)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _auto_attention(device: str) -> str:
    if not str(device).startswith("cuda"):
        return "torch_native"
    from specdec.attention import available_backends

    return "triton" if "triton" in available_backends() else "torch_native"
