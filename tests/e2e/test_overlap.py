"""Overlap scheduling: each decode step is launched before the previous one is read.

On CPU every launch runs to completion at once, so these tests check the scheduling logic (slot
reservation, chained inputs, steps launched past a request's end, deferred release); the GPU
tests check that a launch queues without a host sync.
"""

import pytest
import torch

from specdec.engine.decode import RESERVE_AHEAD, RESERVE_CHUNK

from ..server.live import CharTokenizer
from .helpers import assert_no_leak, engine, make_pair, prompts_of

LENGTHS = [1, 9, 4, 23, 2, 15, 6]
MAX_NEW = [17, 5, 30, 12, 1, 24, 9]


def _greedy(max_new, **extra):
    return [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True, **extra} for m in max_new]


def _outputs(eng, prompts, params):
    return [r["output_ids"] for r in eng.generate(input_ids=prompts, sampling_params=params)]


@pytest.mark.parametrize("shape", [(3, 1, 4), (5, 4, 8)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_overlapped_speculation_is_lossless(shape, algorithm, page_size):
    """Requests finish at different steps, so later steps carry requests launched past their end."""
    target, draft = make_pair(algorithm, "mixed")
    prompts = prompts_of(LENGTHS, target.config.vocab_size)
    expected = _outputs(engine(target, page_size=page_size), prompts, _greedy(MAX_NEW))
    spec = engine(target, draft, algorithm=algorithm, shape=shape, page_size=page_size, overlap_schedule=True)
    assert spec.scheduler.overlap
    assert _outputs(spec, prompts, _greedy(MAX_NEW)) == expected
    assert_no_leak(spec)


@pytest.mark.parametrize("page_size", [1, 4])
def test_overlapped_plain_decoding_matches(page_size):
    target, _ = make_pair("EAGLE", "random")
    prompts = prompts_of(LENGTHS, target.config.vocab_size, seed=1)
    expected = _outputs(engine(target, page_size=page_size), prompts, _greedy(MAX_NEW))
    overlapped = engine(target, page_size=page_size, overlap_schedule=True)
    assert _outputs(overlapped, prompts, _greedy(MAX_NEW)) == expected
    assert_no_leak(overlapped)


@pytest.mark.parametrize("algorithm", [None, "EAGLE"])
def test_a_request_waiting_for_kv_is_not_admitted_while_a_finished_one_still_holds_it(algorithm):
    """Issue #40: A (64 + 300 tokens) fills most of a 512-token pool, so B (200 + 100) waits. A
    finishes in a step read after the next one was launched with it, and keeps its KV until that
    one is read: admission took the engine for idle (nothing decoding) and admitted B, whose
    prefill then did not fit ("KV pool: 200 pages needed, ... reclaimable"). B now waits for A's
    release."""
    target, draft = make_pair("EAGLE", "mixed")
    spec = dict(algorithm="EAGLE", shape=(3, 1, 4)) if algorithm else {}
    a, b = prompts_of([64, 200], target.config.vocab_size, seed=3)
    params = _greedy([300, 100])
    expected = _outputs(engine(target, draft if algorithm else None, **spec), [a, b], params)
    eng = engine(target, draft if algorithm else None, max_total_tokens=512, overlap_schedule=True, **spec)
    assert _outputs(eng, [a, b], params) == expected
    assert eng.scheduler.num_retracted == 0
    assert_no_leak(eng)


def test_results_lag_one_step_and_finished_requests_release_after_the_step_past_their_end():
    target, draft = make_pair("EAGLE", "perfect")  # every draft accepted: 4 tokens a step
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), overlap_schedule=True)
    sched = spec.scheduler
    short, long = (spec.make_request(input_ids=[5, 6, 7], sampling_params=_greedy([m])[0]) for m in (5, 30))
    spec.add_request(short)
    spec.add_request(long)
    spec.step()  # prefill: one token each
    assert [len(short.output_ids), len(long.output_ids)] == [1, 1]
    assert spec.step() == [] and len(long.output_ids) == 1  # step 1 launched, nothing read yet
    assert sched.launched is not None and len(sched.launched.reqs) == 2
    assert spec.step() == [short]  # step 2 launched for both, step 1 read: short has its 5 tokens
    assert len(short.output_ids) == 5 and len(long.output_ids) == 5
    # short is finished but step 2 still holds its KV slots
    assert short in sched.running and short.row >= 0 and short in sched.launched.reqs
    # step 2 was launched knowing only the prompt's 3 tokens: it may write up to 3 + 4 (step 1's
    # tokens) + 4 (its tree): 11 positions, within what step 1 reserved: its own 3 + 4 positions and
    # RESERVE_AHEAD more, in whole chunks
    assert 3 + 4 + 4 <= short.kv_alloc == -(-(3 + 4 + RESERVE_AHEAD) // RESERVE_CHUNK) * RESERVE_CHUNK
    assert short.kv_len == 7
    spec.step()  # step 3 launched for long only; step 2 read: short's tokens dropped, short released
    assert short.output_ids == _outputs(engine(target), [[5, 6, 7]], _greedy([5]))[0]
    assert short not in sched.running and short.row == -1
    while sched.has_work:
        spec.step()
    assert long.output_ids == _outputs(engine(target), [[5, 6, 7]], _greedy([30]))[0]
    assert_no_leak(spec)


@pytest.mark.parametrize("algorithm", [None, "EAGLE"])
def test_reservations_of_many_requests_grow_together(algorithm, monkeypatch):
    """Requests whose reservations run out at different steps share their growths: one ``alloc_extend`` for every
    request near its end, about every RESERVE_AHEAD / (tokens a step) steps, not one a step; and the output is
    plain decoding's."""
    target, draft = make_pair("EAGLE", "mixed")
    spec = dict(algorithm="EAGLE", shape=(3, 1, 4)) if algorithm else {}
    prompts = prompts_of(list(range(3, 19)), target.config.vocab_size, seed=5)  # 16 requests, staggered ends
    params = _greedy([64] * len(prompts))
    expected = _outputs(engine(target), prompts, params)
    eng = engine(target, draft if algorithm else None, overlap_schedule=True, max_running_requests=16, **spec)
    memory, calls = eng.memory, []
    alloc = memory.alloc_extend
    monkeypatch.setattr(memory, "alloc_extend", lambda rows, *a, **kw: calls.append(len(rows)) or alloc(rows, *a, **kw))
    reqs = [eng.make_request(input_ids=p, sampling_params=q) for p, q in zip(prompts, params)]
    for req in reqs:
        eng.add_request(req)
    steps = 0
    while eng.scheduler.has_work:
        eng.step()
        steps += 1
    assert [r.output_ids for r in reqs] == expected
    decode_calls = [n for n in calls if n > 0]
    assert len(decode_calls) <= steps // 4, (len(decode_calls), steps)  # (chunks of 16 alone: about one a step)
    assert max(decode_calls) > 1  # growths shared
    assert_no_leak(eng)


@pytest.mark.parametrize("algorithm", [None, "EAGLE"])
def test_reservations_in_chunks_fall_back_to_exact_ends_in_a_full_pool(algorithm):
    """Reservations grow RESERVE_AHEAD positions ahead, in RESERVE_CHUNKs, but a request that fills the pool
    to within a chunk still decodes: the last growths take exactly what the step needs."""
    target, draft = make_pair("EAGLE", "mixed")
    spec = dict(algorithm="EAGLE", shape=(3, 1, 4)) if algorithm else {}
    prompt, new = [5, 6, 7, 8, 9], 44
    pool = len(prompt) + new + (8 if algorithm else 1) + 2  # room for the last step, not a last chunk
    assert pool % RESERVE_CHUNK
    expected = _outputs(engine(target, draft if algorithm else None, **spec), [prompt], _greedy([new]))
    eng = engine(target, draft if algorithm else None, max_total_tokens=pool, overlap_schedule=True, **spec)
    assert _outputs(eng, [prompt], _greedy([new])) == expected
    assert eng.scheduler.num_retracted == 0
    assert_no_leak(eng)


def test_requests_joining_and_stopping_midway():
    """Prefills of late arrivals read the step in flight; stop tokens end requests inside runs."""
    target, draft = make_pair("EAGLE3", "mixed")
    vocab = target.config.vocab_size
    prompts = prompts_of([3, 12, 7, 5, 9, 2], vocab, seed=4)
    reference = engine(target)
    free_run = _outputs(reference, prompts, _greedy([40] * 6))
    # stop each request at a token its free run emits somewhere in the middle
    stops = [[run[len(run) // 2]] for run in free_run]
    params = [{"temperature": 0, "max_new_tokens": 40, "stop_token_ids": s} for s in stops]
    expected = _outputs(reference, prompts, params)
    spec = engine(target, draft, algorithm="EAGLE3", shape=(5, 4, 8), overlap_schedule=True, max_running_requests=4)
    reqs = [spec.make_request(input_ids=p, sampling_params=q) for p, q in zip(prompts, params)]
    for r in reqs[:3]:
        spec.add_request(r)
    for _ in range(4):
        spec.step()
    for r in reqs[3:]:
        spec.add_request(r)  # join while steps are in flight
    while spec.scheduler.has_work:
        spec.step()
    assert [r.output_ids for r in reqs] == expected
    assert all(r.finish_reason.value == "stop" for r in reqs)
    assert_no_leak(spec)


def test_stop_strings_end_requests_inside_overlapped_runs():
    """A request ends with the token that completes its stop string, read while its next step is
    already launched: that step's tokens for it are dropped, as for a stop token."""
    tok = CharTokenizer()
    target, draft = make_pair("EAGLE3", "mixed")
    prompts = prompts_of([3, 12, 7, 5, 9, 2], target.config.vocab_size, seed=4)
    reference = engine(target, tokenizer=tok)
    free_run = [tok.decode(ids) for ids in _outputs(reference, prompts, _greedy([40] * 6))]
    stops = [text[len(text) // 2: len(text) // 2 + 2] for text in free_run]  # from the middle of each run
    params = [{"temperature": 0, "max_new_tokens": 40, "ignore_eos": True, "stop": s} for s in stops]
    expected = reference.generate(input_ids=prompts, sampling_params=params)
    spec = engine(target, draft, algorithm="EAGLE3", shape=(5, 4, 8), overlap_schedule=True, max_running_requests=4,
                  tokenizer=tok)
    got = spec.generate(input_ids=prompts, sampling_params=params)
    assert [g["output_ids"] for g in got] == [e["output_ids"] for e in expected]
    assert [g["text"] for g in got] == [text[: text.index(s)] for text, s in zip(free_run, stops)]
    assert all(tok.decode(g["output_ids"]).endswith(s) for g, s in zip(got, stops))
    assert all(g["meta_info"]["finish_reason"] == "stop" for g in got)
    assert_no_leak(spec)


def test_abort_of_a_request_in_the_launched_step():
    target, draft = make_pair("EAGLE", "mixed")
    prompts = prompts_of([5, 11, 3], target.config.vocab_size, seed=9)
    expected = _outputs(engine(target), prompts, _greedy([30] * 3))
    spec = engine(target, draft, algorithm="EAGLE", shape=(4, 3, 8), page_size=16, overlap_schedule=True)
    reqs = [spec.make_request(input_ids=p, sampling_params=_greedy([30])[0]) for p in prompts]
    for r in reqs:
        spec.add_request(r)
    for _ in range(3):
        spec.step()
    assert reqs[1] in spec.scheduler.launched.reqs
    spec.abort(reqs[1].rid)
    assert reqs[1].finish_reason.value == "abort" and reqs[1].row >= 0  # released after its step is read
    while spec.scheduler.has_work:
        spec.step()
    assert [reqs[0].output_ids, reqs[2].output_ids] == [expected[0], expected[2]]
    assert_no_leak(spec)


def test_overlap_with_speculation_turned_off_above_a_batch_size():
    """Speculative and plain sub-batches in one launched step, and requests moving between them."""
    target, draft = make_pair("EAGLE", "mixed")
    prompts = prompts_of(LENGTHS, target.config.vocab_size, seed=5)
    expected = _outputs(engine(target), prompts, _greedy(MAX_NEW))
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 2, 6), overlap_schedule=True,
                  speculative_batch_size_threshold=4)
    params = _greedy(MAX_NEW)
    params[2] = {**params[2], "speculative": False}
    assert _outputs(spec, prompts, params) == expected
    assert_no_leak(spec)


def test_one_sampled_request_draws_as_without_overlap():
    """The device runs the same work in the same order, so a seeded run is reproduced exactly."""
    target, draft = make_pair("EAGLE", "mixed")
    prompt = prompts_of([6], target.config.vocab_size, seed=7)
    params = [{"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 40, "ignore_eos": True}]
    runs = []
    for overlap in (False, True):
        eng = engine(target, draft, algorithm="EAGLE", shape=(3, 2, 6), overlap_schedule=overlap, random_seed=3)
        runs.append(_outputs(eng, prompt, params))
        assert_no_leak(eng)
    assert runs[0] == runs[1]


def test_overlap_is_on_by_default_only_on_cuda():
    target, _ = make_pair("EAGLE", "random")
    assert not engine(target).scheduler.overlap
    assert not engine(target, overlap_schedule=False).scheduler.overlap
    if torch.cuda.is_available():
        assert engine(target.cuda(), device="cuda").scheduler.overlap


def test_a_failed_launch_still_hands_out_the_step_before():
    target, draft = make_pair("EAGLE", "mixed")
    prompts = prompts_of([5, 8], target.config.vocab_size, seed=11)
    expected = _outputs(engine(target), prompts, _greedy([20, 20]))
    spec = engine(target, draft, algorithm="EAGLE", shape=(3, 1, 4), overlap_schedule=True)
    reqs = [spec.make_request(input_ids=p, sampling_params=_greedy([20])[0]) for p in prompts]
    for r in reqs:
        spec.add_request(r)
    spec.step()  # prefill
    spec.step()  # step 1 launched
    launch, calls = spec.worker.launch_decode, []

    def failing(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return launch(*args, **kw)

    spec.worker.launch_decode = failing
    before = [len(r.output_ids) for r in reqs]
    with pytest.raises(RuntimeError, match="injected"):
        spec.step()
    assert all(len(r.output_ids) > n for r, n in zip(reqs, before))  # step 1 was read all the same
    while spec.scheduler.has_work:
        spec.step()
    assert [r.output_ids for r in reqs] == expected
    assert_no_leak(spec)
