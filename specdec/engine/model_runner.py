"""ModelRunner: runs the target model over one ForwardBatch (the host side of specdec.host).

With CUDA graphs captured (``capture_cuda_graphs``), plain decode batches and the worker's
TARGET_VERIFY batches (logits in the model dtype: ``ForwardBatch.logits_dtype`` None) replay a
graph per padded batch size. Each graph also takes the argmax of its logits
(``LogitsOutput.greedy_ids``): a greedy step then launches nothing between the graph and its tokens'
copy. Padding requests read nothing (prefix 0) and write their K/V into ``pad_slot``, a KV slot the
allocator never hands out. A backend that plans on the host (FlashInfer) is planned from the
batch's host lengths before each replay; a batch without them runs eagerly.

A prefill (EXTEND) forward of one token a request (its prompt cached but for the last token) replays
a graph of its own where the backend plans it apart from a decode step (triton: each row over its own
list, whatever the batch; up to ONE_TOKEN_PREFILL_GRAPH_MAX_BS requests, the rest eagerly), else the
decode graph. With ``capture_prefill_graphs``, any other prefill of up to
``--piecewise-cuda-graph-max-tokens`` tokens replays the model body as pieces between its attention
calls, which run eagerly (``specdec.cuda_graph.piecewise``); its logits are computed eagerly after.
Anything else (longer prefills, batches past the largest captured size) runs eagerly.
"""

from __future__ import annotations

import torch

from specdec.attention import KVCache
from specdec.attention.base import StaticPlan
from specdec.cuda_graph import CudaGraphRunner, StaticInput, padded_lengths
from specdec.cuda_graph.piecewise import PiecewiseGraphRunner
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode, LogitsOutput
from specdec.models.ops.topk import argmax

