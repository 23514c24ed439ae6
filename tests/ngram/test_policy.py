"""NGRAM's cost-aware choice (specdec/ngram/policy.py, the worker's launch timing): plain decoding
when served verify steps are slow for what they commit, lookups when acceptance pays, learned
from a fake clock; and greedy output equal to plain decoding with the choice on (CPU)."""

import types

import numpy as np
import pytest

from specdec.eagle import served
from specdec.eagle.served import PLAIN, LaunchClock
from specdec.ngram.config import NgramConfig
from specdec.ngram.policy import NgramPolicy, size_name
from specdec.ngram import worker as worker_module
from specdec.ngram.worker import NgramWorker

CONFIG = NgramConfig(num_draft_tokens=9, max_match_window=4)
SIZES = [2, 3, 5, 9]


def _worker(monkeypatch, now):
    """An NgramWorker's policy and launch clock alone, on a fake clock."""
    worker = NgramWorker.__new__(NgramWorker)
    worker.policy, worker._clock = NgramPolicy(CONFIG, SIZES, 8), LaunchClock()
    monkeypatch.setattr(served.time, "perf_counter", lambda: now[0])
    return worker


def _serve(worker, now, *, steps, bs, served_ms, accept_rate, depth=8):
    """Run ``steps`` steps: each launch times the last; a verify step's rows draft ``depth``-deep
    chains and accept a geometric ``accept_rate`` share (expected, as fractional counts)."""
    rows = np.arange(bs)
    picks = []
    for _ in range(steps):
        size = worker.policy.choose(rows, bs, max(SIZES))
        name = PLAIN if size == 0 else size_name(size)
        worker._time_launch(name, bs, now[0])
        picks.append(name)
        if size:
            drafted = np.full(bs, min(depth, size - 1))
            worker.policy.observe_drafts(rows, np.tile(np.minimum(np.arange(9), depth), (bs, 1)))
            accepted = np.floor(drafted * accept_rate + 1e-9).astype(np.int64)
            worker.policy.observe_accepts(rows, drafted, accepted)
        now[0] += served_ms(name) / 1e3
    return picks


def test_slow_verify_steps_turn_the_choice_to_plain(monkeypatch):
    """A verify step takes 5x a plain one and commits about 2.6 tokens: plain decoding wins, the
    runner-up is still tried in runs of 3 every 64 steps of the bucket."""
    now = [0.0]
    worker = _worker(monkeypatch, now)
    picks = _serve(worker, now, steps=600, bs=4, served_ms=lambda name: 1.0 if name == PLAIN else 5.0,
                   accept_rate=0.2)
    assert picks[0] != PLAIN  # the prior tries lookups first
    tail = picks[-256:]
    assert tail.count(PLAIN) >= 256 - 4 * 3 - 3


def test_high_acceptance_keeps_lookups(monkeypatch):
    """Every draft token accepted (8 a step) at 1.8x a plain step's time: the largest verify wins."""
    now = [0.0]
    worker = _worker(monkeypatch, now)
    picks = _serve(worker, now, steps=400, bs=4, served_ms=lambda name: 1.0 if name == PLAIN else 1.8,
                   accept_rate=1.0)
    tail = picks[-200:]
    assert tail.count(size_name(9)) >= 200 - 4 * 3 - 3
    assert worker.policy.expected_committed(np.arange(4), 9) > 7


def test_rows_without_matches_decode_plainly(monkeypatch):
    """Lookups that find nothing (depth 0) commit one token at a verify's cost: plain wins."""
    now = [0.0]
    worker = _worker(monkeypatch, now)
    picks = _serve(worker, now, steps=300, bs=2, served_ms=lambda name: 1.0 if name == PLAIN else 1.5,
                   accept_rate=1.0, depth=0)
    assert picks[-100:].count(PLAIN) >= 100 - 2 * 3 - 3


