"""Triton kernels first launched while serving: each one stalls the step that needs it.

Triton builds a kernel per specialization of its arguments (dtypes, constexprs, and integer arguments
equal to 1 or divisible by 16) the first time a process launches it: loaded from its disk cache that
takes milliseconds, compiled 0.1-1 s, and the step that launched it waits (a new 12-node lookup's first
step stalled ~0.6 s on an H200: benchmarks/results/2026-11-29-h200-ngram-device). The engine warms what
it can before serving; ``JitWatch`` names what it missed, so that a stall is found, not guessed:

    with JitWatch() as watch:        # the span being served or timed
        ...
    watch.count, watch.seconds       # kernel variants built in the span, and the time they took
    watch.builds                     # [("specdec.kernels.triton.commit._commit_kernel(n: i32 16, ...)", seconds)]

It listens through Triton's JIT hooks (``triton.knobs.runtime.jit_cache_hook`` before a variant is
built, ``jit_post_compile_hook`` after), which Triton calls only when a launch misses the process's
in-memory kernel cache. Without Triton, or in its CPU interpreter (which builds nothing), it counts
nothing. Several watches may be open at once (each engine of a process has its own); the hooks are
installed once and chain any that were installed before.

``builds_so_far()`` counts every build of the process since it was first called, watched or not:
adaptive speculation's step clock (``specdec.eagle.served.LaunchClock``) drops a step that waited
for one, which would otherwise be learnt as that choice's cost.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_total = 0  # builds recorded since the hooks were installed (``builds_so_far``)
_open: list["JitWatch"] = []
_building: dict[object, float] = {}  # variant key -> perf_counter when its build began
_installed = False


class JitWatch:
    """Kernel variants Triton built between ``__enter__`` and ``__exit__``; ``on_build(name, seconds)``
    is called for each (from the launching thread, after the build)."""

    def __init__(self, on_build: Callable[[str, float], None] | None = None) -> None:
        self.on_build = on_build
        self.builds: list[tuple[str, float]] = []  # (the variant: kernel and arguments, seconds its build took)

    @property
    def count(self) -> int:
        return len(self.builds)

    @property
    def seconds(self) -> float:
        return sum(seconds for _, seconds in self.builds)

    def __enter__(self) -> "JitWatch":
        if _install():
            with _lock:
                _open.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            if self in _open:
                _open.remove(self)

    def _built(self, name: str, seconds: float) -> None:
        self.builds.append((name, seconds))
        if self.on_build is not None:
            self.on_build(name, seconds)


def _install() -> bool:
    """Chain our hooks onto Triton's (once a process); False without Triton."""
    global _installed
    with _lock:
        if _installed:
            return True
        try:
            from triton import knobs
        except ImportError:  # no Triton (or one without knobs): nothing is ever built
            return False
        before, after = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook

        def cache_hook(**kw):
            _building[kw["key"]] = time.perf_counter()
            return before(**kw) if before is not None else None

        def post_compile_hook(**kw):
            began = _building.pop(kw["key"], None)
            if began is not None:
                _record(_variant(kw), time.perf_counter() - began)
            return after(**kw) if after is not None else None

        knobs.runtime.jit_cache_hook = cache_hook
        knobs.runtime.jit_post_compile_hook = post_compile_hook
        _installed = True
        return True


def _variant(hook_kwargs: dict) -> str:
    """``module.kernel(arg: type specialization, ...)``, as far as this Triton's hook arguments say."""
    fn = hook_kwargs.get("fn")
    name = f"{fn.module}.{fn.name}" if fn is not None else str(hook_kwargs.get("repr", "?"))
    try:
        compile_info = hook_kwargs["compile"]
        attrs = compile_info["configs"][0]  # {(arg index,): [[attribute, value]]}: divisibility and the like
        args = [f"{param}: {kind}" + "".join(f" {v}" for _, v in attrs.get((i,), []))
                for i, (param, kind) in enumerate(compile_info["signature"].items())]
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        return name
    return f"{name}({', '.join(args)})"


def builds_so_far() -> int:
    """Kernel variants this process has built since its first call (0 without Triton)."""
    if not _installed:  # NOTE: unlocked: once True it stays True
        _install()
    return _total


def _record(name: str, seconds: float) -> None:
    global _total
    with _lock:
        _total += 1
        watches = list(_open)
    for watch in watches:
        watch._built(name, seconds)


# a build slower than this compiled (a load from Triton's disk cache takes milliseconds): worth a warning
COMPILE_S = 0.05


def log_build(name: str, seconds: float) -> None:
    """The serving engine's ``on_build``: a warning where the variant was compiled, a debug line where it
    was loaded from the disk cache, with what it cost the step."""
    logger.log(logging.WARNING if seconds >= COMPILE_S else logging.DEBUG,
               "Triton built a kernel while serving (%.0f ms; the step that launched it waited): %s",
               1e3 * seconds, name)
