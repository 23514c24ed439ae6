"""Adaptive speculation: any sequence of shape choices (plain steps included) is lossless and keeps
the draft cache in step; the policy turns speculation off where step costs make it lose and back
on where they do not; the start-up profile is measured once and then read."""

import json

import pytest

from specdec.eagle.adaptive import AdaptiveEAGLEWorker
from specdec.config import SpecConfig
from specdec.eagle.policy import PLAIN, AdaptivePolicy, SpecShape, StepCosts, candidate_shapes
from specdec.engine.embedded import DEFAULT_DRAFT, DEFAULT_MODEL, load_prompts
from specdec.engine.engine import Engine

from .helpers import assert_no_leak, engine, make_pair, prompts_of

GREEDY = {"temperature": 0, "ignore_eos": True}


class Cycle:
    """A policy stand-in: the candidates in turn, two steps each (a step is timed only after one of
    its own choice), plain steps included."""

    def __init__(self, shapes):
        self.choices = [None] + list(shapes)
        self.i = 0
        self.recorded = 0

    def choose(self, bs, ctx):
        self.i += 1
        return self.choices[(self.i // 2) % len(self.choices)]

    def record(self, shape, committed, paths):
        assert paths is not None and paths.tried.shape == (shape.num_steps, shape.topk, shape.topk)
        self.recorded += 1

    def observe_step(self, name, bs, ctx, ms):
        assert name == PLAIN or name in {s.name for s in self.choices[1:]}
        assert ms >= 0.0
        self.observed = getattr(self, "observed", 0) + 1


def flat_costs(tmp_path, shapes, *, spec_ms: float, plain_ms: float = 1.0) -> str:
    table = {PLAIN: {1: plain_ms, 16: plain_ms}}
    table.update({s.name: {1: spec_ms, 16: spec_ms} for s in shapes})
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(StepCosts(table, slope={}).to_json()))
    return str(path)


def adaptive_engine(target, draft, algorithm, tmp_path, *, spec_ms=1.0, **kw) -> Engine:
    shapes = candidate_shapes(SpecConfig.from_flags(algorithm, speculative_num_steps=5, speculative_eagle_topk=4,
                                                    speculative_num_draft_tokens=8))
    return engine(target, draft, algorithm=algorithm, shape=(5, 4, 8), speculative_adaptive="on",
                  speculative_adaptive_profile=flat_costs(tmp_path, shapes, spec_ms=spec_ms), **kw)


@pytest.mark.parametrize("algorithm,page_size,overlap", [("EAGLE", 1, False), ("EAGLE3", 16, False),
                                                         ("EAGLE3", 1, True)])
def test_every_sequence_of_choices_is_lossless(algorithm, page_size, overlap, tmp_path):
    target, draft = make_pair(algorithm, "mixed")
    prompts = prompts_of([5, 12, 3, 9], target.config.vocab_size, seed=4)
    params = [{**GREEDY, "max_new_tokens": n} for n in (30, 17, 41, 25)]
    expected = engine(target, page_size=page_size).generate(input_ids=prompts, sampling_params=params)
    spec = adaptive_engine(target, draft, algorithm, tmp_path, page_size=page_size, overlap_schedule=overlap)
    assert isinstance(spec.worker, AdaptiveEAGLEWorker)
    spec.worker.policy = cycle = Cycle(spec.worker.shapes)
    got = spec.generate(input_ids=prompts, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    shapes = {name for g in got for name in g["meta_info"]["spec_shapes"]}
    assert shapes == {PLAIN} | {s.name for s in spec.worker.shapes}
    assert cycle.recorded > 0 and cycle.observed > 0  # the served steps' times reach the policy
    assert_no_leak(spec)


def _stories(tmp_path, spec_ms: float) -> Engine:
    """The policy chooses by the profile's costs alone: learning the served steps' times would price
    a plain step by this machine's clock (several ms on a busy CPU against the profile's 1) and
    speculate whatever ``spec_ms`` says (tests/eagle/test_acceptance.py tests that learning)."""
    shapes = candidate_shapes(SpecConfig.from_flags("EAGLE", speculative_num_steps=3, speculative_eagle_topk=2,
                                                    speculative_num_draft_tokens=5))
    eng = Engine(DEFAULT_MODEL, speculative_algorithm="EAGLE", speculative_draft_model_path=DEFAULT_DRAFT,
                 speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=5,
                 speculative_adaptive="on", max_running_requests=4,
                 speculative_adaptive_profile=flat_costs(tmp_path, shapes, spec_ms=spec_ms))
    eng.worker.policy.step_times = eng.worker.policy.explorer = None
    return eng


def test_policy_turns_speculation_off_when_it_loses_and_on_when_it_pays(tmp_path):
    """The embedded stories260K and its trained EAGLE head: with speculative steps 10x a plain
    step nothing speculates; with them 1.2x, speculation runs; switching the costs mid-run turns
    it back on, and the output is plain greedy decoding's throughout."""
    prompts = load_prompts("tinystories", 2)
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    expected = Engine(DEFAULT_MODEL).generate(prompts, params)
    costly = _stories(tmp_path, spec_ms=10.0)
    got = costly.generate(prompts, params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert all(g["meta_info"]["spec_shapes"] == {PLAIN: g["meta_info"]["spec_shapes"][PLAIN]} for g in got)
    assert costly.worker.policy.chosen.keys() == {PLAIN}
    # the same engine, its step costs re-measured as cheap: speculation comes back
    policy = costly.worker.policy
    policy.costs = StepCosts({name: {1: 1.0 if name == PLAIN else 1.2} for name in policy.costs.table}, slope={})
    again = costly.generate(prompts, params)
    assert [g["output_ids"] for g in again] == [e["output_ids"] for e in expected]
    assert all(g["meta_info"]["spec_verify_ct"] > 0 for g in again)
    assert_no_leak(costly)


def test_large_trees_get_graphs_and_are_chosen_only_up_to_the_verify_row_cap(tmp_path):
    """--speculative-adaptive-max-verify-rows 8 over sizes 1, 2, 4: the (3, 2, 5) tree is captured
    (verify and draft loop) at bs 1 only, the 2- and 3-step chains and the trees of as many nodes
    to bs 2, the 1-step chain at
    every size, the draft extends at every size (the plain steps' one-token extend once, on the
    base worker); a policy that prefers the tree takes it at bs 1 and never past its graphs, and
    the output is plain greedy decoding's."""
    from specdec.forward import CaptureHiddenMode, ForwardMode

    target, draft = make_pair("EAGLE", "mixed")
    prompts = prompts_of([5, 12, 3, 9], target.config.vocab_size, seed=2)
    params = [{**GREEDY, "max_new_tokens": n} for n in (20, 9, 14, 11)]
    expected = engine(target).generate(input_ids=prompts, sampling_params=params)
    shapes = candidate_shapes(SpecConfig.from_flags("EAGLE", speculative_num_steps=3, speculative_eagle_topk=2,
                                                    speculative_num_draft_tokens=5))
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 2, 5), speculative_adaptive="on",
                  speculative_adaptive_max_verify_rows=8,
                  speculative_adaptive_profile=flat_costs(tmp_path, shapes, spec_ms=1.01))
    spec.capture_cuda_graphs([1, 2, 4], use_graphs=False)
    worker = spec.worker
    assert worker.max_batch == {"2x1x3": 2, "2x2x3": 2, "3x1x4": 2, "3x2x4": 2, "3x2x5": 1}
    assert worker.policy.max_batch is worker.max_batch  # read live, not copied
    verify = {n: spec.runner.graphs[(ForwardMode.TARGET_VERIFY, CaptureHiddenMode.FULL, n)].batch_sizes
              for n in (2, 3, 4, 5)}
    assert verify == {2: [1, 2, 4], 3: [1, 2], 4: [1, 2], 5: [1]}
    tree = worker.workers[SpecShape(3, 2, 5)]
    assert tree.draft_graph.runner.batch_sizes == [1] and tree.draft_extend_graph.runner.batch_sizes == [1, 2, 4]
    assert worker.base is tree and tree.plain_extend_graph.runner.batch_sizes == [1, 2, 4]
    assert all(w.plain_extend_graph is None for w in worker.workers.values() if w is not tree)
    choices = []
    choose = worker.policy.choose
    worker.policy.choose = lambda bs, ctx: choices.append((bs, choose(bs, ctx))) or choices[-1][1]
    got = spec.generate(input_ids=prompts, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert (1, SpecShape(3, 2, 5)) in choices  # the tree commits the most per ms where it may run
    assert all(shape is None or bs <= worker.max_batch.get(shape.name, bs) for bs, shape in choices)
    assert {bs for bs, _ in choices} >= {1, 4}
    assert_no_leak(spec)


def test_profile_is_measured_once_then_read(tmp_path):
    target, draft = make_pair("EAGLE", "mixed")
    path = tmp_path / "profile.json"
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 2, 5), speculative_adaptive="on",
                  speculative_adaptive_profile=str(path))
    costs = json.loads(path.read_text())
    names = {PLAIN} | {s.name for s in spec.worker.shapes}
    assert set(costs["table"]) == names and all(ms > 0 for t in costs["table"].values() for ms in t.values())
    assert isinstance(spec.worker.policy, AdaptivePolicy)
    assert_no_leak(spec)
    mtime = path.stat().st_mtime_ns
    engine(target, draft, algorithm="EAGLE", shape=(3, 2, 5), speculative_adaptive="on",
           speculative_adaptive_profile=str(path))
    assert path.stat().st_mtime_ns == mtime  # read, not measured again


