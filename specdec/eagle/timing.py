"""PhaseTimer: time spent per phase of the decode step, without host syncs while it runs.

On CUDA each phase is a pair of events recorded on the current stream; the times are read once,
when ``summary`` is called after the run. On CPU work is synchronous and wall time is exact.
``host`` phases are host wall time, kept apart (``host_summary``): the host's wait for a step's read
tells a device-bound step (the host waits) from a host-bound one (it does not).
"""

from __future__ import annotations

import collections
import contextlib
import time

import torch


class PhaseTimer:
    def __init__(self, device: torch.device | str) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._events: list[tuple[str, object, object]] = []
        self._cpu_ms: collections.Counter[str] = collections.Counter()
        self._host_ms: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def phase(self, name: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._cpu_ms[name] += (time.perf_counter() - t0) * 1e3

    @contextlib.contextmanager
    def host(self, name: str):
        t0 = time.perf_counter()
        yield
        self._host_ms[name] += (time.perf_counter() - t0) * 1e3

    def host_summary(self) -> dict[str, float]:
        """Total host milliseconds per ``host`` phase since the last ``reset``."""
        return dict(self._host_ms)

    def summary(self) -> dict[str, float]:
        """Total milliseconds per phase since the last ``reset``."""
        totals = collections.Counter(self._cpu_ms)
        if self._events:
            torch.cuda.synchronize()
            for name, start, end in self._events:
                totals[name] += start.elapsed_time(end)
        return dict(totals)

    def reset(self) -> None:
        self._events.clear()
        self._cpu_ms.clear()
        self._host_ms.clear()


def maybe_phase(timer: PhaseTimer | None, name: str) -> contextlib.AbstractContextManager:
    """``timer.phase(name)``, or nothing without a timer."""
    return timer.phase(name) if timer is not None else contextlib.nullcontext()


def maybe_host(timer: PhaseTimer | None, name: str) -> contextlib.AbstractContextManager:
    """``timer.host(name)``, or nothing without a timer."""
    return timer.host(name) if timer is not None else contextlib.nullcontext()
