"""NGRAM under overlap scheduling (issue #42): the policy's plain steps launch past the unread
step like plain decoding's; its lookups do too where they draft on the device (the default: chains
from the KV slots' token ids, ``specdec.kernels.ngram_match``), and where they draft on the host
(trees, the cross-request cache) they read that step first. Greedy output equals plain decoding
whatever the choices, with page size 1 and 16, chunked prefill, retraction and the prefix cache; no
KV slot leaks; a device lookup past the step in flight drafts what a copied span holds; step times
run from each step's choice.

The choices are forced (``policy.choose`` replaced by a fixed pattern), so that plain and lookup
steps alternate in runs of every length, at every transition.
"""

import itertools

import pytest

from specdec.eagle import served
from specdec.eagle.served import PLAIN
from specdec.ngram import worker as ngram_worker

from .helpers import assert_no_leak, prompts_of
from .test_ngram import SMALL, _ids, chain_of, make_pair, ngram_engine, plain_engine, repetitive_prompts

# a step's choice: 1 looks up (up to the largest verify size), 0 decodes plainly. Runs of 1-3 of
# each, so every transition (plain -> lookup, lookup -> plain, lookup -> lookup, plain -> plain) occurs
PATTERN = [0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 0, 0]


class Recorder:
    """Wraps an engine's launcher: forces the policy's choices and records each speculative
    launch as (choice, whether it launched past an unread step)."""

    def __init__(self, eng, pattern=PATTERN):
        self.choices = itertools.cycle(pattern)
        self.launches: list[tuple[int, bool]] = []
        eng.worker.policy.choose = self._choose
        decoder = eng.scheduler.decoder
        launch = decoder.launch

        def recorded(reqs, previous):
            pending = eng.worker._choice
            if pending is not None:
                self.launches.append((pending[0], previous is not None))
            return launch(reqs, previous)

        decoder.launch = recorded

    def _choose(self, rows, bs, max_size, reach=None, in_flight=False):
        return max_size if next(self.choices) else 0


def _engine(target, **kw):
    kw.setdefault("speculative_adaptive", "on")  # the policy, on CPU too
    return ngram_engine(target, overlap_schedule=True, **kw)


def _prompts(target, seed):
    return repetitive_prompts(target.config.vocab_size, seed=seed) + prompts_of([4, 17], target.config.vocab_size)


def _check_pipeline(rec: Recorder, *, device: bool) -> None:
    """Plain choices launched past unread steps (overlapped), and lookups did too (``device``) or never."""
    assert any(size == 0 and past for size, past in rec.launches)
    assert any(size > 0 and past for size, past in rec.launches) == device
    assert any(size > 0 for size, _ in rec.launches)


def _accepted_several(outs) -> bool:
    """Drafts were accepted, several tokens at a time (so lookups found the history's matches)."""
    return max((k for o in outs for k in o["meta_info"]["spec_accept_lengths"]), default=0) >= 2


# device lookups (the default) or host trees (a breadth flag given)
DRAFTERS = {"device": {}, "host-tree": {"speculative_ngram_max_bfs_breadth": 2}}


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("breadth", [None, 1, 3], ids=["device", "host-chain", "host-tree"])
def test_alternating_choices_equal_plain_decoding(page_size, breadth):
    target, _ = make_pair("EAGLE", "mixed")
    prompts = _prompts(target, seed=0)
    params = [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in (30, 9, 25, 1, 40, 16, 22)]
    expected = plain_engine(target, page_size=page_size).generate(input_ids=prompts, sampling_params=params)
    eng = _engine(target, page_size=page_size, speculative_ngram_max_bfs_breadth=breadth)
    assert eng.worker.ngram.device_lookup == (breadth is None)
    assert eng.scheduler.overlap
    rec = Recorder(eng)
    got = eng.generate(input_ids=prompts, sampling_params=params)
    assert _ids(got) == _ids(expected)
    _check_pipeline(rec, device=breadth is None)
    assert _accepted_several(got)
    assert_no_leak(eng)