def test_profile_measures_the_far_slope_where_it_fits(tmp_path):
    """Three contexts a point where the KV cache holds the far one: a near and a far slope per
    batch size, and step_ms reads both; where it does not fit, no far slope. The choices share
    each point's prefill through the prefix cache."""
    from specdec.engine.spec_profile import measure_step_costs

    target, draft = make_pair("EAGLE", "mixed")
    shapes = candidate_shapes(SpecConfig.from_flags("EAGLE", speculative_num_steps=3, speculative_eagle_topk=2,
                                                    speculative_num_draft_tokens=5))
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 2, 5), speculative_adaptive="on",
                  speculative_adaptive_profile=flat_costs(tmp_path, shapes, spec_ms=1.0))
    before = spec.cache_stats()
    costs = measure_step_costs(spec, [1, 2], steps=1, warmup=1, base_ctx=8, long_ctx=24, far_ctx=48)
    after = spec.cache_stats()
    queried, prefilled = (after[k] - before[k] for k in ("queried_prompt_tokens", "prefill_tokens"))
    # every choice decodes every point's prompts; only the first choice at a point prefills them
    # (the later ones recompute a prompt's last token)
    assert queried == len(costs.table) * 3 * (8 + 24 + 48) and prefilled < 2 * queried / len(costs.table)
    assert after["cached_pages"] == 0  # the dummy prompts are not left in the prefix cache
    assert costs.long_ctx == 24 and set(costs.slope_far) == set(costs.table)
    assert all(set(by_bs) == {1, 2} and min(by_bs.values()) >= 0 for by_bs in costs.slope_far.values())
    name = next(iter(costs.table))
    expected = (costs.table[name][2] + costs.slope[name][2] * 2 * 16 + costs.slope_far[name][2] * 2 * 8)
    assert costs.step_ms(name, 2, 32) == pytest.approx(expected)
    unfit = measure_step_costs(spec, [1], steps=1, warmup=1, base_ctx=8, long_ctx=24, far_ctx=10 ** 6)
    assert unfit.slope_far == {} and unfit.slope[PLAIN][1] >= 0
    assert_no_leak(spec)