def test_a_new_row_starts_from_all_rows_statistics():
    policy = NgramPolicy(CONFIG, SIZES, 8)
    rows = np.arange(4)
    for _ in range(50):
        policy.observe_drafts(rows, np.tile(np.arange(9), (4, 1)))
        policy.observe_accepts(rows, np.full(4, 8), np.full(4, 8))
    policy.reset([6])
    assert policy.expected_committed(np.asarray([6]), 9) == pytest.approx(
        policy.expected_committed(rows, 9), rel=0.2)


@pytest.mark.parametrize("breadth", [1, 3])
def test_greedy_equals_plain_with_the_cost_aware_choice(breadth):
    """--speculative-adaptive on (the cost-aware choice on CPU, real clock): whatever it picks, a
    batch of 9 (the chain's batch path) decodes as plain decoding does."""
    from tests.e2e.helpers import assert_no_leak, make_pair
    from tests.e2e.test_ngram import ngram_engine, plain_engine, repetitive_prompts

    target, _ = make_pair("EAGLE", "mixed")
    vocab = target.config.vocab_size
    prompts = repetitive_prompts(vocab) + repetitive_prompts(vocab, seed=3)[:4]
    params = [{"temperature": 0, "max_new_tokens": 12 + 3 * i, "ignore_eos": True} for i in range(len(prompts))]
    expected = plain_engine(target).generate(input_ids=prompts, sampling_params=params)
    eng = ngram_engine(target, speculative_adaptive="on", speculative_ngram_max_bfs_breadth=breadth)
    assert eng.worker.policy is not None
    got = eng.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in expected]
    assert_no_leak(eng)


def test_reach_decides_where_a_copied_span_begins_and_ends():
    """With each row's reach (tokens after its latest match) the choice follows the history as it
    stands: no match, plain; a long one, a lookup; before any step is timed (the prior costs)."""
    policy = NgramPolicy(CONFIG, SIZES, 8)
    one = np.asarray([0])
    assert policy.choose(one, 1, 9, reach=np.asarray([0])) == 0
    assert policy.choose(one, 1, 9, reach=np.asarray([8])) == 9
    assert policy.choose(one, 1, 9, reach=np.asarray([1]), in_flight=True) == 0  # the reach spent on the unread token
    assert policy.choose(one, 1, 9, reach=np.asarray([8]), in_flight=True) == 9


@pytest.mark.parametrize("in_flight", [False, True])
def test_expected_committed_from_reach(in_flight):
    """1 + p + ... + p^d with d = min(reach, n - 1); in flight p (p + ... + p^d), d one less."""
    policy = NgramPolicy(CONFIG, SIZES, 8)
    rows = np.arange(3)
    for _ in range(40):  # rows 0-2 accept 3 of 4 drafted tokens: p -> 0.75
        policy.observe_accepts(rows, np.full(3, 4), np.full(3, 3))
    rate = (policy.hits[0] + 8.0 * policy.all_hits / (policy.all_hits + policy.all_misses)) / (
        policy.hits[0] + policy.misses[0] + 8.0)
    reach = np.asarray([0, 3, 20])
    got = policy.expected_committed(rows, 5, reach, in_flight)
    depths = np.clip(np.minimum(reach - int(in_flight), 4), 0, None)
    tails = [sum(rate ** i for i in range(1, d + 1)) for d in depths]
    blind = policy.blind_mean()  # a row without a reach: what blind rows accepted (the prior before any)
    want = np.mean([1 + (blind if d == 0 else rate * t if in_flight else t) for d, t in zip(depths, tails)])
    assert got == pytest.approx(want)
    assert policy.expected_committed(rows[:1], 5, reach[:1], in_flight) == pytest.approx(1.0 + blind)
    for _ in range(300):  # blind rows that never accept: they expect one token, as plain decoding gives
        policy.observe_blind(np.zeros(4))
    assert policy.expected_committed(rows[:1], 5, reach[:1], in_flight) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("in_flight", [False, True])
