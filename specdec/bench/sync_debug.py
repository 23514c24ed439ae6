"""Which host calls wait for the device: torch's sync debug mode over a block, recorded by call site.

Under overlap scheduling the host should run a step ahead of the GPU; any call that makes it wait
for the device (``.item()``, ``.tolist()`` of a device tensor, ``torch.nonzero``, a copy from
pageable memory, ...) stalls that. ``torch.cuda.set_sync_debug_mode("warn")`` makes torch warn on
each of them; ``SyncRecorder`` turns those warnings into counts per source line of ours (the
innermost frame under ``specdec/``, ``benchmarks/`` or ``tests/``, else the innermost outside
torch), so a test can assert there are none and a benchmark can print the worst.

Deliberate waits (the step's one read of its results) run inside
``specdec.forward.deliberate_sync``, which turns the mode off for their span.

NOTE: the mode is process-wide. A wait the driver hides from torch (an event's ``synchronize``,
a graph launch that blocks because the launch queue is full) is not seen.
"""

from __future__ import annotations

import collections
import traceback
import warnings
from pathlib import Path

import torch

_OURS = ("/specdec/", "/benchmarks/", "/tests/")
_SKIP = ("/torch/", "/warnings.py", "/sync_debug.py", "/contextlib.py")


class SyncRecorder:
    """``with SyncRecorder() as sync: ...``: ``sync.sites`` counts each synchronising call by its
    call site ("path:line in function"); outside CUDA it records nothing."""

    def __init__(self, *, mode: str = "warn") -> None:
        self.mode = mode
        self.sites: collections.Counter[str] = collections.Counter()
        self._previous = 0
        self._catch: warnings.catch_warnings | None = None
        self._active = False

    def __enter__(self) -> "SyncRecorder":
        self._active = torch.cuda.is_available()
        if not self._active:
            return self
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" not in str(message):
                return shown(message, category, filename, lineno, file, line)
            self.sites[_call_site(traceback.extract_stack()[:-1])] += 1

        warnings.showwarning = record  # catch_warnings restores it
        self._previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(self.mode)
        return self

    def __exit__(self, *exc) -> None:
        if not self._active:
            return
        torch.cuda.set_sync_debug_mode(self._previous)
        self._catch.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.sites.values())

    def summary(self, top: int = 15) -> str:
        """The ``top`` call sites by count, one a line."""
        if not self.sites:
            return "no synchronising calls"
        lines = [f"{self.total} synchronising calls at {len(self.sites)} sites:"]
        lines += [f"{n:8d}  {site}" for site, n in self.sites.most_common(top)]
        return "\n".join(lines)


def _call_site(stack: traceback.StackSummary) -> str:
    """The innermost frame of ours (with the frame that called it, when that is ours too)."""
    frames = [f for f in stack if not any(s in f.filename.replace("\\", "/") for s in _SKIP)]
    ours = [i for i, f in enumerate(frames) if any(s in f.filename.replace("\\", "/") for s in _OURS)]
    if not frames:
        return "?"
    i = ours[-1] if ours else len(frames) - 1
    site = _describe(frames[i])
    if i > 0 and i - 1 in ours:
        site += f" <- {_describe(frames[i - 1])}"
    return site


def _describe(frame: traceback.FrameSummary) -> str:
    path = Path(frame.filename)
    parts = path.parts
    for root in ("specdec", "benchmarks", "tests"):
        if root in parts:
            path = Path(*parts[len(parts) - 1 - parts[::-1].index(root):])
            break
    return f"{path}:{frame.lineno} in {frame.name}"
