"""CudaGraphRunner: one function captured once per batch size, replayed over static buffers.

The function takes tensors whose leading dimension is ``bs * rows_per_request`` and returns a
tuple of such tensors. For each captured batch size the runner owns views into one static
buffer per input (the largest size's buffer; smaller sizes use its first rows). A call with
``bs`` requests replays the smallest captured size ``>= bs``::

    bs = 5, captured sizes 1 2 4 8 16       -> replay the size-8 graph
    static buffer rows   [ r0 r1 r2 r3 r4 | p p p ]     real inputs, then each input's pad value
    outputs              [ o0 o1 o2 o3 o4 | x x x ]     the first 5 * rows_per_request are returned

An input is passed as a tensor, copied into its buffer's first rows, or as a writer: a function
that fills those rows itself (``writer(rows_view)``, e.g. an ``index_select(..., out=rows_view)``),
which saves the copy of an intermediate tensor. A caller that fills several inputs in one launch
writes into ``rows(name, bs)`` first and passes ``WRITTEN`` for them.

Pad values must make the padding requests harmless (e.g. a KV slot reserved for padding, a
prefix length of 0). ``prepare(padded_bs, views, host)``, when given, runs on the host after the
inputs are in place and before each replay (and before each size's capture, with ``host=None``):
the place for work that cannot live inside a graph, like a host-planned attention backend's plan;
``host`` is whatever the caller passed as ``host=``. Returned outputs are views of graph-owned memory: they are valid until the
same runner replays again. Without CUDA (or with ``use_graphs=False``) the function runs eagerly
on the same padded buffers, so the padding logic is the same code on every device.
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
from typing import Callable, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class StaticInput:
    """One argument of the captured function: a [bs * rows_per_request, *trailing] buffer."""

    name: str
    rows_per_request: int
    dtype: torch.dtype
    trailing: tuple[int, ...] = ()
    pad_value: int | float | bool = 0


def WRITTEN(rows: torch.Tensor) -> None:
    """The writer of an input whose rows the caller already filled (through ``rows``)."""


def default_batch_sizes(max_bs: int) -> list[int]:
    """1..8, then steps of 8 to 64, then of 32: SGLang's shape of the capture list, up to ``max_bs``."""
    if max_bs < 1:
        raise ValueError(f"--cuda-graph-max-bs={max_bs}: expected >= 1")
    sizes = list(range(1, 9)) + list(range(16, 65, 8)) + list(range(96, 1025, 32))
    return [s for s in sizes if s < max_bs] + [max_bs]


def padded_lengths(lengths: Sequence[int] | None, padded_bs: int) -> list[int]:
    """Host lengths of a replay padded to its captured size: padding requests have length 0
    (``lengths`` None: capture time, every request is padding)."""
    values = list(lengths or [])
    return values + [0] * (padded_bs - len(values))