@pytest.mark.parametrize("with_reach", [True, False])
def test_one_row_in_python_floats_equals_the_batch_arithmetic(in_flight, with_reach):
    """``_drafted`` of one row (Python floats) equals the numpy path's over two copies of that row."""
    rng = np.random.default_rng(int(in_flight) + 2 * int(with_reach))
    policy = NgramPolicy(CONFIG, SIZES, 8)
    for _ in range(50):
        rows = rng.choice(8, size=3, replace=False)
        drafted = rng.integers(0, 9, size=3)
        policy.observe_accepts(rows, drafted, np.minimum(drafted, rng.integers(0, 9, size=3)))
        policy.observe_drafts(rows, np.sort(rng.random((3, 9)) * 8, axis=1))
        policy.observe_blind(rng.integers(0, 3, size=2).astype(float))
        row, reach = int(rng.integers(8)), int(rng.integers(0, 12))
        sizes = sorted(rng.choice(SIZES, size=int(rng.integers(1, 5)), replace=False).tolist())
        one = policy._drafted(np.asarray([row]), sizes, np.asarray([reach]) if with_reach else None, in_flight)
        two = policy._drafted(np.asarray([row, row]), sizes, np.asarray([reach, reach]) if with_reach else None,
                              in_flight)
        assert one[0] == pytest.approx(two[0], rel=1e-12) and one[1] == pytest.approx(two[1], rel=1e-12)
        assert one[2].tolist() == two[2][:1].tolist()


def _reach_worker(max_reqs: int):
    """An NgramWorker's reach lookup alone, over a host token history of ``max_reqs`` rows of 64."""
    from specdec.ngram.budget import DraftBudget

    worker = NgramWorker.__new__(NgramWorker)
    worker.ngram, worker.budget, worker.policy = CONFIG, DraftBudget(CONFIG, max_reqs), None
    worker._reach_of, worker._reach_age = np.zeros(max_reqs, dtype=np.int64), 0
    worker._shadow_token, worker._shadow_at = np.zeros(max_reqs, dtype=np.int64), np.full(max_reqs, -1)
    worker.history = types.SimpleNamespace(token_ids=np.zeros((max_reqs, 64), dtype=np.int32),
                                           num_tokens=np.zeros(max_reqs, dtype=np.int64))
    return worker, worker.history


def test_reach_of_the_worker_rows():
    """NgramWorker._reach: one past the batch's node cap where the row's history has a match (its draft
    continues the repeat it found, so it fills any size; not capped by the row's budget), 0 without a match
    or a read prompt; the batch path (8+ rows) equals the per-row one."""
    worker, history = _reach_worker(16)
    rows = [[5, 6, 7, 8, 9, 1, 2, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 1, 2, 3], [4, 5, 6], []]
    for i, toks in enumerate(rows):
        history.token_ids[i, : len(toks)] = toks
        history.num_tokens[i] = len(toks)
    worker.budget.budget[:] = 1  # budgets shrunk by rejections: the reach is not capped by them
    cap = worker.budget.node_cap(4)
    assert cap == 8
    # row 0: "5 6" ends at 1 (7 tokens after it, then their repeat); row 1: "1 2 3" ends at 2; rows 2-3: none
    assert worker._reach(np.arange(4)).tolist() == [9, 9, 0, 0]  # 4 rows: looked up at every choice
    for i in range(4, 12):  # 8 more rows of random tokens: the batch path
        toks = np.random.default_rng(i).integers(0, 5, size=40)
        history.token_ids[i, :40] = toks
        history.num_tokens[i] = 40
    assert worker._reach(np.arange(12))[4:].tolist() == [0] * 8  # one choice since the refresh: not due
    batch = worker._reach(np.arange(12))  # two: due (12 rows refresh every other choice)
    assert batch.tolist() == [int(worker._look_up_reach(np.asarray([r]))[0]) for r in range(12)]
    assert (batch[4:] > 0).all()
    history.num_tokens[0] = 0  # between refreshes, the last values
    assert worker._reach(np.arange(12)).tolist() == batch.tolist()
    assert worker._reach(np.arange(12))[0] == 0


