"""NgramPolicy: each NGRAM step's choice, plain decoding or a verify of n nodes a request, by
expected committed tokens per millisecond of served step time (adaptive on, one rank).

    score(plain)     1 / ms(plain, bs)
    score(ngram n)   mean over the batch of E[committed | row, n] / ms(ngram n, bs)

E[committed | row, n] from the row's acceptance rate p (accepted nodes over accepted nodes plus
rejections, a decaying count that starts from the rate of all rows; counted on the row's lookup steps,
and on its plain steps one shadow trial a step: the worker's ``_observe_shadow_trials``) and its draft
depth d within n - 1 nodes. The depth, where the worker gives it (``reach``), is the row's own: how many tokens
a lookup would draft from the history the host has when it chooses (a cheap chain lookup: 0 without a match,
past every size with one, since a draft continues the repeat it found past the history's end):

    history up to date      E = 1 + p + p^2 + ... + p^d              d = min(reach, n - 1)
    a step still in flight  E = 1 + p (p + p^2 + ... + p^d)          d = min(reach - 1, n - 1)

(in flight: the match predicts the unread step's token too, right with probability about p, and
spends one token of its reach on it). A row with no match expects 1 token plus what such rows
accepted lately (blind rows, below): 1 where they accept nothing, as plain decoding gives it, so a
copied span is taken up the step after it begins and left the step after it ends. Without
``reach`` (the cross-request cache on: rows without a match of their own may still draft), d is the
row's decaying mean depth of its drafted trees' first m nodes, m = 0 .. N - 1.

Blind rows: a row whose reach is 0 when the host chooses may still draft when the lookup runs (device
lookups run after the unread step, which the host's history lacks; a host lookup reads it first), so
it expects the decaying mean of what blind rows of earlier lookup steps accepted, not 0.

Drafted tokens' calibration (of the model's rows): the model above is a guess (a match's reach is
not what the row's tree drafts, acceptance is not geometric, and the steps the policy picks are
those it guessed high on), so every lookup step it chose is checked when read, its mean
drafted-and-accepted tokens a row with a reach against the model's guess for that step (a lookup
that found no match: 0 against the guess), and the drafted part of every later guess is scaled by
their decaying ratio:

    E' = 1 + scale (E - 1),   scale = sum realized / sum guessed, within SCALE_CLIP

both sums decaying by SCALE_DECAY a step from SCALE_PRIOR. (Without it, on the H200 with SmolLM2-135M,
HumanEval at 32 requests, the policy's lookups committed about 12 tokens a millisecond against its plain
steps' 29: benchmarks/results/2026-11-29-h200-ngram-ahead, rows_cc2bd64.jsonl.)

Step times are learned online (``specdec.eagle.served``): each choice's served time per
batch-size bucket, launch to next launch, timed only after a step of the same choice, and each
bucket's runner-up run for 3 steps every ``explore_every`` or more (a run's expected loss held to 2 %
of the served time between runs: ``RunnerUpExplorer``). There is no start-up profile: a
choice's reference time is ``prior_factor`` times the bucket's anchor (the first timed step's
plain-equivalent time), and ``StepTimeCalibration`` learns the ratio of the served times to it,
so before a choice is timed the ranking follows the prior factors.

NOTE: host-clock times differ between tensor-parallel ranks, which must choose alike: the worker
builds no policy there (the acceptance-only ``DraftBudget`` rule decides).
"""

from __future__ import annotations

import numpy as np

from specdec.eagle.served import PLAIN, RunnerUpExplorer, StepTimeCalibration, bucket
from specdec.ngram.config import NgramConfig

# a verify step's prior cost in plain steps: a fixed host and launch overhead, plus its rows
VERIFY_OVERHEAD = 1.5
ROWS_PER_PLAIN_STEP = 256
# the acceptance rate before any step is read, with this many draft tokens' weight
PRIOR_RATE, PRIOR_WEIGHT = 0.6, 8.0
LOOKUP = "lookup"  # any verify size, to the explorer
DECAY = 0.9  # per read step, for a row's statistics and for those of all rows
SCALE_DECAY = 0.98  # per read lookup step, for the drafted tokens' calibration
SCALE_PRIOR = 4.0  # drafted tokens a row, guessed and realized, before any lookup step is read
SCALE_CLIP = (0.1, 2.0)
# a blind row's accepted draft tokens before any is read, with this many rows' weight
BLIND_PRIOR, BLIND_PRIOR_ROWS = 0.5, 8.0


