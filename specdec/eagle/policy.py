"""Adaptive speculation's choice: which tree shape, or none, decodes the next step fastest.

For a batch of ``bs`` requests with ``ctx`` tokens of context on average, each candidate is scored
by expected committed tokens per millisecond::

    plain           1 / step_ms("plain", bs, ctx)
    (S, K, N)       E[committed | (S, K, N), acceptance statistics] / step_ms("SxKxN", bs, ctx)

E[committed] comes from the online acceptance hazards by depth, parent rank and rank
(``specdec.eagle.acceptance``), scaled per shape by how the shape's observed acceptance compared
with that static estimate (the dynamic tree ranks by the draft's confidence and commits more),
starting from the ratio a reference head's recorded trees give (``prior_calibration``).
Step times come from ``StepCosts``: a table measured at start-up (``specdec.engine.spec_profile``)
of milliseconds per decode step by batch size at a short context, plus a per-shape slope for
every token of context each request attends to, each scaled by how long that choice's steps
actually take as the server runs them (``StepTimeCalibration``: the host's whole loop, its
scheduling, stop checks and detokenizing included, which the start-up profile does not see). So
that every choice's figure stays current, the runner-up of a batch-size bucket is tried for a few
steps in a row every ``explore_every`` steps of it (at 80 MT-bench requests on the H200 the profile
alone kept speculating at 0.74x plain decoding, 2026-11-28).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from pathlib import Path

from specdec.config import SpecConfig
from specdec.eagle.acceptance import AcceptanceModel, AcceptanceStats, PathObservations
from specdec.eagle.served import PLAIN, RunnerUpExplorer, StepTimeCalibration  # noqa: F401 (re-exported)


@dataclasses.dataclass(frozen=True, order=True)
class SpecShape:
    num_steps: int
    topk: int
    num_draft_tokens: int

    @property
    def name(self) -> str:
        return f"{self.num_steps}x{self.topk}x{self.num_draft_tokens}"

    @classmethod
    def parse(cls, name: str) -> "SpecShape":
        try:
            steps, topk, ntok = (int(x) for x in name.split("x"))
        except ValueError:
            raise ValueError(f"tree shape {name!r}: expected STEPSxTOPKxDRAFT_TOKENS, e.g. 3x1x4") from None
        return cls(steps, topk, ntok)


def candidate_shapes(config: SpecConfig) -> list[SpecShape]:
    """The shapes adaptive speculation chooses among, bounded by the configured (S, K, N): chains
    of depth 1, 2, 3, 5 and S that fit (depth <= S, depth + 1 <= N); where K >= 2, trees of as many
    nodes as the chains of depth 2 and 3 over the draft's top 2 (d, 2, d + 1): the same verify, and
    the draft's own ranking puts a node where it is surest, commits more (3x2x4 2.48 tokens a step
    against the chain's 2.42, SmolLM2's head on MT-bench); for a configured tree wider than (5, 4,
    8), the middle tree (5, 4, 8) too; for a tree of more than 32 nodes, its 32-node cut (S, K, 32)
    (a verify of 32 rows costs much less than one of 48-64 from bs 2 on); and the configured shape."""
    s, k, n = config.num_steps, config.topk, config.num_draft_tokens
    shapes = {SpecShape(d, 1, d + 1) for d in (1, 2, 3, 5, s) if d <= s and d + 1 <= n}
    if k >= 2:
        shapes |= {SpecShape(d, 2, d + 1) for d in (2, 3) if d <= s and d + 1 <= n}
    middle = SpecShape(min(s, 5), min(k, 4), min(n, 8))
    if middle.topk > 1 and middle.num_draft_tokens > middle.num_steps + 1:
        shapes.add(middle)
    if k > 1 and n > 32 >= s + 1:
        shapes.add(SpecShape(s, k, 32))
    shapes.add(SpecShape(s, k, n))
    return sorted(shapes)


# a shape is captured in CUDA graphs, and chosen, only at batch sizes whose verify has at most this
# many rows (bs x num_draft_tokens): past the roofline ridge (about 300 rows for bf16 on an H100) a
# verify costs in proportion to its rows, and a tree of N nodes buys far less than N / 4 times a
# 4-token chain's tokens. On the H100 no shape won a cell above 512 rows (2026-11-26-h100-adaptive),
# while capturing every shape at every size held 15 GB of graphs bounded by (6, 8, 48).
MAX_VERIFY_ROWS = 512


def graph_batch_sizes(shape: SpecShape, batch_sizes: list[int], max_verify_rows: int | None) -> list[int]:
    """The batch sizes of ``batch_sizes`` whose verify of ``shape`` has at most ``max_verify_rows``
    rows (None or 0: all of them), and always the smallest."""
    sizes = sorted(batch_sizes)
    if not max_verify_rows:
        return sizes
    return [bs for bs in sizes if bs * shape.num_draft_tokens <= max_verify_rows] or sizes[:1]


def _interpolate(points: dict[int, float], bs: int) -> float:
    """``points`` (by batch size) at ``bs``: linear between measured sizes; past the largest, the last
    segment's per-request cost continues (never falling: timing noise can make it negative); below the
    smallest, the smallest's."""
    sizes = sorted(points)
    i = bisect.bisect_left(sizes, bs)
    if i < len(sizes) and sizes[i] == bs:
        return points[bs]
    if i == 0:
        return points[sizes[0]]
    if i == len(sizes):
        lo, hi = (sizes[-2], sizes[-1]) if len(sizes) > 1 else (0, sizes[-1])
        per_req = max((points[hi] - points.get(lo, 0.0)) / (hi - lo), 0.0)
        return points[hi] + per_req * (bs - hi)
    lo, hi = sizes[i - 1], sizes[i]
    return points[lo] + (points[hi] - points[lo]) * (bs - lo) / (hi - lo)


