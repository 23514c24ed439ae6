"""Host launches per decode step, counted on CPU: the CPU proxy for a step's host time on a GPU.

On a GPU at large batch a small model's decode step is host-bound: between the CUDA-graph
replays (draft loop, verify forward, draft extend) every torch op and Triton kernel is launched
one by one, each costing ~5-20 µs of host time. ``OpCounter`` counts them while a block runs:

    kernels   torch ops that launch device work (not views, not allocations), plus Triton launches
    views     view / metadata ops (no device work, still a dispatch each)
    allocs    empty / empty_strided (the caching allocator, no launch)
    graphs    CUDA-graph replays (a captured runner's whole function counts as one)

by phase of the step (``phase``; the worker's ``maybe_phase`` names: draft, verify, commit,
draft_extend; see ``count_decode_steps`` for the others). Inside a graph runner's function and a
Triton launch nothing else is counted (they are one launch each on a GPU). Triton kernels run under
the interpreter (the graphs' functions on torch's references), whose CPU-only error-flag reads are
not counted either.

tests/eagle/test_op_count.py pins the counts per step of EAGLE-3 workers at 64 requests (tiny
random models, overlap on, adaptive on with the shape forced, the graph path run eagerly), and
tests/ngram/test_op_count.py an NGRAM engine's lookup and plain steps; run either as a script to
print them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import os
from typing import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_ALLOCS = {"empty", "empty_strided", "empty_like"}
# metadata-only ops that torch does not mark as views (no device work)
_NO_KERNEL = {"_local_scalar_dense", "is_nonzero", "lift_fresh", "resolve_conj", "resolve_neg", "_to_copy_noop"}


def _aliases(func, args, out) -> bool:
    """A view op, or one that may alias (``to``, ``contiguous``) and did: its output shares its
    input's storage."""
    if not func.is_view:
        return False
    first = args[0] if args else None
    if not isinstance(out, torch.Tensor) or not isinstance(first, torch.Tensor):
        return True
    return out.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as ops: ...``: ``ops.counts[phase][kind]`` and ``ops.names[phase]``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.names: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.phase_name = "step"
        self.counting = False  # only inside ``measure``
        self._paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.counting and not self._paused:
            name = func.overloadpacket.__name__
            kind = ("views" if _aliases(func, args, out) or name in _NO_KERNEL
                    else "allocs" if name in _ALLOCS else "kernels")
            self.counts[self.phase_name][kind] += 1
            self.names[self.phase_name][f"{kind[0]}:{name}"] += 1
        return out

    def record(self, kind: str, name: str) -> None:
        if self.counting and not self._paused:
            self.counts[self.phase_name][kind] += 1
            self.names[self.phase_name][f"{kind[0]}:{name}"] += 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        self.counting = True
        try:
            yield
        finally:
            self.counting = False

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A ``PhaseTimer`` stand-in: the worker's ``maybe_phase`` names where its ops go."""
        previous, self.phase_name = self.phase_name, name
        try:
            yield
        finally:
            self.phase_name = previous

    @contextlib.contextmanager
    def host(self, name: str) -> Iterator[None]:
        """A ``PhaseTimer`` stand-in's host-time span: its ops stay in the enclosing phase."""
        yield

    def one_launch(self, kind: str, name: str, fn: Callable) -> Callable:
        """``fn`` counted as one ``kind`` launch, nothing inside it counted."""
        @functools.wraps(fn)
        def run(*args, **kwargs):
            self.record(kind, name)
            with self.paused():
                return fn(*args, **kwargs)
        return run

    def totals(self, steps: int) -> dict[str, dict[str, float]]:
        """Counts per step by phase, and "total"."""
        out = {p: {k: v / steps for k, v in sorted(c.items())} for p, c in sorted(self.counts.items())}
        total: collections.Counter[str] = collections.Counter()
        for c in self.counts.values():
            total.update(c)
        out["total"] = {k: v / steps for k, v in sorted(total.items())}
        return out


def _patch_triton(counter: OpCounter) -> list[Callable[[], None]]:
    """Count each interpreted Triton launch once, and let no CPU-only error-flag read count."""
    from triton.runtime.interpreter import InterpretedFunction

    import specdec.kernels.triton as kernel_pkg
    from specdec.kernels.dispatch import _load_triton_impls

    _load_triton_impls()
    undo = []
    original_run = InterpretedFunction.run

    def run(self, *args, **kwargs):
        counter.record("kernels", f"triton.{self.__name__}")
        with counter.paused():
            return original_run(self, *args, **kwargs)

    InterpretedFunction.run = run
    undo.append(lambda: setattr(InterpretedFunction, "run", original_run))
    import importlib
    import pkgutil
    for info in pkgutil.iter_modules(kernel_pkg.__path__):
        module = importlib.import_module(f"{kernel_pkg.__name__}.{info.name}")
        check = getattr(module, "raise_on_cpu", None)
        if check is not None:
            setattr(module, "raise_on_cpu", lambda *a, _c=check, **kw: _quiet(counter, _c, *a, **kw))
            undo.append(lambda m=module, c=check: setattr(m, "raise_on_cpu", c))
    return undo


def _quiet(counter: OpCounter, check, *args, **kwargs) -> None:
    with counter.paused():
        check(*args, **kwargs)


