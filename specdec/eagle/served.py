"""What served decode steps cost, learned online: the part of adaptive speculation that EAGLE's
policy (``specdec.eagle.policy``) and NGRAM's (``specdec.ngram.policy``) share.

    LaunchClock          a step's served time: from its launch to the next launch, handed over
                         only where the step before it made the same choice in the same bucket,
                         and no Triton kernel was built in between
    StepTimeCalibration  served over reference milliseconds per choice and batch-size bucket
    RunnerUpExplorer     each bucket's runner-up run for a few steps in a row every so often, so
                         that every choice's figure stays current

A batch-size bucket is ``bs.bit_length()``: 1, 2-3, 4-7, 8-15, ...

NOTE: every figure here is measured on the host's clock, so two tensor-parallel ranks would learn
different ones and choose differently; callers turn learning off under tensor parallelism.
"""

from __future__ import annotations

import time

from specdec.kernels.jit_watch import builds_so_far

PLAIN = "plain"


def bucket(bs: int) -> int:
    return bs.bit_length()


class StepTimeCalibration:
    """Observed over reference milliseconds of a step, per choice and batch-size bucket, an
    exponentially decaying mean that starts at 1 with ``prior_weight`` steps' weight. An observation
    is clipped to ``clip`` times the ratio learnt so far (an idle engine's gap, a host pause, is not a
    step's cost), so a ratio that stays high is still learnt, a few clipped steps at a time: with
    the clip fixed at (0.25, 4) of the reference, a served step that kept costing 5x its start-up
    profile (a 135M model's host-bound steps behind a server) was taken for 4x, and the choice
    that cost most was underestimated most."""

    def __init__(self, *, decay: float = 0.98, prior_weight: float = 4.0, clip: tuple[float, float] = (0.25, 4.0)):
        self.decay, self.prior_weight, self.clip = decay, prior_weight, clip
        self._sum: dict[tuple[str, int], float] = {}
        self._weight: dict[tuple[str, int], float] = {}

    def ratio(self, name: str, bs: int) -> float:
        key = (name, bucket(bs))
        return (self.prior_weight + self._sum.get(key, 0.0)) / (self.prior_weight + self._weight.get(key, 0.0))

    def observed(self, name: str, bs: int) -> bool:
        """Whether a step of ``name`` in ``bs``'s bucket has been observed."""
        return (name, bucket(bs)) in self._weight

    def observe(self, name: str, bs: int, ratio: float) -> None:
        key = (name, bucket(bs))
        learnt = self.ratio(name, bs)
        ratio = min(max(ratio, self.clip[0] * learnt), self.clip[1] * learnt)
        self._sum[key] = self.decay * self._sum.get(key, 0.0) + ratio
        self._weight[key] = self.decay * self._weight.get(key, 0.0) + 1.0