def _per_token(by_bs: dict[int, float] | None, bs: int) -> float:
    """A slope at ``bs`` (per request: flat past the largest measured batch size), 0 if none, never negative."""
    return max(_interpolate(by_bs, min(bs, max(by_bs))), 0.0) if by_bs else 0.0


@dataclasses.dataclass
class StepCosts:
    """Milliseconds per decode step: ``table[name][bs]`` at ``base_ctx`` tokens of context, plus
    ``slope[name][bs]`` ms for every further token of context of every request in the batch up to
    ``long_ctx``, and ``slope_far[name][bs]`` ms for every token past it (both interpolated linearly
    between measured batch sizes, extrapolated past the largest; without a far slope at a batch
    size, the near one). One slope from 64 to 1 k tokens underestimated a 32-node tree at bs 8 and
    4 k tokens by 6 % (H100, 2026-11-26), enough to pick it over the 8-node tree that was 9 % faster.
    """

    table: dict[str, dict[int, float]]
    slope: dict[str, dict[int, float]]
    base_ctx: int = 0
    slope_far: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)
    long_ctx: int = 0
    # (name, bs) -> ``_coefficients``: the policy scores every shape before every decode step, and the
    # interpolations cost more than the arithmetic (a profile is not changed once built)
    _cache: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def step_ms(self, name: str, bs: int, ctx: float) -> float:
        coefficients = self._cache.get((name, bs))
        if coefficients is None:
            coefficients = self._cache[(name, bs)] = self._coefficients(name, bs)
        ms, near, far, far_from = coefficients
        return ms + near * max(min(ctx, far_from) - self.base_ctx, 0.0) + far * max(ctx - far_from, 0.0)

    def _coefficients(self, name: str, bs: int) -> tuple[float, float, float, float]:
        """(ms at ``base_ctx``, ms a token of context up to ``far_from``, ms a token past it, ``far_from``)."""
        near = _per_token(self.slope.get(name), bs) * bs
        ms = _interpolate(self.table[name], bs)
        far = self.slope_far.get(name)
        if not (far and self.long_ctx and bs <= max(far)):
            return ms, near, 0.0, float("inf")
        return ms, near, _per_token(far, bs) * bs, float(self.long_ctx)

    def to_json(self) -> dict:
        def points(table: dict[str, dict[int, float]]) -> dict:
            return {name: {str(bs): ms for bs, ms in by_bs.items()} for name, by_bs in table.items()}

        return {"base_ctx": self.base_ctx, "slope": points(self.slope), "table": points(self.table),
                "long_ctx": self.long_ctx, "slope_far": points(self.slope_far)}

    @classmethod
    def from_json(cls, data: dict) -> "StepCosts":
        def points(table: dict) -> dict[str, dict[int, float]]:
            return {name: {int(bs): float(ms) for bs, ms in by_bs.items()} for name, by_bs in table.items()}

        return cls(table=points(data["table"]), slope=points(data["slope"]), base_ctx=int(data.get("base_ctx", 0)),
                   slope_far=points(data.get("slope_far", {})), long_ctx=int(data.get("long_ctx", 0)))

    @classmethod
    def load(cls, path: str | Path) -> "StepCosts":
        return cls.from_json(json.loads(Path(path).read_text()))