def test_reach_syncs_the_history_first():
    """Under overlap the host brings a request's history up to date only before lookups: the choice
    syncs it (``sync_history``) before looking up, so a span that began during plain steps is seen."""
    worker, history = _reach_worker(4)
    read_so_far = [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 9, 8]  # "9 8" repeats: 10 tokens follow it

    def sync():
        history.token_ids[0, : len(read_so_far)] = read_so_far
        history.num_tokens[0] = len(read_so_far)

    history.token_ids[0, :5], history.num_tokens[0] = read_so_far[:5], 5  # stale: synced at the last lookup
    assert worker._reach(np.asarray([0]))[0] == 0
    assert worker._reach(np.asarray([0]), sync_history=sync)[0] == 9  # "9 8" matches: the cap at one row (8) + 1


def _serve_overestimated(worker, now, *, steps, calibrate):
    """4 rows whose matches reach 8 tokens and whose trees draft 1 node (a budget cut by earlier
    rejections), each accepted: the reach model guesses ~9 tokens a row, a step commits 2, at 2.5x
    a plain step's time. ``calibrate``: each lookup's outcome handed to the policy, as the worker does."""
    rows, reach = np.arange(4), np.full(4, 8)
    picks = []
    for _ in range(steps):
        size = worker.policy.choose(rows, 4, max(SIZES), reach)
        name = PLAIN if size == 0 else size_name(size)
        worker._time_launch(name, 4, now[0])
        picks.append(name)
        if size:
            guess = worker.policy.guess(size)
            worker.policy.observe_accepts(rows, np.ones(4, dtype=np.int64), np.ones(4, dtype=np.int64))
            if calibrate:
                worker.policy.observe_outcome(guess, 1.0)
        now[0] += (1.0 if name == PLAIN else 2.5) / 1e3
    return picks