# one-token prefills (cached prompts admitted together) replay their own graphs up to this many requests:
# such groups are small, and each captured size costs startup time and graph memory
ONE_TOKEN_PREFILL_GRAPH_MAX_BS = 32


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, attn_backend) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.attn_backend = attn_backend
        cfg = model.config
        self.hidden_size = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        self.aux_hidden_layers = getattr(model, "aux_hidden_layers", None) or None
        # (forward_mode, capture_hidden_mode, tokens per request) -> captured runner
        self.graphs: dict[tuple[ForwardMode, CaptureHiddenMode, int], CudaGraphRunner] = {}
        self.graph_slot_tokens: torch.Tensor | None = None  # where the graphs record their tokens
        # prefill forwards' piecewise graphs, for EXTEND batches that capture ``prefill_hidden`` (None: eager)
        self.prefill_graphs: PiecewiseGraphRunner | None = None
        self.prefill_hidden = CaptureHiddenMode.NULL

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.lm_head_weight

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        graph = self._graph_for(batch)
        if graph is not None:
            return self._replay(graph, batch)
        if batch.slot_tokens is not None:
            batch.slot_tokens[batch.out_cache_loc] = batch.input_ids.to(torch.int64)  # (no kernel if int64)
        self.attn_backend.init_forward_metadata(batch)
        if self._pieces_for(batch):
            def attend(q, k, v, layer):
                return self.attn_backend.forward(q, k, v, layer, batch)

            return self.model.forward_head(*self.prefill_graphs(batch.input_ids, batch.positions, attend), batch)
        return self.model(batch)

    def _pieces_for(self, batch: ForwardBatch) -> bool:
        """Whether ``batch`` replays the piecewise prefill graphs."""
        return (self.prefill_graphs is not None and batch.forward_mode == ForwardMode.EXTEND
                and batch.capture_hidden_mode == self.prefill_hidden and self.prefill_graphs.can_run(batch.num_tokens))

    # ------------------------------------------------------------ CUDA graphs
    @torch.inference_mode()
    def capture_cuda_graphs(
        self,
        *,
        batch_sizes: list[int],
        req_to_token: torch.Tensor,
        pad_slot: int,
        max_seq_len: int,
        decode_hidden: CaptureHiddenMode,
        verify_sizes: dict[int, list[int]],
        slot_tokens: torch.Tensor | None = None,
        pool=None,
        use_graphs: bool = True,
    ) -> int:
        """Capture DECODE graphs at ``batch_sizes`` (and, for a backend that plans them apart, one-token
        prefill graphs at those up to ONE_TOKEN_PREFILL_GRAPH_MAX_BS) and a TARGET_VERIFY graph per tree
        size of ``verify_sizes`` (tokens a request -> its batch sizes); returns their bytes. ``slot_tokens``:
        the graphs record their input tokens there (``ForwardBatch.slot_tokens``) and replay only
        for batches that ask for exactly that."""
        device = self.kv_cache.device
        self.graph_slot_tokens = slot_tokens
        kinds = [(ForwardMode.DECODE, decode_hidden, 1, batch_sizes)]
        one_token_sizes = [b for b in batch_sizes if b <= ONE_TOKEN_PREFILL_GRAPH_MAX_BS]
        if self.attn_backend.prefill_apart_from_decode and one_token_sizes:  # one-token prefills (``_graph_for``)
            kinds.append((ForwardMode.EXTEND, decode_hidden, 1, one_token_sizes))
        kinds += [(ForwardMode.TARGET_VERIFY, CaptureHiddenMode.FULL, n, sizes) for n, sizes in verify_sizes.items()]
        total = 0
        for mode, hidden, tokens, sizes in kinds:
            runner = CudaGraphRunner(
                self._static_forward(mode, hidden, tokens, req_to_token, max_seq_len, slot_tokens),
                _target_inputs(tokens, pad_slot, with_tree=mode == ForwardMode.TARGET_VERIFY),
                sizes, device=device, pool=pool, use_graphs=use_graphs, name=f"target {mode.name.lower()}",
                prepare=self._host_planner(mode, tokens, max_seq_len) if self.attn_backend.plans_on_host else None,
            )
            runner.capture()
            total += runner.memory_bytes
            self.graphs[(mode, hidden, tokens)] = runner
        return total

    @torch.inference_mode()
    def capture_prefill_graphs(self, token_counts: list[int], *, hidden: CaptureHiddenMode, pool=None,
                               use_graphs: bool = True) -> int:
        """Capture piecewise graphs of prefill forwards of up to ``max(token_counts)`` tokens that
        capture ``hidden``; returns their bytes. ``use_graphs=False``: the same padded path, eager."""
        runner = PiecewiseGraphRunner(self._prefill_body(hidden), token_counts, device=self.kv_cache.device,
                                      use_graphs=use_graphs, pool=pool)
        runner.capture()
        self.prefill_graphs, self.prefill_hidden = runner, hidden
        return runner.memory_bytes

    def _prefill_body(self, hidden: CaptureHiddenMode):
        """The model body over a prefill's tokens, with the piecewise runner's stand-in attention."""
        empty = torch.zeros(0, dtype=torch.int64, device=self.kv_cache.device)

        def body(input_ids, positions, attention):
            return self.model.forward_body(ForwardBatch(
                forward_mode=ForwardMode.EXTEND, input_ids=input_ids, positions=positions, out_cache_loc=empty,
                req_pool_indices=empty, prefix_lens=empty, extend_lens=empty, req_to_token=None, kv_cache=None,
                attn_backend=attention, capture_hidden_mode=hidden))

        return body

    def release_cuda_graphs(self) -> None:
        """Destroy the captured graphs; forwards run eagerly from now on."""
        for runner in self.graphs.values():
            runner.release()
        self.graphs.clear()
        if self.prefill_graphs is not None:
            self.prefill_graphs.release()
            self.prefill_graphs = None

    def _static_forward(self, mode, hidden, tokens, req_to_token, max_seq_len, slot_tokens):
        logits_mode, logits_dtype = _graph_logits(mode)

        def forward(input_ids, positions, out_cache_loc, req_pool_indices, seq_lens, tree_mask=None):
            bs = req_pool_indices.shape[0]
            if slot_tokens is not None:  # in the graph: no launch of its own (padding rows: the padding slot)
                slot_tokens[out_cache_loc] = input_ids.to(torch.int64)
            batch = ForwardBatch(
                forward_mode=mode, input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc,
                req_pool_indices=req_pool_indices, prefix_lens=seq_lens,
                extend_lens=torch.full((bs,), tokens, dtype=torch.int64, device=seq_lens.device),
                req_to_token=req_to_token, kv_cache=self.kv_cache, attn_backend=self.attn_backend,
                logits_mode=logits_mode, logits_dtype=logits_dtype, capture_hidden_mode=hidden,
                tree_mask=tree_mask, static_max_seq_len=max_seq_len,
            )
            self.attn_backend.init_forward_metadata(batch)
            out = self.model(batch)
            logits = out.next_token_logits  # [bs * tokens, vocab]
            greedy = argmax(logits)  # [bs * tokens]
            return (logits, greedy) if out.hidden_states is None else (logits, greedy, out.hidden_states)

        return forward

    def _host_planner(self, mode: ForwardMode, tokens: int, max_seq_len: int):
        def prepare(padded: int, views: dict[str, torch.Tensor], prefix_lens: list[int] | None) -> None:
            self.attn_backend.plan_static(StaticPlan(
                mode, padded_lengths(prefix_lens, padded), q_len=tokens, own=tokens, max_seq_len=max_seq_len,
                device=self.kv_cache.device, tree_mask=views.get("tree_mask")))

        return prepare

    def _graph_for(self, batch: ForwardBatch) -> CudaGraphRunner | None:
        if not self.graphs or batch.output_rows is not None or batch.draft_ancestors is not None:
            return None
        if batch.slot_tokens is not self.graph_slot_tokens:  # the graphs record tokens there, or do not
            return None
        if self.attn_backend.plans_on_host and batch.prefix_lens_cpu is None:
            return None
        bs = batch.batch_size
        if bs == 0 or batch.num_tokens % bs:
            return None
        mode, hidden, tokens = batch.forward_mode, batch.capture_hidden_mode, batch.num_tokens // bs
        if mode == ForwardMode.EXTEND and tokens == 1:
            # one new token a request (a prompt cached up to its last token: a repeated prompt, a parallel
            # sample's twin) replays a graph, not eager attention between pieces: the one-token prefill's
            # own, or the decode step's where the backend plans both alike (with one token a request,
            # capturing every token's hidden state captures the last one's)
            hidden = min(hidden, CaptureHiddenMode.LAST)
            if not self.attn_backend.prefill_apart_from_decode:
                mode = ForwardMode.DECODE
        graph = self.graphs.get((mode, hidden, tokens))
        if graph is None or (batch.logits_mode, batch.logits_dtype) != _graph_logits(mode) or not graph.can_run(bs):
            return None
        return graph

    def _replay(self, graph: CudaGraphRunner, batch: ForwardBatch) -> LogitsOutput:
        inputs = dict(input_ids=batch.input_ids, positions=batch.positions, out_cache_loc=batch.out_cache_loc,
                      req_pool_indices=batch.req_pool_indices, seq_lens=batch.prefix_lens)
        if batch.forward_mode == ForwardMode.TARGET_VERIFY:
            inputs["tree_mask"] = batch.tree_mask
        outputs = graph(batch.batch_size, host=batch.prefix_lens_cpu, **inputs)
        return LogitsOutput(next_token_logits=outputs[0], greedy_ids=outputs[1],
                            hidden_states=outputs[2] if len(outputs) > 2 else None)


def _graph_logits(mode: ForwardMode) -> tuple[LogitsMode, torch.dtype | None]:
    """The logits a captured graph of ``mode`` returns: a verify's, every node's in the model dtype
    (the worker widens where it needs fp32); a decode's, each request's last in fp32."""
    if mode == ForwardMode.TARGET_VERIFY:
        return LogitsMode.ALL, None
    return LogitsMode.LAST, torch.float32


def _target_inputs(tokens: int, pad_slot: int, *, with_tree: bool) -> list[StaticInput]:
    """A padding request: token 0 at position 0, no prefix, K/V written to ``pad_slot``."""
    inputs = [
        StaticInput("input_ids", tokens, torch.int64),
        StaticInput("positions", tokens, torch.int64),
        StaticInput("out_cache_loc", tokens, torch.int64, pad_value=pad_slot),
        StaticInput("req_pool_indices", 1, torch.int64),
        StaticInput("seq_lens", 1, torch.int64),
    ]
    if with_tree:
        inputs.append(StaticInput("tree_mask", tokens * tokens, torch.bool, pad_value=True))
    return inputs
