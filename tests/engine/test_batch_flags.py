"""Batch-level flags worked out once per membership (specdec.engine.batch_flags), the decode step
plan that holds them, and the commit of a step's tokens without per-token checks."""

from types import SimpleNamespace

import pytest

from specdec.engine.batch_flags import BatchFlags, Memo
from specdec.engine.request import FinishReason, Request
from specdec.engine.sampling import SamplingParams

from ..e2e.helpers import engine, make_pair, prompts_of


def _req(grammar=None, generator=None, **params):
    return SimpleNamespace(params=SamplingParams(**params), grammar=grammar, generator=generator)


PLAIN = dict(temperature=0.0)


@pytest.mark.parametrize("params, grammar, generator, expected", [
    # all_greedy, needs_processing, grammar, top_logprobs_num, seeded
    (PLAIN, None, None, (True, False, False, None, False)),
    (dict(regex="a+"), object(), None, (False, True, True, None, False)),
    (dict(temperature=0.0, presence_penalty=0.5), None, None, (True, True, False, None, False)),
    (dict(temperature=0.0, logit_bias={3: 1.0}), None, None, (True, True, False, None, False)),
    (dict(temperature=0.0, min_new_tokens=2), None, None, (True, True, False, None, False)),
    (dict(temperature=0.0, return_logprob=True), None, None, (True, False, False, 0, False)),
    (dict(top_logprobs_num=5, sampling_seed=1), None, object(), (False, False, False, 5, True)),
], ids=["plain", "grammar", "penalty", "logit_bias", "min_new_tokens", "logprobs", "top_logprobs_seeded"])
def test_one_request_among_plain_ones_sets_its_flags(params, grammar, generator, expected):
    batch = [_req(**PLAIN), _req(grammar=grammar, generator=generator, **params), _req(**PLAIN)]
    flags = BatchFlags.of(batch)
    assert (flags.all_greedy, flags.needs_processing, flags.grammar, flags.top_logprobs_num, flags.seeded) == expected


def test_top_logprobs_num_is_the_largest_asked_for():
    batch = [_req(top_logprobs_num=2), _req(**PLAIN), _req(top_logprobs_num=7), _req(return_logprob=True)]
    assert BatchFlags.of(batch).top_logprobs_num == 7


def test_a_grammar_request_joining_turns_processing_on_and_leaving_turns_it_off():
    builds = []
    memo = Memo(lambda reqs: builds.append(len(reqs)) or BatchFlags.of(reqs))
    plain = [_req(**PLAIN) for _ in range(3)]
    grammar = _req(grammar=object(), regex="[0-9]+")
    assert not memo(plain).needs_processing
    assert not memo(list(plain)).needs_processing  # the same requests in a new list: not rebuilt
    assert builds == [3]
    on = memo(plain + [grammar])
    assert on.needs_processing and on.grammar
    assert memo(plain + [grammar]) is on and builds == [3, 4]
    off = memo(plain[:1] + plain[2:])  # the grammar request and a plain one left
    assert not off.needs_processing and not off.grammar and builds == [3, 4, 2]
    assert memo([plain[2], plain[0]]) is not off  # the order is part of the membership
    memo.clear()
    memo(plain)
    assert builds == [3, 4, 2, 2, 3]


def test_equal_but_distinct_requests_are_different_members():
    """Identity, not equality: two requests with the same fields are two members."""
    a, b = _req(**PLAIN), _req(**PLAIN)
    builds = []
    memo = Memo(lambda reqs: builds.append(1))
    memo([a])
    memo([b])
    assert len(builds) == 2


def test_the_scheduler_stops_overlapping_while_a_processed_request_runs():
    """A penalised request joins a batch of plain ones under overlap: the step plan turns
    processing on (steps run without overlap: nothing stays launched); when it leaves, off again."""
    target, _ = make_pair("EAGLE", "random")
    eng = engine(target, overlap_schedule=True)
    sched = eng.scheduler
    prompts = prompts_of([5, 7, 6], target.config.vocab_size)
    greedy = {"temperature": 0, "ignore_eos": True}
    plain = [eng.make_request(input_ids=p, sampling_params={**greedy, "max_new_tokens": 40}) for p in prompts[:2]]
    penalised = eng.make_request(input_ids=prompts[2],
                                 sampling_params={**greedy, "max_new_tokens": 6, "presence_penalty": 1.0})
    for req in plain:
        eng.add_request(req)
    for _ in range(3):
        eng.step()
    assert not sched.decoder.needs_processing(plain) and sched.launched is not None
    eng.add_request(penalised)
    while penalised.kv_len == 0 or not penalised.output_ids:
        eng.step()  # its prefill
    eng.step()
    assert sched.decoder.needs_processing([r for r in sched.running if not r.finished])
    assert sched.launched is None  # read before the next launch
    while not penalised.finished:
        eng.step()
    eng.step()
    assert all(not r.finished for r in plain)
    assert not sched.decoder.needs_processing([r for r in sched.running if not r.finished])
    assert sched.launched is not None  # overlapping again


def _request(max_new_tokens=8, stop_ids=(), output=()):
    req = Request("r", [1, 2], SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True), frozenset(stop_ids))
    req.output_ids = list(output)
    return req


@pytest.mark.parametrize("max_new, stop, output, tokens, kept, reason", [
    (8, (), [], [4, 5, 6], [4, 5, 6], None),
    (8, (5,), [], [4, 5, 6], [4, 5], FinishReason.STOP),
    (8, (4, 6), [], [4, 5, 6], [4], FinishReason.STOP),
    (4, (), [1, 2], [4, 5, 6], [1, 2, 4, 5], FinishReason.LENGTH),
    (4, (5,), [1, 2], [4, 5, 6], [1, 2, 4, 5], FinishReason.STOP),  # the stop token is the last allowed
    (4, (6,), [1, 2], [4, 5, 6], [1, 2, 4, 5], FinishReason.LENGTH),  # the stop token is past the end
    (3, (), [1, 2], [4], [1, 2, 4], FinishReason.LENGTH),
    (2, (), [1, 2], [4], [1, 2], FinishReason.LENGTH),  # no room left
    (8, (), [], [], [], None),
])
def test_commit_stops_at_stop_tokens_and_max_new_tokens(max_new, stop, output, tokens, kept, reason):
    req = _request(max_new, stop, output)
    req.append(tokens)
    assert (req.output_ids, req.finish_reason) == (kept, reason)
