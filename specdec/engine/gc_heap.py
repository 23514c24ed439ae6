"""The garbage collector and a serving engine: freeze the built engine's heap, record what collections cost.

A built engine is hundreds of thousands of long-lived Python objects (modules, parameters, graph
runners, pools). Python's oldest-generation collection walks all of them, stop-the-world, though it
never frees one: on a CPU 170 k objects of a tiny engine took 63 ms a pass. During decoding such a
pass lands inside some step, and a GPU waiting on its host idles for it. ``frozen_heap`` moves
what is alive once the engine is built into the permanent generation (``gc.freeze``), which
collections skip, as vLLM, SGLang and TensorRT-LLM do after start-up; cycles made later are still
collected. Leaving the block unfreezes, so a torn-down engine's own cycles can be collected before
the next one is built (benchmarks build several in one process).

``GCPauses`` records the collections (and their pauses) of a span, by generation: benchmarks report
them beside the step time.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect once, then keep everything alive now out of the collector's passes for the block."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class GCPauses:
    """Collections and their pause by generation over ``with`` spans: ``counts[g]``, ``pause_ms[g]``."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]
        self.pause_ms = [0.0, 0.0, 0.0]
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            g = info["generation"]
            self.counts[g] += 1
            self.pause_ms[g] += (time.perf_counter() - self._start) * 1e3

    def __enter__(self) -> "GCPauses":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def to_json(self) -> dict:
        return {"collections": list(self.counts), "pause_ms": [round(p, 3) for p in self.pause_ms]}
