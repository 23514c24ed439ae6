"""Acceptance hazards: worked examples of the expected-committed estimate, path observations from
tree links, online statistics, and the policy's choices."""

import numpy as np
import pytest

from specdec.eagle.acceptance import AcceptanceModel, AcceptanceStats, observe_paths
from specdec.eagle.policy import (
    PLAIN, AdaptivePolicy, SpecShape, StepCosts, StepTimeCalibration, candidate_shapes, graph_batch_sizes,
)


def test_expected_committed_worked_example():
    """The module doc's example: K = 2, h = [[.8, .5], [.6, .5]]."""
    model = AcceptanceModel(np.array([[0.8, 0.5], [0.6, 0.5]]))
    np.testing.assert_allclose(model.child_probs()[:, 0], [[0.8, 0.1], [0.6, 0.2]])
    assert model.expected_committed(2, 2, 4) == pytest.approx(1 + 0.8 + 0.48 + 0.16)
    assert model.expected_committed(2, 1, 3) == pytest.approx(1 + 0.8 + 0.48)
    assert model.expected_committed(1, 1, 2) == pytest.approx(1.8)
    # depth 2 holds the K children of both depth-1 nodes: 4 candidates, 6 in all, the N - 1 best kept
    assert model.expected_committed(2, 2, 5) == pytest.approx(1 + 0.8 + 0.48 + 0.16 + 0.1)
    assert model.expected_committed(2, 2, 8) == pytest.approx(1 + 0.8 + 0.1 + 0.48 + 0.16 + 0.06 + 0.02)
    assert model.expected_committed(2, 2, 8) == model.expected_committed(2, 2, 7)  # nothing more to keep


def test_parent_rows_score_each_child_by_its_parents_rank():
    """The module doc's second example: depth 2 under a rank-1 parent takes the second row."""
    model = AcceptanceModel(np.array([[[0.8, 0.5], [0.8, 0.5]], [[0.6, 0.5], [0.3, 0.5]]]))
    assert model.parent_ranks == 2
    assert model.expected_committed(2, 2, 4) == pytest.approx(1 + 0.8 + 0.48 + 0.16)  # the same three best
    assert model.expected_committed(2, 2, 8) == pytest.approx(1 + 0.8 + 0.1 + 0.48 + 0.16 + 0.03 + 0.035)
    # equal parent rows are the pooled model; a rank past the last row reads the last row
    pooled = AcceptanceModel(np.array([[0.8, 0.5], [0.6, 0.5]]))
    same = AcceptanceModel(np.repeat(pooled.hazards, 2, axis=1))
    assert same.expected_committed(2, 2, 8) == pytest.approx(pooled.expected_committed(2, 2, 8))
    np.testing.assert_array_equal(model.by_parent(3)[:, 2], model.hazards[:, 1])
    assert AcceptanceModel.from_json(model.to_json()).expected_committed(2, 2, 8) == \
        pytest.approx(model.expected_committed(2, 2, 8))
    assert np.asarray(pooled.to_json()["hazards"]).shape == (2, 2)  # a pooled model keeps its 2-D file


def test_from_counts_shrinks_sparse_parent_rows_toward_the_pool():
    tried = np.array([[[90.0, 0.0], [10.0, 0.0]]])  # depth 1, parents 0 / 1, ranks 0 / 1
    accepted = np.array([[[72.0, 0.0], [2.0, 0.0]]])
    model = AcceptanceModel.from_counts(tried, accepted, pseudo_counts=10)
    pooled = 74 / 100
    np.testing.assert_allclose(model.hazards[0, :, 0], [(72 + 10 * pooled) / 100, (2 + 10 * pooled) / 20])
    np.testing.assert_array_equal(model.hazards[0, :, 1], 0)  # nothing tried at rank 1: 0