@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("pattern", [[0], [1], [0, 1]], ids=["plain", "lookup", "alternate"])
def test_chunked_prefill_and_graph_path(pattern, drafter):
    """Prompts prefilled in 8-token chunks between decode steps, the padded static path run eagerly."""
    target, _ = make_pair("EAGLE", "mixed")
    prompts = repetitive_prompts(target.config.vocab_size, seed=1)
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    expected = plain_engine(target).generate(input_ids=prompts, sampling_params=params)
    eng = _engine(target, chunked_prefill_size=8, **DRAFTERS[drafter])
    eng.capture_cuda_graphs([2, 8], use_graphs=False)
    rec = Recorder(eng, pattern)
    got = eng.generate(input_ids=prompts, sampling_params=params)
    assert _ids(got) == _ids(expected)
    assert any(size > 0 and past for size, past in rec.launches) == (drafter == "device" and 1 in pattern)
    assert _accepted_several(got) == (1 in pattern)
    assert_no_leak(eng)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_retraction_under_a_small_kv_pool(drafter):
    target, _ = make_pair("EAGLE", "mixed")
    prompts = repetitive_prompts(target.config.vocab_size, seed=2) + prompts_of([12, 20, 7], 97, seed=15)
    params = {"temperature": 0, "max_new_tokens": 50, "ignore_eos": True}
    expected = plain_engine(target).generate(input_ids=prompts, sampling_params=params)
    eng = _engine(target, max_total_tokens=160, page_size=16, max_running_requests=8, schedule_conservativeness=0.05,
                  **DRAFTERS[drafter])
    rec = Recorder(eng)
    got = eng.generate(input_ids=prompts, sampling_params=params)
    assert _ids(got) == _ids(expected)
    assert eng.cache_stats()["num_retracted_reqs"] > 0
    _check_pipeline(rec, device=drafter == "device")
    assert _accepted_several(got)
    assert_no_leak(eng)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_prefix_cache_and_a_second_run(drafter):
    """The second run's prompts come from the prefix cache: device lookups read their tokens from the
    cached slots (written by the first run), and still find matches."""
    target, _ = make_pair("EAGLE", "mixed")
    prompts = _prompts(target, seed=4)
    params = {"temperature": 0, "max_new_tokens": 14, "ignore_eos": True}
    expected = _ids(plain_engine(target).generate(input_ids=prompts, sampling_params=params))
    eng = _engine(target, page_size=16, **DRAFTERS[drafter])
    rec = Recorder(eng, [1, 0, 0])
    first = eng.generate(input_ids=prompts, sampling_params=params)
    second = eng.generate(input_ids=prompts, sampling_params=params)
    assert _ids(first) == _ids(second) == expected
    assert sum(o["meta_info"]["cached_tokens"] for o in second) > 0
    assert _accepted_several(second)
    _check_pipeline(rec, device=drafter == "device")
    assert_no_leak(eng)


def test_learned_policy_under_overlap():
    """The policy's own choices (not forced) on the mixed pipeline: still plain decoding's output."""
    target, _ = make_pair("EAGLE", "mixed")
    prompts = _prompts(target, seed=6)
    params = {"temperature": 0, "max_new_tokens": 30, "ignore_eos": True}
    expected = _ids(plain_engine(target).generate(input_ids=prompts, sampling_params=params))
    eng = _engine(target)
    assert _ids(eng.generate(input_ids=prompts, sampling_params=params)) == expected
    assert eng.worker.policy.chosen
    assert_no_leak(eng)


def test_device_lookups_draft_the_copied_span():
    """A device lookup past an unread step drafts from that step's tokens too: on the perfect-draft
    target a prompt holding a stretch of its own chain is continued by copying it, and every lookup,
    launched past the step in flight, has its chain accepted whole."""
    target, _ = make_pair("EAGLE", "perfect")
    stretch = chain_of(target, 11, 60)
    prompt = stretch + [5, 7] + stretch[:3]
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    expected = plain_engine(target).generate(input_ids=prompt, sampling_params=params)
    eng = _engine(target)
    rec = Recorder(eng, [1])
    got = eng.generate(input_ids=prompt, sampling_params=params)
    assert got["output_ids"] == expected["output_ids"]
    assert sum(past for _, past in rec.launches) >= len(rec.launches) - 1  # all but the first overlapped
    accepts = got["meta_info"]["spec_accept_lengths"]
    assert min(accepts[:-1]) == SMALL["speculative_num_draft_tokens"] - 1, accepts  # whole chains (the last: cut)
    assert_no_leak(eng)


