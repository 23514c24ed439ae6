"""PiecewiseGraphRunner: a prefill forward's model body as CUDA graphs of the pieces between its
attention calls, captured per token count; attention itself runs eagerly between the pieces.

A prefill (EXTEND) forward has a different number of tokens every step, so it cannot replay one
graph, and run eagerly it pays the host for every launch: on an H200's host a 30-layer model's
prefill step took ~28 ms of launches for well under 1 ms of GPU work, about half the wall time of
serving 128 requests at once (SmolLM2-135M, 2026-11-28). Here every piece is captured for a set of
token counts (SGLang's and vLLM's piecewise graphs); a call pads its tokens to the next one::

    300 tokens, captured counts ... 256 384 512 ...         -> replay the 384-token pieces
    piece 0      embed, layer 0 up to q/k/v (copied into the static q/k/v rows)
    attention 0  eagerly, over the 300 real rows: the backend's own forward (it stores K/V and
                 reads the batch's metadata, planned once a forward), its output copied into
                 the static output rows that piece 1 reads
    piece 1      layer 0 from o_proj on, layer 1 up to q/k/v
    ...
    piece L      layer L-1 from o_proj on, the final norm (and the hidden streams a draft head reads)

The padding rows (300-383) hold earlier calls' token ids and positions (always valid ones) and
stale attention outputs; every op of a piece is row-wise, so they never touch the real rows, and
attention, K/V stores and the lm_head (``forward_head``, eager after the pieces) see only real
rows. The pieces of every token count share the static rows (sized for the largest count) and
one memory pool; they are captured largest first and never run at the same time.

The model provides ``forward_body(batch) -> (normed [T, H], hidden [T, F] | None)``; its layers
call ``batch.attn_backend.forward(q, k, v, layer, batch)`` once each. Without CUDA (or with
``use_graphs=False``) the same padded path runs eagerly, which is how the CPU tests check it.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Sequence

import torch

from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode


def default_token_counts(max_tokens: int) -> list[int]:
    """8, 16, 24, 32, then steps of about x1.5 (48, 64, 96, 128, 192, 256, ...) up to ``max_tokens``:
    at most a third of a replay's rows are padding past 32 tokens."""
    if max_tokens < 1:
        raise ValueError(f"--piecewise-cuda-graph-max-tokens={max_tokens}: expected >= 1")
    counts, n = [8, 16, 24, 32], 32
    while n < max_tokens:
        n = n * 3 // 2 if n & (n - 1) == 0 else n * 4 // 3  # 32 -> 48 -> 64 -> 96 -> 128 ...
        counts.append(n)
    return [c for c in counts if c < max_tokens] + [max_tokens]


@dataclasses.dataclass
class _Pieces:
    """One token count's capture: a graph per piece, the layer of each attention call between
    them, and the body's outputs (views of graph-owned memory)."""

    graphs: list[torch.cuda.CUDAGraph]
    layers: list
    outputs: tuple[torch.Tensor, torch.Tensor | None]


class _Splitter:
    """Stands in for the attention backend while the body runs over the static rows: each call
    copies q/k/v into the static rows and returns the static output rows. Capturing, it also ends
    the piece being captured and begins the next; eager (``backend`` given), it runs attention
    over the real rows itself."""

    def __init__(self, runner: "PiecewiseGraphRunner", *, pool=None, backend=None, batch=None) -> None:
        self.runner = runner
        self.pool = pool
        self.backend = backend
        self.batch = batch
        self.layers: list = []
        self.graphs: list[torch.cuda.CUDAGraph] = []

    def begin_piece(self) -> None:
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=self.pool)
        self.graphs.append(graph)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer, batch: ForwardBatch) -> torch.Tensor:
        rows = q.shape[0]
        sq, sk, sv, out = self.runner.static_rows(q, k, v)
        sq[:rows].copy_(q)
        sk[:rows].copy_(k)
        sv[:rows].copy_(v)
        self.layers.append(layer)
        if self.pool is not None:  # capturing: this piece ends here, the next begins
            self.graphs[-1].capture_end()
            self.begin_piece()
        elif self.backend is not None:  # eager: attention over the real rows now
            self.runner.attend(self.backend, layer, self.batch)
        return out[:rows]


class PiecewiseGraphRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        token_counts: Sequence[int],
        *,
        hidden_mode: CaptureHiddenMode,
        device: torch.device | str,
        use_graphs: bool = True,
        pool=None,
    ) -> None:
        if not token_counts or min(token_counts) < 1:
            raise ValueError(f"piecewise CUDA graphs: token counts must be non-empty and >= 1, got {list(token_counts)}")
        self.model = model
        self.token_counts = sorted(set(int(t) for t in token_counts))
        self.max_tokens = self.token_counts[-1]
        self.hidden_mode = hidden_mode
        self.device = torch.device(device)
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.pool = pool
        # [max_tokens] the body's inputs; padding rows keep valid ids / positions (zeros at first)
        self.input_ids = torch.zeros(self.max_tokens, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_tokens, dtype=torch.int64, device=self.device)
        # [max_tokens, features] attention's inputs and output, shared by every layer and count
        self._qkv_out: tuple[torch.Tensor, ...] | None = None
        self._pieces: dict[int, _Pieces] = {}
        self._real_rows = 0  # the real rows of the call in progress
        self.memory_bytes = 0
        self.num_calls = 0

    # ------------------------------------------------------------------ sizes
    def can_run(self, batch: ForwardBatch) -> bool:
        return (batch.forward_mode == ForwardMode.EXTEND and batch.capture_hidden_mode == self.hidden_mode
                and 1 <= batch.num_tokens <= self.max_tokens)

    def padded_count(self, tokens: int) -> int:
        return self.token_counts[bisect.bisect_left(self.token_counts, tokens)]

    # ------------------------------------------------------------ static rows
    def static_rows(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(q, k, v, out) static rows, made at the first call (the widths are the layers')."""
        if self._qkv_out is None:
            self._qkv_out = tuple(torch.zeros(self.max_tokens, t.shape[1], dtype=t.dtype, device=self.device)
                                  for t in (q, k, v, q))
        widths = tuple(t.shape[1] for t in (q, k, v))
        if widths != tuple(t.shape[1] for t in self._qkv_out[:3]):
            raise ValueError(f"piecewise CUDA graphs: every layer's q/k/v must have the same widths, got {widths}")
        return self._qkv_out

    def attend(self, backend, layer, batch: ForwardBatch) -> None:
        """One layer's attention over the real rows, written into the static output rows."""
        rows = self._real_rows
        q, k, v, out = self._qkv_out
        out[:rows].copy_(backend.forward(q[:rows], k[:rows], v[:rows], layer, batch))

    def _body_batch(self, tokens: int, splitter: _Splitter) -> ForwardBatch:
        """The batch the body reads under capture: the static inputs' first ``tokens`` rows."""
        empty = torch.zeros(0, dtype=torch.int64, device=self.device)
        return ForwardBatch(
            forward_mode=ForwardMode.EXTEND, input_ids=self.input_ids[:tokens], positions=self.positions[:tokens],
            out_cache_loc=empty, req_pool_indices=empty, prefix_lens=empty, extend_lens=empty,
            req_to_token=None, kv_cache=None, attn_backend=splitter, capture_hidden_mode=self.hidden_mode)

    # ---------------------------------------------------------------- capture
    def capture(self) -> None:
        """Warm up and capture every token count's pieces, largest first."""
        if not self.use_graphs:
            return
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        pool = self.pool if self.pool is not None else torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for tokens in reversed(self.token_counts):
                # NOTE: eager runs first, so that Triton compiles and cuBLAS takes its workspace outside the capture
                for _ in range(2):
                    self.model.forward_body(self._body_batch(tokens, _Splitter(self)))
                splitter = _Splitter(self, pool=pool)
                splitter.begin_piece()
                outputs = self.model.forward_body(self._body_batch(tokens, splitter))
                splitter.graphs[-1].capture_end()
                self._pieces[tokens] = _Pieces(splitter.graphs, splitter.layers, outputs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self.memory_bytes = torch.cuda.memory_allocated(self.device) - before

    def release(self) -> None:
        for pieces in self._pieces.values():
            for graph in pieces.graphs:
                graph.reset()
        self._pieces.clear()
        self.use_graphs = False
        self.memory_bytes = 0

    # ----------------------------------------------------------------- replay
    def __call__(self, batch: ForwardBatch, backend) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``model.forward_body(batch)`` through the pieces of the smallest count >= its tokens;
        ``backend`` (its metadata already planned for ``batch``) computes attention. Returns views
        valid until the next call."""
        if not self.can_run(batch):
            raise ValueError(f"piecewise CUDA graphs: cannot run a {batch.forward_mode.name} batch of "
                             f"{batch.num_tokens} tokens (captured up to {self.max_tokens})")
        rows = batch.num_tokens
        padded = self.padded_count(rows)
        self.num_calls += 1
        self._real_rows = rows
        self.input_ids[:rows].copy_(batch.input_ids)
        self.positions[:rows].copy_(batch.positions)
        if self.use_graphs:
            pieces = self._pieces.get(padded)
            if pieces is None:
                raise RuntimeError("piecewise CUDA graphs: call capture() before replaying")
            for i, graph in enumerate(pieces.graphs):
                graph.replay()
                if i < len(pieces.layers):
                    self.attend(backend, pieces.layers[i], batch)
            normed, hidden = pieces.outputs
        else:
            normed, hidden = self.model.forward_body(
                self._body_batch(padded, _Splitter(self, backend=backend, batch=batch)))
        return normed[:rows], None if hidden is None else hidden[:rows]