@pytest.mark.parametrize("calibrate", [False, True])
def test_calibration_prices_lookups_that_commit_less_than_guessed(monkeypatch, calibrate):
    """Without the outcomes the policy keeps choosing lookups that lose (the model's guess never meets
    what steps commit); with them the guess is scaled to what lookups realized and plain decoding wins,
    the lookups' runner-up runs rarer than every 64 steps (each run's loss held to 2 % of served time)."""
    now = [0.0]
    worker = _worker(monkeypatch, now)
    tail = _serve_overestimated(worker, now, steps=900, calibrate=calibrate)[-500:]
    if not calibrate:
        assert tail.count(PLAIN) < 100
        return
    # a run of 3 lookups loses 3 x 2.5 ms x (1 - 0.8): one every 75 steps, not every 64
    assert 500 - 3 * (500 // 75 + 1) <= tail.count(PLAIN) < 500
    assert worker.policy.scale() == pytest.approx(1 / 8, rel=0.25)
    assert worker.policy.totals["lookups"] > 0 and worker.policy.totals["misses"] == 0


def test_a_lookup_that_finds_nothing_realizes_no_tokens():
    policy = NgramPolicy(CONFIG, SIZES, 8)
    policy.choose(np.arange(2), 2, 9, reach=np.asarray([8, 8]))
    guess = policy.guess(9)
    assert guess > 1 and policy.guess(5) < guess and policy.guess(1) is None
    before = policy.scale()
    policy.observe_outcome(guess, 0.0, miss=True)
    assert policy.scale() < before and policy.totals == {"lookups": 1, "misses": 1, "guessed": guess, "realized": 0.0}


def test_explorer_holds_a_runs_loss_to_its_share_of_served_time():
    """The runner-up far behind and 3x slower: runs far apart; close behind: every explore_every steps."""
    from specdec.eagle.served import RunnerUpExplorer

    def runs(runner_score, runner_ms, steps=2000):
        explorer = RunnerUpExplorer(explore_every=64)
        picks = [explorer.pick({"a": 1.0, "b": runner_score}, 4, {"a": 1.0, "b": runner_ms}) for _ in range(steps)]
        return picks.count("b") / 3

    assert runs(0.99, 1.0) == pytest.approx(2000 / 64, abs=2)
    far = runs(0.5, 3.0)  # a run loses 3 x 3 ms x 0.5 = 4.5 ms: every 225 steps of 1 ms
    assert far == pytest.approx(2000 / 226, abs=1.5)


def test_explain_names_learned_and_prior_step_times():
    policy = NgramPolicy(CONFIG, SIZES, 8)
    for _ in range(30):
        policy.observe_step(PLAIN, 1, 0.9)
        policy.observe_step(size_name(9), 1, 1.8)
    out = policy.explain(1)
    assert out["plain ms"] == pytest.approx(0.9, rel=0.05) and out["ngram9 ms"] == pytest.approx(1.8, rel=0.05)
    assert "ngram2 prior ms" in out and "ngram2 ms" not in out
    assert out["scale"] == policy.scale() and out["blind"] == policy.blind_mean()


@pytest.mark.parametrize("batch_path", [False, True], ids=["per-row", "batch"])
def test_plain_steps_teach_the_acceptance_rate_through_shadow_trials(batch_path, monkeypatch):
    """A row's match predicts its next token at each reach lookup; once that token is read (a plain step),
    the prediction counts as one verified draft token: a hit if it came, a rejection if not. A verify read
    in between (which observes the row itself) cancels it. (Small batches run it in Python, larger ones in
    numpy.)"""
    if batch_path:
        monkeypatch.setattr(worker_module, "BATCH_PATH_MIN_BS", 1)
    worker, history = _reach_worker(2)
    worker.policy = NgramPolicy(CONFIG, SIZES, 2)
    rows = np.arange(2)
    for row, predicted in [(0, 1), (1, 2)]:  # "5 6 7 8" matched earlier, then came ``predicted``
        history.token_ids[row, :9] = [5, 6, 7, 8, predicted, 5, 6, 7, 8]
    history.num_tokens[:] = 9
    worker._reach(rows)
    assert worker._shadow_at.tolist() == [9, 9] and worker._shadow_token.tolist() == [1, 2]
    history.token_ids[:, 9] = [1, 3]  # row 0's prediction came, row 1's did not
    history.num_tokens[:] = 10
    worker._reach(rows)
    assert worker.policy.hits.tolist() == [1.0, 0.0] and worker.policy.misses.tolist() == [0.0, 1.0]
    # row 0's new suffix "8 1" matched (it predicts 5), row 1's "3" never occurred: no trial
    assert worker._shadow_at.tolist() == [10, -1] and worker._shadow_token[0] == 5
    worker._shadow_at[0] = -1  # a verify of row 0 was read: it observed the row itself
    history.token_ids[:, 10] = 5
    history.num_tokens[:] = 11
    before = (worker.policy.hits.tolist(), worker.policy.misses.tolist())
    worker._reach(rows)
    assert (worker.policy.hits.tolist(), worker.policy.misses.tolist()) == before


def test_a_trial_of_one_row_is_a_one_node_verify():
    """``observe_trial`` (the shadow trials of small batches, Python floats) equals ``observe_accepts`` of one row
    that verified one drafted token."""
    one, many = NgramPolicy(CONFIG, SIZES, 4), NgramPolicy(CONFIG, SIZES, 4)
    for step, came in enumerate([True, False, True, True, False]):
        row = step % 3
        one.observe_trial(row, came)
        many.observe_accepts(np.asarray([row]), np.ones(1, dtype=np.int64), np.asarray([int(came)]))
        assert one.hits.tolist() == pytest.approx(many.hits.tolist()) and one.misses.tolist() == pytest.approx(
            many.misses.tolist())
        assert (one.all_hits, one.all_misses) == pytest.approx((many.all_hits, many.all_misses))