class AdaptivePolicy:
    """Chooses a shape (or None: plain decoding) per step, and learns acceptance as steps are read.

    NOTE: ``choose`` runs on the host before every step, so it only divides cached estimates by
    interpolated costs; the estimates are rebuilt from the statistics every ``refresh_every`` reads.
    """

    def __init__(self, shapes: list[SpecShape], costs: StepCosts, prior: AcceptanceModel, *,
                 max_batch: dict[str, int] | None = None, calibration_weight: float = 256.0,
                 refresh_every: int = 16, prior_calibration: dict[str, float] | None = None,
                 learn_step_times: bool = True, explore_every: int = 64) -> None:
        """``max_batch``: the largest batch size at which a shape (by name) may be chosen (absent:
        any): where its CUDA graphs end (``graph_batch_sizes``). Read at every choice, not copied:
        the adaptive worker passes its own dict and updates it when graphs are captured or released.
        ``prior_calibration``: each shape's committed tokens over its static estimate before any
        step of it is read (absent: 1): a real draft's ranking commits more than the static one,
        most for small trees, which would otherwise never be tried.
        ``learn_step_times``: scale the profile by the steps' observed times (``observe_step``) and
        try each bucket's runner-up every ``explore_every`` steps. NOTE: off where several
        tensor-parallel ranks each choose (they must make the same choice, and their clocks differ);
        rank 0 turns it on (``learn_served_step_times``) once the other ranks take its choices."""
        missing = [n for n in [PLAIN] + [s.name for s in shapes] if n not in costs.table]
        if missing:
            raise ValueError(f"adaptive speculation: no step costs for {', '.join(missing)}")
        self.shapes = shapes
        self.costs = costs
        self.max_batch = {} if max_batch is None else max_batch
        self.stats = AcceptanceStats(prior)
        # a shape's observed / estimated committed tokens starts at 1 with this many tokens' weight
        self.calibration_weight = calibration_weight
        self.refresh_every = refresh_every
        self.prior_calibration = {s.name: (prior_calibration or {}).get(s.name, 1.0) for s in shapes}
        self.observed = {s.name: 0.0 for s in shapes}  # summed mean committed tokens of its steps
        self.predicted = {s.name: 0.0 for s in shapes}  # summed static estimates of those steps
        self.chosen: dict[str, int] = {}  # steps by choice, plain included
        self.explore_every = explore_every
        self.step_times: StepTimeCalibration | None = None
        self.explorer: RunnerUpExplorer | None = None
        if learn_step_times:
            self.learn_served_step_times()
        self._reads = 0
        self._refresh()

    def learn_served_step_times(self) -> None:
        """From now on scale the profile by the served steps' times and try runner-ups."""
        if self.step_times is None:
            self.step_times = StepTimeCalibration()
            # NOTE: a runner-up runs 3 steps in a row: the worker times a step only when the one
            # before it made the same choice (``specdec.eagle.served.LaunchClock``)
            self.explorer = RunnerUpExplorer(explore_every=self.explore_every)

    def _refresh(self) -> None:
        model = self.stats.model()
        self._static = {s.name: model.expected_committed(s.num_steps, s.topk, s.num_draft_tokens)
                        for s in self.shapes}
        w = self.calibration_weight
        self._expected = {name: est * (self.observed[name] + w * self.prior_calibration[name])
                          / (self.predicted[name] + w) for name, est in self._static.items()}

    def expected_committed(self, shape: SpecShape) -> float:
        return self._expected[shape.name]

    def step_ms(self, name: str, bs: int, ctx: float) -> float:
        """A step's expected milliseconds: the profile's, scaled by what the served steps took."""
        ms = self.costs.step_ms(name, bs, ctx)
        return ms * self.step_times.ratio(name, bs) if self.step_times is not None else ms

    def scores(self, bs: int, ctx: float) -> dict[str, float]:
        """Expected committed tokens per ms of every candidate at ``bs``, plain included."""
        out = {PLAIN: 1.0 / self.step_ms(PLAIN, bs, ctx)}
        for shape in self.shapes:
            if bs <= self.max_batch.get(shape.name, bs):
                out[shape.name] = self._expected[shape.name] / self.step_ms(shape.name, bs, ctx)
        return out

    def explain(self, bs: int, ctx: float) -> dict[str, dict[str, float]]:
        """What the choice at ``bs`` rests on, per candidate (diagnostics): expected committed tokens,
        the profile's ms, the served / profile ratio learned (1: none observed), the score."""
        scores = self.scores(bs, ctx)
        out = {}
        for name, score in sorted(scores.items(), key=lambda kv: -kv[1]):
            ratio = self.step_times.ratio(name, bs) if self.step_times is not None else 1.0
            out[name] = {"tokens": 1.0 if name == PLAIN else self._expected[name],
                         "profile_ms": self.costs.step_ms(name, bs, ctx), "served_ratio": ratio,
                         "tokens_per_ms": score}
        return out

    def choose(self, bs: int, ctx: float) -> SpecShape | None:
        scores = self.scores(bs, ctx)
        pick = self.explorer.pick(scores, bs) if self.explorer is not None else max(scores, key=scores.get)
        self.chosen[pick] = self.chosen.get(pick, 0) + 1
        return None if pick == PLAIN else next(s for s in self.shapes if s.name == pick)

    def observe_step(self, name: str, bs: int, ctx: float, ms: float) -> None:
        """A served decode step of choice ``name`` (plain or a shape) took ``ms`` from its launch to
        the next step's launch."""
        if self.step_times is not None:
            self.step_times.observe(name, bs, ms / self.costs.step_ms(name, bs, ctx))

    def record(self, shape: SpecShape, committed: list[int], paths: PathObservations | None) -> None:
        """A read verify step of ``shape``: its committed tokens per request and path observations."""
        if committed:
            self.observed[shape.name] += sum(committed) / len(committed)
            self.predicted[shape.name] += self._static[shape.name]
        if paths is not None:
            self.stats.update(paths)
        self._reads += 1
        if self._reads % self.refresh_every == 0:
            self._refresh()