class LaunchClock:
    """Served step times, from one decode step's launch to the next one's: the whole step as the
    host loop runs it (scheduling, stop checks, the caller's own work).

    NOTE: under overlap scheduling that interval holds the host's wait for the step launched
    before the last one (read between the two launches), not the last step's own device time. So
    an interval is the last step's cost only where that earlier step made the same choice at a
    batch size of the same bucket; otherwise it is dropped (without this, a runner-up tried for
    one step was charged the leader's time, and the first choice was never revised: 0.68-0.88x
    plain decoding on the H200, 2026-11-28). Without overlap the rule costs one sample per switch.

    An interval in which Triton built a kernel (``builds_so_far``: a variant's first launch in the
    process, 0.1-1 s compiled, milliseconds from its disk cache) is dropped too: one such stall,
    clipped to 4x the step and learnt with a few steps' weight, prices a choice out until its next
    exploration (a sweep's first 2x1x3 step at tp 1 waited 123 ms: benchmarks/results/
    2026-11-30-h200x4-scale).
    """

    def __init__(self) -> None:
        # the last launch: (choice, bs, context, launched at, whether the launch before it made the
        # same choice in the same bucket)
        self._last: tuple[str, int, float, float, bool] | None = None
        self._builds = builds_so_far()  # Triton's builds up to the last launch

    def reset(self) -> None:
        """Forget the last launch: a prefill (or a step outside the policy) ran since."""
        self._last = None

    def launch(self, name: str, bs: int, context: float = 0.0, *,
               now: float | None = None) -> tuple[str, int, float, float] | None:
        """Record a launch of choice ``name``; returns the last step's (choice, bs, context, ms)
        where it may be timed, else None. ``now``: the launch's ``time.perf_counter()`` if taken
        earlier (a launch that decides its choice after host work of its own)."""
        now = time.perf_counter() if now is None else now
        builds, self._builds = self._builds, builds_so_far()
        timed, same = None, False
        if self._last is not None:
            last_name, last_bs, last_context, launched, same_as_before = self._last
            if same_as_before and builds == self._builds:  # NOTE: no kernel built since the last launch
                timed = (last_name, last_bs, last_context, (now - launched) * 1e3)
            same = last_name == name and bucket(last_bs) == bucket(bs)
        self._last = (name, bs, context, now, same)
        return timed


class RunnerUpExplorer:
    """Which choice a step takes: the best by score, except that every ``explore_every`` steps of
    a bucket, the runner-up (if it has not run in that bucket since) runs ``explore_steps`` steps
    in a row, enough for ``LaunchClock`` to time it.

    Where the caller gives each choice's step time, a run's expected loss is held to ``explore_share``
    of the served time since the runner-up last ran: a run of k steps of ``ms_r`` milliseconds loses
    k ms_r (1 - score_r / score_best), so it waits at least that / (explore_share ms_best) steps. (NGRAM's
    host lookups at 32 requests took ~3x a plain step on an H200, so a run of 3 every 64 steps could cost
    several per cent of the served time where lookups do not pay.)"""

    def __init__(self, *, explore_every: int = 64, explore_steps: int = 3, explore_share: float = 0.02) -> None:
        self.explore_every, self.explore_steps, self.explore_share = explore_every, explore_steps, explore_share
        self._bucket_steps: dict[int, int] = {}  # steps chosen per batch-size bucket
        self._last_tried: dict[tuple[int, str], int] = {}  # (bucket, choice) -> that bucket's step count
        self._trying: dict[int, tuple[str, int]] = {}  # bucket -> (runner-up being tried, steps left)

    def pick(self, scores: dict[str, float], bs: int, step_ms: dict[str, float] | None = None) -> str:
        """The choice of this step, from each candidate's score (higher is better); ``step_ms``: each
        candidate's expected step time (the run's loss budget, class docstring)."""
        ranked = sorted(scores, key=scores.get, reverse=True)
        pick = ranked[0]
        if len(ranked) < 2:
            return pick
        b = bucket(bs)
        step = self._bucket_steps[b] = self._bucket_steps.get(b, 0) + 1
        trying, left = self._trying.get(b, (PLAIN, 0))
        if left > 0 and trying in scores:  # the rest of a runner-up's run of steps
            pick = trying
            self._trying[b] = (trying, left - 1)
        elif step - self._last_tried.get((b, ranked[1]), 0) >= self._interval(scores, ranked, step_ms):
            pick = ranked[1]  # keep the runner-up's step time current
            self._trying[b] = (pick, self.explore_steps - 1)
        self._last_tried[(b, pick)] = step
        return pick

    def _interval(self, scores: dict[str, float], ranked: list[str], step_ms: dict[str, float] | None) -> float:
        """Steps of a bucket between two runs of its runner-up ``ranked[1]``."""
        if step_ms is None:
            return self.explore_every
        best, runner = ranked[0], ranked[1]
        loss = self.explore_steps * step_ms[runner] * max(0.0, 1.0 - scores[runner] / scores[best])
        return max(self.explore_every, loss / (self.explore_share * step_ms[best]))
