"""Prometheus metrics of one served engine, on a registry of its own (one per app, never global).

Names follow SGLang's (``sglang:num_running_reqs`` → ``specdec:num_running_reqs``) so existing
dashboards carry over. Speculative metrics, per verify step of one request, where k = accepted
draft tokens (0..num_steps) and the step commits k + 1 tokens (accepted + bonus):

    specdec:spec_verify_steps_total                 verify steps
    specdec:spec_accept_length                      mean committed tokens per verify step = mean(k + 1)
    specdec:spec_accepted_tokens_total{position=i}  verify steps whose draft token at depth i was accepted (k >= i)
    specdec:spec_accept_rate{position=i}            accepted_tokens{i} / verify steps
    specdec:spec_shape_steps_total{shape=SxKxN}     decode steps by speculative shape ("plain": no draft tree);
                                                    adaptive speculation's choices

Prefix cache and KV pool (SGLang's names):

    specdec:cache_hit_rate            prompt tokens served from the prefix cache / prompt tokens admitted
    specdec:cached_tokens_total       prompt tokens served from the prefix cache (prefill skipped)
    specdec:prefill_tokens_total      prompt tokens computed (by prefill steps, or in a decode step they joined)
    specdec:token_usage               fraction of the KV pool requests hold (unused cached pages count free)
    specdec:num_retracted_reqs_total  running requests retracted when the KV pool ran full (recomputed later)

Engine steps (``specdec:step_time_seconds`` times every one):

    specdec:prefill_steps_total           steps that computed prompt tokens (each pauses the decoding requests)
    specdec:prefill_step_seconds_total    their wall time

Stalls:

    specdec:kernel_builds_total           Triton kernel variants built while serving (``kernels/jit_watch.py``):
    specdec:kernel_build_seconds_total    each stalled the step that launched it for this long

Example: three verify steps with k = 2, 0, 1 → accept_length (3 + 1 + 2) / 3 = 2.0,
accept_rate{1} = 2/3, accept_rate{2} = 1/3, accept_rate{3..S} = 0.

Only the engine's loop thread writes; prometheus_client's metric objects are thread-safe for the
HTTP thread that reads them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "specdec:"
# CPU steps of tiny models take ~1 ms, GPU steps of large models up to ~1 s
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class EngineMetrics:
    def __init__(self, *, num_draft_positions: int = 0, registry: CollectorRegistry | None = None) -> None:
        """``num_draft_positions``: the draft tree depth (0 without speculation)."""
        self.registry = registry if registry is not None else CollectorRegistry()
        r, p = self.registry, PREFIX
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of accepted requests", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated (committed) tokens", registry=r)
        self.requests = Counter(p + "requests", "Finished requests by finish reason", ["finish_reason"], registry=r)
        self.num_running = Gauge(p + "num_running_reqs", "Requests being decoded", registry=r)
        self.num_queue = Gauge(p + "num_queue_reqs", "Requests waiting for admission", registry=r)
        self.step_time = Histogram(p + "step_time_seconds", "Engine step (prefill or decode) wall time",
                                   buckets=STEP_BUCKETS, registry=r)
        self.verify_steps = Counter(p + "spec_verify_steps", "Speculative verify steps (one per request per step)",
                                    registry=r)
        self.accept_length = Gauge(p + "spec_accept_length",
                                   "Mean committed tokens per verify step (accepted draft tokens + bonus)", registry=r)
        self.accepted_at = Counter(p + "spec_accepted_tokens", "Verify steps that accepted the draft token at depth i",
                                   ["position"], registry=r)
        self.accept_rate = Gauge(p + "spec_accept_rate", "Accepted at depth i / verify steps", ["position"],
                                 registry=r)
        self.shape_steps = Counter(p + "spec_shape_steps", "Decode steps by speculative shape (SxKxN; plain: no "
                                   "draft tree): adaptive speculation's choices", ["shape"], registry=r)
        self.cache_hit_rate = Gauge(p + "cache_hit_rate", "Prompt tokens served from the prefix cache / prompt "
                                    "tokens admitted", registry=r)
        self.cached_tokens = Counter(p + "cached_tokens", "Prompt tokens served from the prefix cache", registry=r)
        self.prefill_tokens = Counter(p + "prefill_tokens", "Prompt tokens computed (prefill steps, or joined to a "
                                      "decode step)", registry=r)
        self.token_usage = Gauge(p + "token_usage", "Fraction of the KV pool that requests hold", registry=r)
        self.retracted = Counter(p + "num_retracted_reqs", "Requests retracted when the KV pool ran full",
                                 registry=r)
        self.prefill_steps = Counter(p + "prefill_steps", "Engine steps that computed prompt tokens", registry=r)
        self.prefill_step_seconds = Counter(p + "prefill_step_seconds", "Wall time of the engine steps that "
                                            "computed prompt tokens", registry=r)
        self.kernel_builds = Counter(p + "kernel_builds", "Triton kernel variants built while serving (each "
                                     "stalls its step)", registry=r)
        self.kernel_build_seconds = Counter(p + "kernel_build_seconds", "Time steps waited for Triton kernel "
                                            "builds while serving", registry=r)
        self._cache_totals: dict[str, int] = {}
        self._shape_steps: dict[str, int] = {}
        self._steps = 0
        self._committed = 0
        self._accepted: list[int] = []  # [num_steps], index i-1 = depth i
        # each depth's labelled series, looked up once (a label lookup takes a lock and a dict; the engine
        # process calls ``observe_verify`` every step)
        self._accepted_at: list = []
        self._accept_rate: list = []
        self._add_depths(num_draft_positions)

    def _add_depths(self, deepest: int) -> None:
        for i in range(len(self._accepted) + 1, deepest + 1):
            self._accepted.append(0)
            self._accepted_at.append(self.accepted_at.labels(position=str(i)))
            self._accept_rate.append(self.accept_rate.labels(position=str(i)))
            self._accept_rate[-1].set(0.0)

    def observe_verify(self, accept_lengths: list[int]) -> None:
        """Count verify steps that accepted ``k`` draft tokens each (the server calls it once an engine
        step, with every request's: each series is touched once a call, not once a request)."""
        if not accept_lengths:
            return
        deepest = max(accept_lengths)
        if deepest > len(self._accepted):
            self._add_depths(deepest)
        at_depth = [0] * (deepest + 1)  # steps that accepted exactly k draft tokens
        for k in accept_lengths:
            at_depth[k] += 1
        reached = 0  # steps that accepted a token at depth i + 1: those that accepted more than i
        for i in range(deepest - 1, -1, -1):
            reached += at_depth[i + 1]
            self._accepted[i] += reached
            self._accepted_at[i].inc(reached)
        self._committed += sum(accept_lengths) + len(accept_lengths)
        self._steps += len(accept_lengths)
        self.verify_steps.inc(len(accept_lengths))
        self.accept_length.set(self._committed / self._steps)
        for rate, n in zip(self._accept_rate, self._accepted):
            rate.set(n / self._steps)

    def observe_shapes(self, totals: dict[str, int]) -> None:
        """Bring the shape counters up to the engine's running totals (decode steps by shape)."""
        for shape, total in totals.items():
            seen = self._shape_steps.get(shape, 0)
            if total > seen:
                self.shape_steps.labels(shape=shape).inc(total - seen)
                self._shape_steps[shape] = total

    def observe_cache(self, stats: dict) -> None:
        """Bring the cache figures up to the engine's running totals (``Engine.cache_stats()``)."""
        self.cache_hit_rate.set(stats["cache_hit_rate"])
        for counter, key in ((self.cached_tokens, "cached_prompt_tokens"), (self.prefill_tokens, "prefill_tokens"),
                             (self.retracted, "num_retracted_reqs")):
            seen = self._cache_totals.get(key, 0)
            if stats[key] > seen:
                counter.inc(stats[key] - seen)
                self._cache_totals[key] = stats[key]
        held = stats["num_pages"] - stats["free_pages"] - stats["evictable_pages"]
        self.token_usage.set(held / stats["num_pages"] if stats["num_pages"] else 0.0)

    def observe_kernel_build(self, seconds: float) -> None:
        self.kernel_builds.inc()
        self.kernel_build_seconds.inc(seconds)

    def observe_step(self, seconds: float, *, num_running: int, num_queue: int, prefill: bool = False) -> None:
        """One engine step's wall time; ``prefill``: it computed prompt tokens."""
        self.step_time.observe(seconds)
        if prefill:
            self.prefill_steps.inc()
            self.prefill_step_seconds.inc(seconds)
        self.set_load(num_running=num_running, num_queue=num_queue)

    def set_load(self, *, num_running: int, num_queue: int) -> None:
        self.num_running.set(num_running)
        self.num_queue.set(num_queue)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