def size_name(n: int) -> str:
    return f"ngram{n}"


def prior_factor(name: str, bs: int) -> float:
    if name == PLAIN:
        return 1.0
    return VERIFY_OVERHEAD + bs * int(name.removeprefix("ngram")) / ROWS_PER_PLAIN_STEP


class NgramPolicy:
    def __init__(self, config: NgramConfig, sizes: list[int], max_reqs: int, *, explore_every: int = 64) -> None:
        self.sizes = sizes
        width = config.num_draft_tokens
        self.hits = np.zeros(max_reqs)  # [max_reqs] decaying accepted draft tokens
        self.misses = np.zeros(max_reqs)  # [max_reqs] decaying rejections
        self.all_hits, self.all_misses = PRIOR_RATE * PRIOR_WEIGHT, (1 - PRIOR_RATE) * PRIOR_WEIGHT
        self.all_depth = np.arange(width, dtype=np.float64)  # [N] a chain until trees are seen
        self.depth = np.tile(self.all_depth, (max_reqs, 1))  # [max_reqs, N] decaying depth of the first m nodes
        self.step_times = StepTimeCalibration(prior_weight=1.0)
        self.explorer = RunnerUpExplorer(explore_every=explore_every)
        self.anchor: dict[int, float] = {}  # bucket -> ms of a plain step, from the first timed step
        self.chosen: dict[str, int] = {}  # steps by choice
        self.guessed_sum = self.realized_sum = SCALE_PRIOR  # decaying drafted-and-accepted tokens a row
        self.guesses: dict[int, float] = {}  # verify size -> the last choice's guess of drafted tokens a row
        self.last_blind = np.zeros(0, dtype=bool)  # [bs] the last choice's rows without a reach
        self.blind_sum, self.blind_weight = BLIND_PRIOR * BLIND_PRIOR_ROWS, BLIND_PRIOR_ROWS
        # totals over the policy's life (diagnostics): lookup steps read, those that found no match,
        # guessed and realized drafted-and-accepted tokens a row summed over them
        self.totals = {"lookups": 0, "misses": 0, "guessed": 0.0, "realized": 0.0}

    def reset(self, rows: list[int]) -> None:
        """New requests in ``rows`` start from the statistics of all rows."""
        self.hits[rows] = 0.0
        self.misses[rows] = 0.0
        self.depth[rows] = self.all_depth

    def scale(self) -> float:
        """The drafted tokens' calibration: realized over guessed (module docstring)."""
        return min(max(self.realized_sum / self.guessed_sum, SCALE_CLIP[0]), SCALE_CLIP[1])

    def step_ms(self, name: str, bs: int) -> float:
        return self.anchor.get(bucket(bs), 1.0) * prior_factor(name, bs) * self.step_times.ratio(name, bs)

    def expected_committed(self, rows: np.ndarray, n: int, reach: np.ndarray | None = None,
                           in_flight: bool = False) -> float:
        """Mean E[committed] of ``rows`` in a verify of ``n`` nodes a request (module docstring);
        ``reach`` [len(rows)]: the tokens after each row's latest match (0: none), None: the
        learned depths; ``in_flight``: a step not yet read precedes this one."""
        modeled, blind, _ = self._drafted(rows, [n], reach, in_flight)
        return 1.0 + self.scale() * modeled[0] + blind[0]

    def blind_mean(self) -> float:
        """Accepted draft tokens a blind row (no reach at the choice) realized, a decaying mean."""
        return self.blind_sum / self.blind_weight

    def _drafted(self, rows: np.ndarray, sizes: list[int], reach: np.ndarray | None,
                 in_flight: bool) -> tuple[list[float], list[float], np.ndarray]:
        """Mean drafted-and-accepted tokens a row for each size, ([S], [S]): the model's over the rows
        with a reach (unscaled), and the blind rows' learned mean; and which rows are blind ([bs] bool)."""
        if len(rows) == 1:
            return self._drafted_row(int(rows[0]), sizes, None if reach is None else int(reach[0]), in_flight)
        rate = self.all_hits / (self.all_hits + self.all_misses)
        p = (self.hits[rows] + PRIOR_WEIGHT * rate) / (self.hits[rows] + self.misses[rows] + PRIOR_WEIGHT)
        p = np.minimum(p, 0.999)[:, None]  # [bs, 1]
        depth = np.asarray(sizes, dtype=np.int64) - 1  # [S] the deepest draft node a size verifies
        if reach is None:
            d, in_flight = self.depth[rows][:, depth], False  # [bs, S]
            blind = np.zeros(len(rows), dtype=bool)
        else:
            d = np.maximum(np.minimum(reach[:, None] - int(in_flight), depth[None, :]), 0)  # [bs, S]
            blind = reach - int(in_flight) <= 0  # [bs]
        drafted = p * (1.0 - p ** d) / (1.0 - p)  # p + ... + p^d
        if in_flight:
            drafted = p * drafted
        # NOTE: reductions by ufunc, not ndarray.mean / np.clip (their Python wrappers cost more than the
        # arithmetic at a few rows)
        modeled = np.add.reduce(np.where(blind[:, None], 0.0, drafted), axis=0) / len(rows)
        blind_part = np.count_nonzero(blind) / len(rows) * np.minimum(self.blind_mean(), depth)
        return modeled.tolist(), blind_part.tolist(), blind

    def _drafted_row(self, row: int, sizes: list[int], reach: int | None,
                     in_flight: bool) -> tuple[list[float], list[float], np.ndarray]:
        """``_drafted`` of one row in Python floats: the same model, for the host's choice before every decode
        step at one request, where numpy's per-call cost was most of the choice's (18 of 30 us, CPU)."""
        rate = self.all_hits / (self.all_hits + self.all_misses)
        hits = float(self.hits[row])
        p = min((hits + PRIOR_WEIGHT * rate) / (hits + float(self.misses[row]) + PRIOR_WEIGHT), 0.999)
        if reach is None:
            depths, blind, lead = [float(self.depth[row, n - 1]) for n in sizes], False, 1.0
        else:
            ahead = reach - int(in_flight)
            depths, blind, lead = [max(min(ahead, n - 1), 0) for n in sizes], ahead <= 0, p if in_flight else 1.0
        if blind:
            mean = self.blind_mean()
            return [0.0] * len(sizes), [min(mean, n - 1) for n in sizes], np.ones(1, dtype=bool)
        modeled = [lead * p * (1.0 - p ** d) / (1.0 - p) for d in depths]  # (lead: p when a step is in flight)
        return modeled, [0.0] * len(sizes), np.zeros(1, dtype=bool)

    def scores(self, rows: np.ndarray, bs: int, max_size: int, reach: np.ndarray | None = None,
               in_flight: bool = False) -> dict[str, float]:
        """Committed tokens a millisecond of each choice: plain and every size up to ``max_size``."""
        return self._scored(rows, bs, max_size, reach, in_flight)[0]

    def _scored(self, rows: np.ndarray, bs: int, max_size: int, reach: np.ndarray | None,
                in_flight: bool) -> tuple[dict[str, float], dict[str, float]]:
        """``scores``, and the step time of each choice they rest on."""
        step_ms = {PLAIN: self.step_ms(PLAIN, bs)}
        out = {PLAIN: 1.0 / step_ms[PLAIN]}
        sizes = [n for n in self.sizes if n <= max_size]
        self.guesses = {}
        if sizes:
            modeled, blind, self.last_blind = self._drafted(rows, sizes, reach, in_flight)
            scale = self.scale()
            for n, guess, blind_tokens in zip(sizes, modeled, blind):
                name = size_name(n)
                step_ms[name] = self.step_ms(name, bs)
                out[name] = (1.0 + scale * guess + blind_tokens) / step_ms[name]
                self.guesses[n] = guess  # unscaled: the calibration learns the model's bias
        return out, step_ms

    def choose(self, rows: np.ndarray, bs: int, max_size: int, reach: np.ndarray | None = None,
               in_flight: bool = False) -> int:
        """The largest verify size (nodes a request, root included) this step may take, 0: plain.
        ``max_size``: the largest size allowed at ``bs`` (0: none); ``reach``, ``in_flight``: as for
        ``expected_committed``. The step runs plain or the best size; exploration tries the other
        of the two, the sizes counted as one choice (sizes of near-equal scores would otherwise
        take turns as the runner-up, each run of them a cost)."""
        scores, ms = self._scored(rows, bs, max_size, reach, in_flight)
        sizes = {name: score for name, score in scores.items() if name != PLAIN}
        best = max(sizes, key=sizes.get) if sizes else None
        pair = {PLAIN: scores[PLAIN]} | ({LOOKUP: sizes[best]} if best else {})
        step_ms = {PLAIN: ms[PLAIN]} | ({LOOKUP: ms[best]} if best else {})
        pick = best if self.explorer.pick(pair, bs, step_ms) == LOOKUP else PLAIN
        self.chosen[pick] = self.chosen.get(pick, 0) + 1
        return 0 if pick == PLAIN else int(pick.removeprefix("ngram"))

    def explain(self, bs: int) -> dict[str, float]:
        """What the choice at ``bs`` rests on (diagnostics): each choice's step time as learned ("ms", a
        prior where none was observed: "prior ms"), the drafted tokens' calibration and the blind rows' mean."""
        out = {}
        for name in [PLAIN] + [size_name(n) for n in self.sizes]:
            out[f"{name} {'ms' if self.step_times.observed(name, bs) else 'prior ms'}"] = self.step_ms(name, bs)
        return out | {"scale": self.scale(), "blind": self.blind_mean()}

    def guess(self, n: int) -> float | None:
        """The last choice's guess (unscaled) of drafted-and-accepted tokens a row for a verify of ``n``
        nodes a request, or of the largest size it scored at most ``n`` (None: it scored none)."""
        fitting = [size for size in self.guesses if size <= n]
        return self.guesses[max(fitting)] if fitting else None

    def observe_blind(self, accepted: np.ndarray) -> None:
        """A read lookup step's blind rows (``last_blind`` at its choice): their accepted draft tokens."""
        self.blind_sum = SCALE_DECAY * self.blind_sum + float(np.sum(accepted))
        self.blind_weight = SCALE_DECAY * self.blind_weight + len(accepted)

    def observe_outcome(self, guessed: float, realized: float, *, miss: bool = False) -> None:
        """A lookup step the policy chose: its guess (``guess``) and its rows' accepted draft tokens, the
        blind rows' counted as 0, a row's mean (read; ``miss``: it found no match and decoded plainly, 0)."""
        self.guessed_sum = SCALE_DECAY * self.guessed_sum + guessed
        self.realized_sum = SCALE_DECAY * self.realized_sum + realized
        self.totals["lookups"] += 1
        self.totals["misses"] += int(miss)
        self.totals["guessed"] += guessed
        self.totals["realized"] += realized

    def observe_step(self, name: str, bs: int, ms: float) -> None:
        """A served step of ``name`` took ``ms`` from its launch to the next launch."""
        b = bucket(bs)
        if b not in self.anchor:
            self.anchor[b] = ms / prior_factor(name, bs)
        self.step_times.observe(name, bs, ms / (self.anchor[b] * prior_factor(name, bs)))

    def observe_drafts(self, rows: np.ndarray, depth: np.ndarray) -> None:
        """Each row's trees as drafted (before the step's cut): ``depth`` [len(rows), N], column m
        the depth of its first m nodes."""
        self.depth[rows] = DECAY * self.depth[rows] + (1 - DECAY) * depth
        self.all_depth = DECAY * self.all_depth + (1 - DECAY) * depth.mean(0)

    def observe_trial(self, row: int, came: bool) -> None:
        """One verified draft token of one row (the worker's shadow trial): ``observe_accepts`` of a one-node
        draft, in Python floats."""
        hit, miss = float(came), float(not came)
        self.hits[row] = DECAY * self.hits[row] + hit
        self.misses[row] = DECAY * self.misses[row] + miss
        self.all_hits = DECAY * self.all_hits + hit
        self.all_misses = DECAY * self.all_misses + miss

    def observe_accepts(self, rows: np.ndarray, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """A read verify step: each row's verified draft depth and accepted draft tokens."""
        live = drafted > 0
        if not live.any():
            return
        rows, drafted, accepted = rows[live], drafted[live], accepted[live]
        missed = (accepted < drafted).astype(np.float64)
        self.hits[rows] = DECAY * self.hits[rows] + accepted
        self.misses[rows] = DECAY * self.misses[rows] + missed
        self.all_hits = DECAY * self.all_hits + accepted.mean()
        self.all_misses = DECAY * self.all_misses + missed.mean()