def test_profile_stops_at_the_batch_the_kv_cache_holds(tmp_path):
    """A batch whose requests cannot all hold their KV at once is not timed (it would run part
    waiting or retracted): the profile stops there and larger batches extrapolate."""
    from specdec.engine.spec_profile import measure_step_costs

    target, draft = make_pair("EAGLE", "mixed")
    shapes = candidate_shapes(SpecConfig.from_flags("EAGLE", speculative_num_steps=3, speculative_eagle_topk=2,
                                                    speculative_num_draft_tokens=5))
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 2, 5), speculative_adaptive="on", max_total_tokens=1024,
                  speculative_adaptive_profile=flat_costs(tmp_path, shapes, spec_ms=1.0))
    costs = measure_step_costs(spec, [1, 2, 64], steps=1, warmup=1, base_ctx=8, long_ctx=24, far_ctx=48)
    assert all(set(by_bs) == {1, 2} for by_bs in costs.table.values())
    assert costs.step_ms(PLAIN, 64, 8) >= costs.step_ms(PLAIN, 2, 8) > 0  # extrapolated past 2, never falling
    assert_no_leak(spec)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size,overlap", [(1, True), (16, False)])
def test_gpu_choices_replaying_graphs_are_lossless(page_size, overlap, tmp_path):
    """On CUDA every shape's draft, verify and draft-extend graphs and the plain decode graph and
    its one-token draft extend replay in one run, switching every step; fp32 keeps the comparison
    exact."""
    target, draft = make_pair("EAGLE3", "mixed")
    target, draft = target.cuda(), draft.cuda()
    prompts = prompts_of([5, 12, 3, 9, 30, 7], target.config.vocab_size, seed=9)
    params = [{**GREEDY, "max_new_tokens": n} for n in (30, 17, 41, 25, 8, 33)]
    kw = dict(device="cuda", attention_backend="triton", page_size=page_size, cuda_graph_bs=(1, 2, 4, 8))
    expected = engine(target, **kw).generate(input_ids=prompts, sampling_params=params)
    spec = adaptive_engine(target, draft, "EAGLE3", tmp_path, overlap_schedule=overlap, **kw)
    assert all(g.use_graphs for g in spec.runner.graphs.values())
    spec.worker.policy = Cycle(spec.worker.shapes)
    got = spec.generate(input_ids=prompts, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert {name for g in got for name in g["meta_info"]["spec_shapes"]} == {PLAIN} | {
        s.name for s in spec.worker.shapes}
    plain_extend = spec.worker.base.plain_extend_graph.runner
    assert plain_extend.use_graphs and plain_extend.num_calls > 0
    assert_no_leak(spec)