class CudaGraphRunner:
    def __init__(
        self,
        fn: Callable[..., tuple[torch.Tensor, ...]],
        inputs: Sequence[StaticInput],
        batch_sizes: Sequence[int],
        *,
        device: torch.device | str,
        use_graphs: bool = True,
        pool=None,
        name: str = "graph",
        prepare: Callable[[int, dict[str, torch.Tensor], object], None] | None = None,
    ) -> None:
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"{name}: batch_sizes must be non-empty and >= 1, got {list(batch_sizes)}")
        self.fn = fn
        self.inputs = {i.name: i for i in inputs}
        self.batch_sizes = sorted(set(int(b) for b in batch_sizes))
        self.max_bs = self.batch_sizes[-1]
        self.device = torch.device(device)
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.pool = pool
        self.name = name
        self.prepare = prepare
        # one buffer per input, sized for the largest batch, holding pad values where unused
        self.buffers = {
            i.name: torch.full((self.max_bs * i.rows_per_request, *i.trailing), i.pad_value, dtype=i.dtype,
                               device=self.device)
            for i in inputs
        }
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        self._filled_rows = {name: 0 for name in self.buffers}  # rows holding real (stale) inputs
        # NOTE: the views a replay hands out and fills, made once: slicing a tensor costs host time, and a
        # step replays several graphs of a dozen inputs each
        self._row_views: dict[tuple[str, int], torch.Tensor] = {}  # (input, bs) -> its buffer's rows
        self._output_views: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}  # (padded, bs) -> outputs
        # bytes the captured graphs hold in the memory pool (measured by ``capture``)
        self.memory_bytes = 0
        # calls served, padded or not (for tests and metrics)
        self.num_calls = 0

    # ------------------------------------------------------------------ sizes
    def can_run(self, bs: int) -> bool:
        return 1 <= bs <= self.max_bs

    def padded_size(self, bs: int) -> int:
        if not self.can_run(bs):
            raise ValueError(f"{self.name}: batch of {bs} outside the captured sizes 1..{self.max_bs}")
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]

    def rows(self, name: str, bs: int) -> torch.Tensor:
        """Input ``name``'s rows of a ``bs``-request call, to write before passing ``WRITTEN``."""
        view = self._row_views.get((name, bs))
        if view is None:
            view = self._row_views[(name, bs)] = self.buffers[name][: bs * self.inputs[name].rows_per_request]
        return view

    def _views(self, bs: int) -> dict[str, torch.Tensor]:
        return {name: self.rows(name, bs) for name in self.buffers}

    # ---------------------------------------------------------------- capture
    def capture(self) -> None:
        """Warm up and capture every batch size, largest first (smaller ones reuse its memory)."""
        if not self.use_graphs:
            return
        self._output_views.clear()
        gc.collect()  # NOTE: so that freeing unrelated garbage does not offset the measurement
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        stream = torch.cuda.Stream(self.device)
        for bs in reversed(self.batch_sizes):
            views = self._views(bs)
            if self.prepare is not None:
                self.prepare(bs, views, None)
            # NOTE: two eager runs first: Triton compiles and cuBLAS picks its workspace outside
            # the capture, which must not allocate host-visible state.
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.fn(**views)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                outputs = self.fn(**views)
            self._graphs[bs] = (graph, tuple(outputs))
        torch.cuda.synchronize(self.device)
        self.memory_bytes = torch.cuda.memory_allocated(self.device) - before

    def release(self) -> None:
        """Destroy the captured graphs; later calls run ``fn`` eagerly. A process group whose
        collectives a graph captured cannot be destroyed while that graph lives (NCCL teardown
        waits on it: pytorch/pytorch#115388), so tensor-parallel shutdown calls this first."""
        for graph, _ in self._graphs.values():
            graph.reset()
        self._graphs.clear()
        self._output_views.clear()
        self.use_graphs = False
        self.memory_bytes = 0

    # ----------------------------------------------------------------- replay
    def __call__(self, bs: int, *, host: object = None,
                 **inputs: torch.Tensor | Callable[[torch.Tensor], object]) -> tuple[torch.Tensor, ...]:
        """Replay for ``bs`` requests; each input a tensor or a writer of its rows (module docstring)."""
        padded = self.padded_size(bs)
        self.num_calls += 1
        if set(inputs) != set(self.buffers):
            raise ValueError(f"{self.name}: expected inputs {sorted(self.buffers)}, got {sorted(inputs)}")
        for name, value in inputs.items():
            spec, view = self.inputs[name], self.rows(name, bs)
            rows = bs * spec.rows_per_request
            if callable(value):
                value(view)
            elif value.shape[0] != rows or tuple(value.shape[1:]) != spec.trailing:
                raise ValueError(f"{self.name}: input {name} has shape {tuple(value.shape)}, expected "
                                 f"({rows}, {', '.join(map(str, spec.trailing))})")
            else:
                view.copy_(value)
            stale = self._filled_rows[name]
            if stale > rows:  # rows a larger batch filled before are padding now
                self.buffers[name][rows:stale].fill_(spec.pad_value)
            self._filled_rows[name] = rows
        if self.prepare is not None:
            self.prepare(padded, self._views(padded), host)
        if self.use_graphs:
            if padded not in self._graphs:
                raise RuntimeError(f"{self.name}: call capture() before replaying")
            graph, outputs = self._graphs[padded]
            graph.replay()
            views = self._output_views.get((padded, bs))
            if views is None:
                views = self._output_views[(padded, bs)] = _first_rows(outputs, bs, padded)
            return views
        return _first_rows(tuple(self.fn(**self._views(padded))), bs, padded)


def _first_rows(outputs: tuple[torch.Tensor, ...], bs: int, padded: int) -> tuple[torch.Tensor, ...]:
    """Each output's rows of the ``bs`` real requests of a ``padded``-request call."""
    if bs == padded:
        return outputs
    return tuple(o[: bs * (o.shape[0] // padded)] for o in outputs)