def test_from_counts_keeps_a_child_below_its_higher_ranked_sibling():
    """Rank 1 accepted 60 of 100 after rank 0 took 20 of 100: q = [.2, .48] would model the draft's
    second choice as accepted more often than its first; q[1] is cut to .2 (hazard .2 / .8 = .25)."""
    tried, accepted = np.array([[[100.0, 80.0]]]), np.array([[[20.0, 48.0]]])
    model = AcceptanceModel.from_counts(tried, accepted, pseudo_counts=0)
    np.testing.assert_allclose(model.child_probs()[0, 0], [0.2, 0.2])
    np.testing.assert_allclose(model.hazards[0, 0], [0.2, 0.25])
    kept = AcceptanceModel.from_counts(np.array([[[100.0, 80.0]]]), np.array([[[50.0, 24.0]]]), pseudo_counts=0)
    np.testing.assert_allclose(kept.hazards[0, 0], [0.5, 0.3])  # already non-increasing: unchanged


def test_a_uniform_chain_is_geometric():
    model = AcceptanceModel.uniform(0.5, max_depth=4, max_topk=1)
    assert model.expected_committed(4, 1, 5) == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)


def test_observe_paths_from_tree_links():
    """One request, N = 5: root -> {1, 2, 3} (ranks 0, 1, 2), 2 -> {4}.

        root ─┬─ 1        accepted path: root, 2, 4 (depth 1 rank 1, depth 2 rank 0), k = 2
              ├─ 2 ── 4
              └─ 3
    A second request rejects at the root: its two children tried, none accepted.
    """
    next_token = np.array([[1, -1, 4, -1, -1], [1, -1, -1, -1, -1]])
    next_sibling = np.array([[-1, 2, 3, -1, -1], [-1, 2, -1, -1, -1]])
    accept_index = np.array([[0, 2, 4], [0, -1, -1]])
    obs = observe_paths(accept_index, next_token, next_sibling, max_depth=2, max_topk=3)
    # depth 1: under the root (rank 0); depth 2: under node 2, of rank 1
    np.testing.assert_array_equal(obs.tried[0], [[1 + 1, 1 + 1, 0], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(obs.accepted[0], [[0, 1, 0], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(obs.tried[1], [[0, 0, 0], [1, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(obs.accepted[1], [[0, 0, 0], [1, 0, 0], [0, 0, 0]])


def test_observe_paths_rejected_under_a_ranked_parent():
    """root -> {1, 2}, 2 -> {3, 4}: the path root, 2 stops at depth 2; both of 2's children were tried
    under a rank-1 parent."""
    next_token = np.array([[1, -1, 3, -1, -1]])
    next_sibling = np.array([[-1, 2, -1, 4, -1]])
    obs = observe_paths(np.array([[0, 2, -1]]), next_token, next_sibling, max_depth=2, max_topk=2)
    np.testing.assert_array_equal(obs.tried[1], [[0, 0], [1, 1]])
    np.testing.assert_array_equal(obs.accepted[1], 0)


def _random_tree(rng, n: int, depth: int, k: int):
    """Links of a random tree of n nodes (at most k children a node, depth at most ``depth``), and an
    accepted path that walks a random child at each depth or stops."""
    kids, level = [[] for _ in range(n)], [0] * n
    for i in range(1, n):
        parent = rng.choice([p for p in range(i) if len(kids[p]) < k and level[p] < depth])
        kids[parent].append(i)
        level[i] = level[parent] + 1
    next_token, next_sibling = np.full(n, -1), np.full(n, -1)
    for p, c in enumerate(kids):
        if c:
            next_token[p] = c[0]
            next_sibling[c[:-1]] = c[1:]
    path, node = [0], 0
    while kids[node] and len(path) <= depth and rng.random() < 0.7:
        node = rng.choice(kids[node])
        path.append(node)
    return kids, next_token, next_sibling, path + [-1] * (depth + 1 - len(path))


def test_observe_paths_counts_every_try_under_its_parents_rank():
    """Random trees against the trees' own ranks: at each depth on the path, under the parent's rank,
    ranks up to the accepted one tried and it accepted; where the path stops, every child tried."""
    rng = np.random.default_rng(0)
    depth, k = 4, 3
    trees = [_random_tree(rng, int(rng.integers(2, 20)), depth, k) for _ in range(200)]
    n = 20
    pad = lambda a: np.concatenate([a, np.full(n - len(a), -1)])  # noqa: E731
    obs = observe_paths(np.array([t[3] for t in trees]), np.stack([pad(t[1]) for t in trees]),
                        np.stack([pad(t[2]) for t in trees]), max_depth=depth, max_topk=k)
    tried, accepted = np.zeros((depth, k, k)), np.zeros((depth, k, k))
    for kids, _, _, path in trees:
        rank_of = {c: r for c_list in kids for r, c in enumerate(c_list)}
        for d in range(1, depth + 1):
            parent, child = path[d - 1], path[d]
            if parent < 0:
                break
            under = rank_of.get(parent, 0)
            if child >= 0:
                tried[d - 1, under, : rank_of[child] + 1] += 1
                accepted[d - 1, under, rank_of[child]] += 1
            else:
                tried[d - 1, under, : len(kids[parent])] += 1
                break
    np.testing.assert_array_equal(obs.tried, tried)
    np.testing.assert_array_equal(obs.accepted, accepted)
    assert accepted[1:, 1:].sum() > 0  # paths do pass lower-ranked parents


def test_stats_converge_to_the_observed_rates_and_forget():
    prior = AcceptanceModel.uniform(0.5, max_depth=1, max_topk=1)
    stats = AcceptanceStats(prior, prior_weight=4, horizon=100)
    one = lambda tried, accepted: type("O", (), {"tried": np.array([[[tried]]]),
                                                 "accepted": np.array([[[accepted]]])})()
    for _ in range(200):
        stats.update(one(10.0, 9.0))
    assert stats.model().hazards[0, 0, 0] == pytest.approx(0.9, abs=0.02)  # the prior keeps 4 of ~109 counts
    for _ in range(200):
        stats.update(one(10.0, 2.0))
    assert stats.model().hazards[0, 0, 0] == pytest.approx(0.2, abs=0.03)


def test_rows_of_rarely_reached_parents_follow_the_pooled_rate():
    """A prior whose depth-2 rank-0 hazard is .6 under a first choice and .4 under a second; the head
    accepts .9 under first choices. The second choice's row, never observed, moves with the pool
    (.4 + .3) instead of staying at the prior's .4; with no observations the model is the prior."""
    prior = AcceptanceModel(np.array([[[0.7, 0.5], [0.7, 0.5]], [[0.6, 0.5], [0.4, 0.5]]]))
    stats = AcceptanceStats(prior, prior_weight=16, horizon=float("inf"))
    np.testing.assert_allclose(stats.model().hazards, prior.hazards)
    tried, accepted = np.zeros((2, 2, 2)), np.zeros((2, 2, 2))
    tried[1, 0, 0], accepted[1, 0, 0] = 10000, 9000
    stats.update(type("O", (), {"tried": tried, "accepted": accepted})())
    model = stats.model()
    assert model.hazards[1, 0, 0] == pytest.approx(0.9, abs=2e-3)
    assert model.hazards[1, 1, 0] == pytest.approx(0.4 + 0.3, abs=2e-3)
    np.testing.assert_allclose(model.hazards[:, :, 1], 0.5)  # nothing observed at rank 1: the prior


def _policy(spec_ms: float, plain_ms: float = 1.0) -> AdaptivePolicy:
    shapes = [SpecShape(3, 1, 4), SpecShape(5, 4, 8)]
    table = {PLAIN: {1: plain_ms, 64: plain_ms * 4}}
    table.update({s.name: {1: spec_ms, 64: spec_ms * 16} for s in shapes})
    return AdaptivePolicy(shapes, StepCosts(table, slope={}), AcceptanceModel.uniform(0.7, max_depth=5, max_topk=4))


def test_policy_picks_plain_when_speculation_costs_too_much_and_a_tree_when_cheap():
    assert _policy(spec_ms=10.0).choose(1, 100) is None
    cheap = _policy(spec_ms=1.2)
    assert cheap.choose(1, 100) == SpecShape(5, 4, 8)  # more committed for little more time
    assert cheap.choose(64, 100) is None  # at bs 64 a tree step costs 16x its bs-1 time, plain 4x


def test_policy_never_chooses_a_shape_past_its_max_batch():
    policy = _policy(spec_ms=1.2)
    policy.max_batch = {"5x4x8": 4}
    assert policy.choose(4, 100) == SpecShape(5, 4, 8)
    assert policy.choose(5, 100) == SpecShape(3, 1, 4)  # the tree has no graphs there: the chain
    assert "5x4x8" not in policy.scores(5, 100)


@pytest.mark.parametrize("shape, rows, expected", [
    (SpecShape(3, 1, 4), 512, [1, 2, 4, 8, 16, 32, 64, 128]),
    (SpecShape(5, 4, 8), 512, [1, 2, 4, 8, 16, 32, 64]),
    (SpecShape(6, 8, 48), 512, [1, 2, 4, 8]),
    (SpecShape(6, 8, 48), 16, [1]),  # always the smallest size
    (SpecShape(6, 8, 48), 0, [1, 2, 4, 8, 16, 32, 64, 128]),  # no cap
    (SpecShape(6, 8, 48), None, [1, 2, 4, 8, 16, 32, 64, 128]),
])
def test_graph_batch_sizes_by_verify_rows(shape, rows, expected):
    assert graph_batch_sizes(shape, [128, 64, 32, 16, 8, 4, 2, 1], rows) == expected


def test_policy_learns_that_a_shape_commits_less_than_estimated():
    policy = _policy(spec_ms=1.3)
    first = policy.choose(1, 0)
    assert first is not None
    for _ in range(64):  # every step of it committed just the bonus token
        policy.record(first, [1, 1], None)
    assert policy.choose(1, 0) != first


def test_prior_calibration_scales_a_shape_until_its_own_steps_are_read():
    """A 4-node tree ranked statically commits what the chain does (every third node is the chain's);
    the reference head's recorded trees say it commits 5 % more, so it is tried, and kept until its
    own steps say otherwise."""
    chain, tree = SpecShape(3, 1, 4), SpecShape(3, 2, 4)
    table = {name: {1: 1.0} for name in (PLAIN, chain.name, tree.name)}
    model = AcceptanceModel.uniform(0.7, max_depth=5, max_topk=4)
    policy = AdaptivePolicy([chain, tree], StepCosts(table, slope={}), model, prior_calibration={tree.name: 1.05})
    static = model.expected_committed(3, 2, 4)
    assert static == pytest.approx(model.expected_committed(3, 1, 4))
    assert policy.expected_committed(tree) == pytest.approx(1.05 * static)
    assert policy.expected_committed(chain) == pytest.approx(static)
    assert policy.choose(1, 0) == tree
    for _ in range(64):  # its steps commit just the bonus token
        policy.record(tree, [1, 1], None)
    assert policy.expected_committed(tree) == pytest.approx(static * (64 + 256 * 1.05) / (64 * static + 256))
    assert policy.choose(1, 0) == chain


@pytest.mark.parametrize("flags, expected", [
    ((3, 1, 4), ["1x1x2", "2x1x3", "3x1x4"]),
    ((6, 8, 32), ["1x1x2", "2x1x3", "2x2x3", "3x1x4", "3x2x4", "5x1x6", "5x4x8", "6x1x7", "6x8x32"]),
    ((6, 8, 48), ["1x1x2", "2x1x3", "2x2x3", "3x1x4", "3x2x4", "5x1x6", "5x4x8", "6x1x7", "6x8x32", "6x8x48"]),
    ((4, 2, 6), ["1x1x2", "2x1x3", "2x2x3", "3x1x4", "3x2x4", "4x1x5", "4x2x6"]),
    ((2, 4, 3), ["1x1x2", "2x1x3", "2x2x3", "2x4x3"]),
])
def test_candidate_shapes_are_bounded_by_the_flags(flags, expected):
    from specdec.config import SpecConfig

    steps, topk, tokens = flags
    config = SpecConfig.from_flags("EAGLE3", speculative_num_steps=steps, speculative_eagle_topk=topk,
                                   speculative_num_draft_tokens=tokens)
    assert [s.name for s in candidate_shapes(config)] == expected


def test_step_costs_interpolate_and_extrapolate():
    costs = StepCosts({PLAIN: {1: 2.0, 8: 4.0, 16: 8.0}}, slope={PLAIN: {1: 0.001}}, base_ctx=64)
    assert costs.step_ms(PLAIN, 4, 64) == pytest.approx(2.0 + 2.0 * 3 / 7)
    assert costs.step_ms(PLAIN, 32, 64) == pytest.approx(8.0 + 0.5 * 16)
    assert costs.step_ms(PLAIN, 8, 1064) == pytest.approx(4.0 + 0.001 * 8 * 1000)
    assert StepCosts.from_json(costs.to_json()) == costs
    noisy = StepCosts({PLAIN: {1: 3.1, 2: 3.0}}, slope={}, base_ctx=64)  # timing noise: 2 below 1
    assert noisy.step_ms(PLAIN, 64, 64) == pytest.approx(3.0)  # past the largest: never falling


def test_step_costs_take_the_far_slope_past_long_ctx():
    """Two segments: the near slope up to long_ctx, the far one past it; a batch size past the far
    slope's measured ones keeps the near slope all the way; a profile without far slopes reads as before."""
    costs = StepCosts({PLAIN: {1: 2.0, 8: 4.0, 64: 9.0}}, slope={PLAIN: {1: 0.001, 64: 0.002}}, base_ctx=64,
                      slope_far={PLAIN: {1: 0.003, 8: 0.004}}, long_ctx=1024)
    assert costs.step_ms(PLAIN, 1, 1000) == pytest.approx(2.0 + 0.001 * 936)
    assert costs.step_ms(PLAIN, 1, 4096) == pytest.approx(2.0 + 0.001 * 960 + 0.003 * 3072)
    near8 = 0.001 + 0.001 * 7 / 63
    assert costs.step_ms(PLAIN, 8, 2048) == pytest.approx(4.0 + near8 * 8 * 960 + 0.004 * 8 * 1024)
    assert costs.step_ms(PLAIN, 64, 4096) == pytest.approx(9.0 + 0.002 * 64 * 4032)  # no far slope measured
    assert StepCosts.from_json(costs.to_json()) == costs
    old = {"base_ctx": 64, "slope": {PLAIN: {"1": 0.001}}, "table": {PLAIN: {"1": 2.0}}}  # PROFILE_FORMAT 5
    assert StepCosts.from_json(old).step_ms(PLAIN, 1, 4096) == pytest.approx(2.0 + 0.001 * 4032)


def test_step_time_calibration_starts_at_one_and_follows_the_served_steps():
    cal = StepTimeCalibration(prior_weight=4.0, decay=1.0)
    assert cal.ratio("plain", 8) == 1.0
    for _ in range(36):
        cal.observe("plain", 9, 2.0)  # bs 9 shares bs 8's bucket (8-15)
    assert cal.ratio("plain", 8) == pytest.approx((4 + 72) / (4 + 36))
    assert cal.ratio("plain", 16) == 1.0 and cal.ratio("3x1x4", 8) == 1.0  # other buckets, other choices
    cal.observe("x", 1, 1000.0)  # an idle gap is clipped (to 4x what was learnt: 1)
    assert cal.ratio("x", 1) == pytest.approx((4 + 4) / 5)
    for _ in range(40):  # served steps that really cost 10x the reference: learnt, past the clip
        cal.observe("y", 1, 10.0)
    assert cal.ratio("y", 1) == pytest.approx(10.0, rel=0.15)
    cal.observe("y", 1, 1e6)  # one pause after that moves it by at most 4x the learnt ratio a step
    assert cal.ratio("y", 1) < 11.0


def test_policy_backs_off_when_served_speculative_steps_cost_more_than_profiled():
    """The start-up profile says a tree pays at bs 1; the served steps take 4x its time (host work
    the profile never saw): the policy turns to plain decoding, and still tries the tree every
    ``explore_every`` steps of that batch size's bucket."""
    policy = _policy(spec_ms=1.2)
    tree = SpecShape(5, 4, 8)
    assert policy.choose(1, 100) == tree
    for _ in range(40):  # every speculative step takes 4x what the profile said; plain as profiled
        policy.observe_step(tree.name, 1, 100, 4.8)
        policy.observe_step("3x1x4", 1, 100, 4.8)
        policy.observe_step(PLAIN, 1, 100, 1.0)
    picks = [policy.choose(1, 100) for _ in range(128)]
    tried = picks.count(tree) + picks.count(SpecShape(3, 1, 4))
    assert tried in (3, 6) and picks.count(None) == 128 - tried  # runs of explore_steps = 3
    # without learning (tensor parallelism: ranks must agree) the profile alone decides
    fixed = AdaptivePolicy(policy.shapes, policy.costs, AcceptanceModel.uniform(0.7, max_depth=5, max_topk=4),
                           learn_step_times=False)
    for _ in range(40):
        fixed.observe_step(tree.name, 1, 100, 3.6)
    assert all(fixed.choose(1, 100) == tree for _ in range(128))


def test_explain_gives_the_figures_each_choice_rests_on():
    policy = _policy(spec_ms=1.2)
    for _ in range(40):
        policy.observe_step("3x1x4", 1, 100, 2.4)  # served at twice the profile
    rows = policy.explain(1, 100)
    assert list(rows) == sorted(rows, key=lambda n: -rows[n]["tokens_per_ms"])  # best first
    assert set(rows) == {PLAIN, "3x1x4", "5x4x8"}
    assert rows[PLAIN]["tokens"] == 1.0 and rows[PLAIN]["served_ratio"] == 1.0
    chain = rows["3x1x4"]
    w = sum(0.98 ** i for i in range(40))  # the calibration's decayed weight of 40 steps
    assert chain["profile_ms"] == 1.2 and chain["served_ratio"] == pytest.approx((4 + 2 * w) / (4 + w))
    assert chain["tokens_per_ms"] == pytest.approx(chain["tokens"] / (1.2 * chain["served_ratio"]))
    assert chain["tokens_per_ms"] == pytest.approx(policy.scores(1, 100)["3x1x4"])


def test_adaptive_worker_times_a_step_only_after_a_step_of_the_same_choice(monkeypatch):
    """Step N's interval (its launch to N+1's) is handed over only where step N-1 made the same
    choice in the same batch-size bucket: under overlap scheduling the interval holds the wait
    for step N-1."""
    from specdec.eagle import served
    from specdec.eagle.adaptive import AdaptiveEAGLEWorker

    seen = []
    worker = AdaptiveEAGLEWorker.__new__(AdaptiveEAGLEWorker)
    worker.policy = type("P", (), {"observe_step": lambda self, *a: seen.append(a)})()
    worker._clock = served.LaunchClock()
    clock = iter([10.0, 10.004, 10.010, 10.020, 10.025, 10.031, 10.040, 10.050, 10.052])
    monkeypatch.setattr(served.time, "perf_counter", lambda: next(clock))
    chain = SpecShape(3, 1, 4)
    for shape, bs in [(None, 4), (None, 5), (None, 4), (chain, 4), (chain, 4), (None, 4)]:
        worker._observe_last_step(shape, bs, 50.0)
    # timed: the second and third plain steps (each after a plain one), the second chain step
    assert seen == [(PLAIN, 5, 50.0, pytest.approx(6.0)), (PLAIN, 4, 50.0, pytest.approx(10.0)),
                    (chain.name, 4, 50.0, pytest.approx(6.0))]
    worker._clock.reset()  # what a prefill in between does
    worker._observe_last_step(None, 5, 52.0)
    worker._observe_last_step(None, 5, 53.0)
    worker._observe_last_step(None, 5, 54.0)
    assert seen[3:] == [(PLAIN, 5, 53.0, pytest.approx(2.0))]


def test_a_step_that_waited_for_a_kernel_build_is_not_timed(monkeypatch):
    """A Triton build between two launches (a variant's first launch in the process: 0.1-1 s) makes
    that interval no step's cost: dropped, and the next interval is timed again."""
    from specdec.eagle import served

    builds = [0]
    monkeypatch.setattr(served, "builds_so_far", lambda: builds[0])
    monkeypatch.setattr(served.time, "perf_counter", iter([1.0, 1.002, 1.125, 1.127, 1.129]).__next__)
    clock = served.LaunchClock()
    timed = [clock.launch("2x1x3", 1)]
    timed.append(clock.launch("2x1x3", 1))
    builds[0] += 1  # the next 2x1x3 step built a kernel while it was launched
    timed += [clock.launch("2x1x3", 1) for _ in range(3)]
    assert timed == [None, None, None, ("2x1x3", 1, 0.0, pytest.approx(2.0)), ("2x1x3", 1, 0.0, pytest.approx(2.0))]


def test_builds_so_far_counts_every_build_watched_or_not(monkeypatch):
    """``jit_watch.builds_so_far``: the process's builds, with no watch open (what the clock reads)."""
    from specdec.kernels import jit_watch

    monkeypatch.setattr(jit_watch, "_total", 5)
    monkeypatch.setattr(jit_watch, "_installed", True)
    monkeypatch.setattr(jit_watch, "_open", [])
    jit_watch._record("a_kernel(n: i32)", 0.2)
    assert jit_watch.builds_so_far() == 6


def test_adaptive_worker_revises_its_first_choice_under_overlap_scheduling(monkeypatch):
    """The start-up profile says the tree pays at bs 1, but served tree steps take 4.8x a plain
    step. Under overlap scheduling the interval from step N's launch to N+1's is the wait for step
    N-1: the worker must still learn that plain decoding is faster, and keep to it."""
    from specdec.eagle import served
    from specdec.eagle.adaptive import AUTO, AdaptiveEAGLEWorker

    worker = AdaptiveEAGLEWorker.__new__(AdaptiveEAGLEWorker)
    worker.policy, worker.force, worker._context = _policy(spec_ms=1.2), AUTO, 100.0
    worker._clock, worker._send, worker._receive = served.LaunchClock(), None, None
    served_ms = {None: 1.0}  # a shape's served step: 4.8 ms
    now, launched = [0.0], []
    monkeypatch.setattr(served.time, "perf_counter", lambda: now[0])
    for _ in range(600):
        if len(launched) >= 2:  # the host waits for the step launched two launches ago
            now[0] += served_ms.get(launched[-2], 4.8) / 1e3
        launched.append(worker.choose(1, [100]))
    assert launched[0] == SpecShape(5, 4, 8)
    assert launched[-256:].count(None) >= 256 - 4 * 3  # plain, the runner-up tried in runs of 3 steps


def test_a_large_batch_observes_a_moving_window_of_paths():
    """The adaptive policy takes the paths of at most OBSERVED_PATHS_PER_STEP requests a step, a window that moves
    on each step, so every request of a batch is observed equally often; a small batch, all of them."""
    from collections import Counter

    from specdec.eagle.worker import OBSERVED_PATHS_PER_STEP as K, EAGLEWorker

    worker = EAGLEWorker.__new__(EAGLEWorker)
    worker._observed_from = 0
    assert worker._observed_rows(list(range(K))) == list(range(K))
    batch = list(range(2 * K + 3))
    windows = [worker._observed_rows(batch) for _ in range(len(batch))]
    assert windows[0] == batch[:K] and windows[1] == batch[K: 2 * K]
    assert windows[2] == batch[2 * K:] + batch[: K - 3]  # it wraps around
    assert set(Counter(r for w in windows for r in w).values()) == {K}  # every request K times in bs steps
