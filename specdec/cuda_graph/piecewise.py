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

The runner takes the body as ``body(input_ids [T], positions [T], attention) -> (normed [T, H],
hidden [T, F] | None)``, which runs the model with ``attention`` as its attention backend: each layer
calls ``attention.forward(q, k, v, layer, batch)`` once. A call passes the real attention as
``attend(q, k, v, layer) -> out``. Without CUDA (or with ``use_graphs=False``) the same padded path
runs eagerly, which is how the CPU tests check it.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Callable, Sequence

import torch

# (input_ids [T], positions [T], attention) -> (normed [T, H], hidden [T, F] or None)
Body = Callable[[torch.Tensor, torch.Tensor, object], tuple[torch.Tensor, torch.Tensor | None]]
# (q [T, Hq * D], k [T, Hkv * D], v [T, Hkv * D], layer) -> [T, Hq * D], over the real rows
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, object], torch.Tensor]


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
    the piece being captured and begins the next; eager (``attend`` given), it runs attention over
    the real rows itself."""

    def __init__(self, runner: "PiecewiseGraphRunner", *, pool=None, attend: Attend | None = None) -> None:
        self.runner = runner
        self.pool = pool
        self.attend = attend
        self.layers: list = []
        self.graphs: list[torch.cuda.CUDAGraph] = []

    def begin_piece(self) -> None:
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=self.pool)
        self.graphs.append(graph)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer, batch) -> torch.Tensor:
        rows = q.shape[0]
        sq, sk, sv, out = self.runner.static_rows(q, k, v)
        sq[:rows].copy_(q)
        sk[:rows].copy_(k)
        sv[:rows].copy_(v)
        self.layers.append(layer)
        if self.pool is not None:  # capturing: this piece ends here, the next begins
            self.graphs[-1].capture_end()
            self.begin_piece()
        elif self.attend is not None:  # eager: attention over the real rows now
            self.runner.attend(self.attend, layer)
        return out[:rows]


class PiecewiseGraphRunner:
    def __init__(
        self,
        body: Body,
        token_counts: Sequence[int],
        *,
        device: torch.device | str,
        use_graphs: bool = True,
        pool=None,
    ) -> None:
        if not token_counts or min(token_counts) < 1:
            raise ValueError(f"piecewise CUDA graphs: token counts must be non-empty and >= 1, got {list(token_counts)}")
        self.body = body
        self.token_counts = sorted(set(int(t) for t in token_counts))
        self.max_tokens = self.token_counts[-1]
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
    def can_run(self, tokens: int) -> bool:
        return 1 <= tokens <= self.max_tokens

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

    def attend(self, attend: Attend, layer) -> None:
        """One layer's attention over the real rows, written into the static output rows."""
        rows = self._real_rows
        q, k, v, out = self._qkv_out
        out[:rows].copy_(attend(q[:rows], k[:rows], v[:rows], layer))

    def _run_body(self, tokens: int, splitter: _Splitter) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The body over the static inputs' first ``tokens`` rows."""
        return self.body(self.input_ids[:tokens], self.positions[:tokens], splitter)

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
                    self._run_body(tokens, _Splitter(self))
                splitter = _Splitter(self, pool=pool)
                splitter.begin_piece()
                outputs = self._run_body(tokens, splitter)
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
    def __call__(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        attend: Attend,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # ([T, H], [T, F] or None): views valid until the next call
        """The body over these tokens through the pieces of the smallest count >= T; ``attend``
        computes each layer's attention over the real rows."""
        rows = input_ids.shape[0]
        if not self.can_run(rows):
            raise ValueError(f"piecewise CUDA graphs: cannot run {rows} tokens (captured 1..{self.max_tokens})")
        padded = self.padded_count(rows)
        self.num_calls += 1
        self._real_rows = rows
        self.input_ids[:rows].copy_(input_ids)
        self.positions[:rows].copy_(positions)
        if self.use_graphs:
            pieces = self._pieces.get(padded)
            if pieces is None:
                raise RuntimeError("piecewise CUDA graphs: call capture() before replaying")
            for i, graph in enumerate(pieces.graphs):
                graph.replay()
                if i < len(pieces.layers):
                    self.attend(attend, pieces.layers[i])
            normed, hidden = pieces.outputs
        else:
            normed, hidden = self._run_body(padded, _Splitter(self, attend=attend))
        return normed[:rows], None if hidden is None else hidden[:rows]
