"""While requests decode, new ones wait to be prefilled together (``--waiting-served-ratio``,
``--max-waiting-tokens``): a prefill step comes once the waiting requests are that share of the
decoding ones or the oldest has waited that many decode steps; small batches admit at once; the
answers are the same whatever the setting; measurements that prefill a batch admit at once; bad
values name their flag."""

from __future__ import annotations

import pytest

from specdec.engine.args import EngineArgs

from .helpers import assert_no_leak, engine, make_pair, prompts_of
from .test_prefix_cache import greedy

VOCAB = 97


def _running(eng, n: int, *, prompt_len: int = 5, max_new: int = 40) -> list:
    """``n`` requests admitted together (in one prefill step) and decoding."""
    reqs = [eng.make_request(input_ids=p, sampling_params=greedy(max_new))
            for p in prompts_of([prompt_len] * n, VOCAB, seed=21)]
    for req in reqs:
        eng.add_request(req)
    while eng.scheduler.waiting:
        eng.step()
    eng.step()  # a decode step: the last step was not a prefill
    assert all(r.output_ids and not r.finished for r in reqs)
    return reqs


def _arrive(eng, seed: int):
    req = eng.make_request(input_ids=prompts_of([6], VOCAB, seed=seed)[0], sampling_params=greedy(4))
    eng.add_request(req)
    return req


def _drain(eng) -> None:
    for req in list(eng.scheduler.running) + list(eng.scheduler.waiting):
        eng.abort(req.rid)
    while eng.scheduler.has_work:
        eng.step()
    assert_no_leak(eng)


@pytest.mark.parametrize("algorithm", [None, "EAGLE"])
def test_a_new_request_waits_for_the_share_or_the_step_limit(algorithm):
    target, draft = make_pair("EAGLE", "random")
    spec = dict(draft=draft, algorithm=algorithm, shape=(2, 1, 3)) if algorithm else {}
    eng = engine(target, **spec, waiting_served_ratio=0.5, max_waiting_tokens=3)
    _running(eng, 4)
    first = _arrive(eng, seed=1)  # 1 waiting < 0.5 x 4 decoding: it waits
    eng.step()
    eng.step()
    assert first.row < 0 and not first.output_ids
    second = _arrive(eng, seed=2)  # 2 waiting >= 0.5 x 4: prefilled together at the next step
    eng.step()
    assert first.output_ids and second.output_ids
    third = _arrive(eng, seed=3)  # alone, it waits 3 decode steps, then is prefilled
    waited = 0
    while not third.output_ids:
        eng.step()
        waited += 1
    assert waited == 4  # 3 decode steps (the first right after the prefill), then the prefill
    _drain(eng)


def test_small_batches_and_idle_engines_admit_at_once():
    """The defaults wait only past 10 decoding requests; an idle engine never waits."""
    target, _ = make_pair("EAGLE", "random")
    eng = engine(target, cuda_graph_max_bs=16)  # on CUDA: 10 decode at once
    assert (eng.scheduler.waiting_served_ratio, eng.scheduler.max_waiting_tokens) == (0.1, 16)
    _running(eng, 10)
    new = _arrive(eng, seed=4)
    eng.step()
    assert new.output_ids  # 1 >= 0.1 x 10
    _drain(eng)
    idle = engine(target, waiting_served_ratio=100.0, max_waiting_tokens=1000)
    alone = _arrive(idle, seed=5)
    idle.step()
    assert alone.output_ids
    _drain(idle)


def test_a_chunked_prompt_goes_on_without_waiting():
    target, _ = make_pair("EAGLE", "random")
    eng = engine(target, chunked_prefill_size=4, waiting_served_ratio=100.0, max_waiting_tokens=5)
    running = _running(eng, 2, prompt_len=2)  # both in one 4-token chunk
    long = eng.make_request(input_ids=prompts_of([12], VOCAB, seed=6)[0], sampling_params=greedy(2))
    eng.add_request(long)
    lens = []
    for _ in range(6):  # 5 decode steps of waiting, then its first chunk
        eng.step()
        lens.append(long.kv_len)
    assert lens == [0] * 5 + [4]
    assert not any(r.finished for r in running)
    lens = [long.kv_len]
    for _ in range(4):  # its chunks alternate with decode steps like any chunked prompt
        eng.step()
        lens.append(long.kv_len)
    assert lens == [4, 4, 8, 8, 12]
    _drain(eng)


def test_measurements_admit_at_once_within_their_block():
    """``Scheduler.admitting_at_once``: what the adaptive start-up profile prefills its batches under."""
    target, _ = make_pair("EAGLE", "random")
    eng = engine(target, waiting_served_ratio=100.0, max_waiting_tokens=1000)
    _running(eng, 3)
    with eng.scheduler.admitting_at_once():
        new = _arrive(eng, seed=8)
        eng.step()
        assert new.output_ids
    assert (eng.scheduler.waiting_served_ratio, eng.scheduler.max_waiting_tokens) == (100.0, 1000)
    late = _arrive(eng, seed=9)
    eng.step()
    eng.step()
    assert not late.output_ids  # waiting again
    _drain(eng)


@pytest.mark.parametrize("algorithm", [None, "EAGLE"])
def test_answers_do_not_depend_on_the_wait(algorithm):
    target, draft = make_pair("EAGLE", "random")
    spec = dict(draft=draft, algorithm=algorithm, shape=(3, 2, 4)) if algorithm else {}
    prompts = prompts_of([3, 8, 5, 12, 4, 9, 7, 2, 6, 10, 11, 5], VOCAB, seed=7)
    answers = []
    for ratio, steps in ((0.0, 0), (0.5, 5), (10.0, 50)):
        eng = engine(target, **spec, max_running_requests=6, waiting_served_ratio=ratio, max_waiting_tokens=steps)
        out = eng.generate(input_ids=prompts, sampling_params=[greedy(6 + i % 5) for i in range(len(prompts))])
        answers.append([o["output_ids"] for o in out])
        assert_no_leak(eng)
    assert answers[0] == answers[1] == answers[2]


@pytest.mark.parametrize("field, value, flag", [("waiting_served_ratio", -0.5, "--waiting-served-ratio"),
                                                 ("waiting_served_ratio", float("nan"), "--waiting-served-ratio"),
                                                 ("max_waiting_tokens", -1, "--max-waiting-tokens")])
def test_bad_values_name_their_flag(field, value, flag):
    with pytest.raises(ValueError, match=flag):
        EngineArgs(model_path="x", **{field: value})
