"""The KV pool's idle invariant, checked after every test (conftest) and by tests that want it now.

Idle: no request holds a row or a page; every page is either free or held by the prefix cache
(never both, never twice), and no cached page is locked. Flushing the cache then frees them all.
"""

from __future__ import annotations

import collections

import numpy as np


def kv_idle_problems(engine) -> list[str]:
    """What breaks the idle invariant of an engine with no work (empty: it holds)."""
    sched, memory = engine.scheduler, engine.memory
    cache = sched.cache
    problems = []
    if sched.running or sched.waiting or sched.chunked is not None or sched.launched is not None:
        problems.append("requests remain in the scheduler")
    if memory.num_free_reqs() != memory.max_reqs:
        problems.append(f"{memory.max_reqs - memory.num_free_reqs()} request rows are still taken")
    cached = cache.pages()
    twice = [p for p, n in collections.Counter(cached).items() if n > 1]
    if twice:
        problems.append(f"pages cached twice: {twice[:8]}")
    free = np.flatnonzero(memory._page_free)
    both = np.intersect1d(free, cached)
    if both.size:
        problems.append(f"pages both free and cached: {both[:8].tolist()}")
    lost = memory.num_pages - free.size - len(set(cached))
    if lost:
        problems.append(f"{lost} pages are neither free nor cached (leaked)")
    if cache.locked_pages:
        problems.append(f"{cache.locked_pages} cached pages are still locked")
    return problems


def assert_kv_idle(engine, *, flush: bool = True) -> None:
    """The idle invariant; with ``flush`` also that dropping the cache frees the whole pool."""
    problems = kv_idle_problems(engine)
    assert not problems, "; ".join(problems)
    if flush:
        engine.flush_cache()
        assert engine.memory.available_size() == engine.memory.capacity