def _patch_graphs(counter: OpCounter, runners) -> list[Callable[[], None]]:
    """Each graph runner's function counts as one replay and runs on torch's references (what
    runs inside a graph costs no host time a step; interpreted, its kernels would be slow)."""
    undo = []
    for runner in runners:
        fn = runner.fn
        runner.fn = counter.one_launch("graphs", runner.name, _without_interpreter(fn))
        undo.append(lambda r=runner, f=fn: setattr(r, "fn", f))
    return undo


def _without_interpreter(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with _interpret(False):
            return fn(*args, **kwargs)
    return run


@contextlib.contextmanager
def _interpret(on: bool) -> Iterator[None]:
    """TRITON_INTERPRET for the span: ops dispatch to Triton kernels on CPU tensors where it is 1."""
    saved = os.environ.get("TRITON_INTERPRET")
    if on:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


@dataclasses.dataclass(frozen=True)
class DecodeOps:
    """Launches per steady-state decode step (counts averaged over ``steps``)."""

    shape: str
    bs: int
    steps: int
    per_phase: dict[str, dict[str, float]]  # phase -> kind -> per step
    names: dict[str, dict[str, float]]  # phase -> "kind:op" -> per step

    def kernels(self, phase: str = "total") -> float:
        return self.per_phase.get(phase, {}).get("kernels", 0.0)

    def table(self) -> str:
        kinds = ("kernels", "views", "allocs", "graphs")
        lines = [f"{self.shape} bs={self.bs} ({self.steps} steps): per step",
                 f"  {'phase':<14}" + "".join(f"{k:>9}" for k in kinds)]
        for phase, c in self.per_phase.items():
            lines.append(f"  {phase:<14}" + "".join(f"{c.get(k, 0):9.1f}" for k in kinds))
        return "\n".join(lines)


def count_batch_steps(engine, requests: list, *, steps: int = 3) -> DecodeOps:
    """Add ``requests`` (all decoding at once), step until they all run and a decode step is in
    flight, count ``steps`` steady steps (``count_decode_steps``), then abort them all."""
    for req in requests:
        engine.add_request(req)
    while len(engine.scheduler.running) < len(requests) or engine.scheduler.launched is None:
        engine.step()
    ops = count_decode_steps(engine, steps=steps)
    for req in list(engine.scheduler.running):
        engine.abort(req.rid)
    engine.scheduler.drain()
    return ops


def count_decode_steps(engine, *, steps: int, warmup: int = 2) -> DecodeOps:
    """Run ``warmup`` then ``steps`` engine steps of running requests (each a decode step of the
    same batch) and count their host launches, by phase: the worker's phases, "launch" (the rest
    of ``DecodeLauncher.launch``), "read" (``DecodeLauncher.read``) and "scheduler" (the rest).

    The steps run under TRITON_INTERPRET=1, so the kernels between the graphs are Triton launches
    as on a GPU. NOTE: triton must have been imported with TRITON_INTERPRET=1 set (its kernels
    are compiled or interpreted for good when their modules import).
    """
    from specdec.kernels.triton import cache_ops

    if type(cache_ops._compact_kernel).__name__ != "InterpretedFunction":
        raise RuntimeError("count_decode_steps needs triton imported with TRITON_INTERPRET=1")
    counter = OpCounter()
    worker, decoder = engine.worker, engine.scheduler.decoder
    workers = list(getattr(worker, "workers", {}).values()) or [worker]
    runners = list(engine.runner.graphs.values())
    for w in workers:
        runners += [g.runner for g in getattr(w, "draft_graphs", list)()]  # (NGRAM has none)
    undo = _patch_triton(counter) + _patch_graphs(counter, runners)
    launch, read = decoder.launch, decoder.read
    decoder.launch = lambda *a, **kw: _in_phase(counter, "launch", launch, *a, **kw)
    decoder.read = lambda *a, **kw: _in_phase(counter, "read", read, *a, **kw)
    undo += [lambda: setattr(decoder, "launch", launch), lambda: setattr(decoder, "read", read)]
    phased = hasattr(worker, "timer")  # (NGRAM's worker times no phases: its launches count as "launch")
    if phased:
        timer, worker.timer = worker.timer, counter
    sizes: list[int] = []
    shapes: collections.Counter[str] = collections.Counter()
    try:
        with _interpret(True), counter, counter.phase("scheduler"):
            for i in range(warmup + steps):
                before = collections.Counter(decoder.spec_shape_steps)
                with counter.measure() if i >= warmup else contextlib.nullcontext():
                    engine.step()
                if i >= warmup:
                    launched = engine.scheduler.launched
                    sizes.append(len(launched.reqs) if launched is not None else 0)
                    shapes.update(collections.Counter(decoder.spec_shape_steps) - before)
    finally:
        if phased:
            worker.timer = timer
        for fn in reversed(undo):
            fn()
    if len(set(sizes)) != 1:
        raise RuntimeError(f"the counted steps decoded batches of {sizes} requests: expected one size")
    names = {p: {k: v / steps for k, v in c.most_common()} for p, c in counter.names.items()}
    return DecodeOps(shape=",".join(sorted(shapes)) or "none", bs=sizes[0], steps=steps,
                     per_phase=counter.totals(steps), names=names)


def _in_phase(counter: OpCounter, name: str, fn, *args, **kwargs):
    with counter.phase(name):
        return fn(*args, **kwargs)