def test_device_lookups_resume_after_a_copied_span_breaks():
    """The output copies a stretch S1 of the prompt, which the prompt follows with 5 where the target
    continues its own chain c1 c2 ... instead; the prompt also holds that chain (S0), so after the
    break copying resumes, and device lookups, each past the step before, have whole chains accepted
    again."""
    target, _ = make_pair("EAGLE", "perfect")
    s1 = chain_of(target, 11, 20)
    s0 = chain_of(target, chain_of(target, s1[-1], 2)[1], 30)
    prompt = s0 + [5, 7] + s1 + [5] + s1[:3]
    params = {"temperature": 0, "max_new_tokens": 42, "ignore_eos": True}
    expected = plain_engine(target).generate(input_ids=prompt, sampling_params=params)
    eng = _engine(target)
    Recorder(eng, [1])
    got = eng.generate(input_ids=prompt, sampling_params=params)
    assert got["output_ids"] == expected["output_ids"]
    accepts = got["meta_info"]["spec_accept_lengths"]
    whole = SMALL["speculative_num_draft_tokens"] - 1
    first_miss = next(i for i, k in enumerate(accepts) if k < whole)
    assert accepts[first_miss + 1: -1].count(whole) >= 2, accepts  # recovered (the last step: cut)
    assert_no_leak(eng)


def test_cross_request_cache_lookups_read_first():
    """With the cross-request cache on, lookups (trees that may come from other requests) read the
    step in flight first; plain steps still overlap."""
    target, _ = make_pair("EAGLE", "mixed")
    prompts = _prompts(target, seed=3)
    params = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}
    expected = _ids(plain_engine(target).generate(input_ids=prompts, sampling_params=params))
    eng = _engine(target, speculative_ngram_capacity=1000)
    rec = Recorder(eng)
    assert _ids(eng.generate(input_ids=prompts, sampling_params=params)) == expected
    _check_pipeline(rec, device=False)
    assert_no_leak(eng)


def test_a_lookup_past_an_unread_step_is_refused():
    """The launcher's guard: a host lookup that reads first must not launch past the step in flight."""
    target, _ = make_pair("EAGLE", "mixed")
    eng = _engine(target, **DRAFTERS["host-tree"])
    Recorder(eng, [1])
    sched = eng.scheduler
    eng.add_request(eng.make_request(input_ids=_prompts(target, 0)[0],
                                     sampling_params={"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}))
    eng.step()  # prefill
    eng.step()  # a lookup step, left in flight
    batch = [r for r in sched.running if not r.finished]
    assert sched.launched is not None and sched.decoder.needs_read(batch)
    with pytest.raises(RuntimeError, match="without a choice that may"):
        sched.decoder.launch(batch, sched.launched)


def test_step_times_run_from_each_choice(monkeypatch):
    """A step's time runs from its choice to the next step's choice, so a lookup's wait for the
    step in flight (here 0.5 s a read) is its own; a lookup that finds nothing (``MISS``) is timed
    as neither choice. Steps at t = 1, 2, 4, 7, 11, 16 s choose plain, plain, lookup, plain, ..."""
    now = [0.0]
    monkeypatch.setattr(ngram_worker.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(served.time, "perf_counter", lambda: now[0])
    target, _ = make_pair("EAGLE", "mixed")
    eng = _engine(target, **DRAFTERS["host-tree"])  # (host lookups wait for the read)
    worker, sched, seen = eng.worker, eng.scheduler, []
    Recorder(eng, [0, 0, 1])
    worker.policy.observe_step = lambda name, bs, ms: seen.append((name, round(ms, 6)))
    worker.budget.limits = lambda rows, bs: [0] * len(rows)  # every lookup finds nothing
    read = sched._read_launched

    def slow_read():
        now[0] += 0.5
        return read()

    sched._read_launched = slow_read
    eng.add_request(eng.make_request(input_ids=_prompts(target, 0)[0],
                                     sampling_params={"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}))
    eng.step()  # prefill
    for t in (1, 2, 4, 7, 11, 16):
        now[0] = t
        eng.step()
    # plain at 2 ends at the lookup's choice (4, not 4.5); plain at 7 follows the miss: untimed
    assert seen == [(PLAIN, 2000.0), (PLAIN, 5000.0)]
    assert eng.scheduler.spec_shape_steps == {"plain": 5}  # the sixth still in flight
