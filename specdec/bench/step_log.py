"""Where a benchmark's engine time goes: engine steps by kind and their wall time.

A step is ``prefill`` when it computed prompt tokens, else the decode step's choice (adaptive
speculation's shape or ``plain``, NGRAM's lookup or plain), or ``decode`` for an engine without a
policy. Both drivers of a real model use it: ``specdec bench`` (``throughput.py``) and the side-by-side
harness (``benchmarks/peer/offline.py``).
"""

from __future__ import annotations

import collections
import time

PREFILL = "prefill"
DECODE = "decode"


def choices(engine) -> dict[str, int]:
    """Decode steps by the speculation policy's choice so far ({} for an engine without one)."""
    policy = getattr(engine.worker, "policy", None)
    return dict(getattr(policy, "chosen", {}) or {})


class StepLog:
    """``step()`` runs one ``engine.step()`` and files its wall time under the step's kind."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.forced: str | None = None  # every decode step filed under this (a forced choice)
        self._log: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])  # kind: [steps, seconds]

    def step(self) -> list:
        """``engine.step()``'s finished requests."""
        scheduler = self.engine.scheduler
        prefills, before = scheduler.prefill_steps, choices(self.engine)
        start = time.perf_counter()
        finished = self.engine.step()
        seconds = time.perf_counter() - start
        log = self._log[PREFILL if scheduler.prefill_steps != prefills else self._choice(before)]
        log[0] += 1
        log[1] += seconds
        return finished

    def _choice(self, before: dict[str, int]) -> str:
        if self.forced is not None:
            return self.forced
        return next((k for k, n in choices(self.engine).items() if n != before.get(k, 0)), DECODE)

    def take(self) -> dict[str, dict]:
        """Steps by kind since the last ``take`` or ``clear``, most time first: {kind: {"steps", "ms"}}
        (``ms``: the mean wall time of one ``engine.step()``)."""
        out = {kind: {"steps": n, "ms": 1e3 * sec / n}
               for kind, (n, sec) in sorted(self._log.items(), key=lambda kv: -kv[1][1])}
        self.clear()
        return out

    def clear(self) -> None:
        self._log.clear()


def merge_steps(logs: list[dict[str, dict]]) -> dict[str, dict]:
    """Several ``take`` results as one, most time first."""
    total: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])  # kind: [steps, ms summed]
    for log in logs:
        for kind, v in log.items():
            total[kind][0] += v["steps"]
            total[kind][1] += v["steps"] * v["ms"]
    return {kind: {"steps": n, "ms": ms / n} for kind, (n, ms) in sorted(total.items(), key=lambda kv: -kv[1][1])}


def format_steps(steps: dict[str, dict]) -> str:
    """``5x4x8 647 x 2.02 ms, prefill 8 x 10.71 ms``."""
    return ", ".join(f"{kind} {v['steps']} x {v['ms']:.2f} ms" for kind, v in steps.items())
