"""Chunked prefill and KV pressure end to end: output is identical whatever the chunk size, with
or without the prefix cache; chunks alternate with decode steps; a full pool makes new requests
wait and retracts running ones (recomputed later) instead of failing; nothing leaks."""

from __future__ import annotations

import pytest
import torch

from .helpers import assert_no_leak, engine, make_pair, prompts_of
from .test_prefix_cache import CONFIG_IDS, CONFIGS, _finish, _kv_of, _prefill_only, build, greedy

LENGTHS = [1, 9, 4, 23, 2, 15, 31]
MAX_NEW = [17, 5, 30, 12, 1, 24, 9]


def run(eng, prompts, max_new) -> list[dict]:
    out = eng.generate(input_ids=prompts, sampling_params=[greedy(m) for m in max_new])
    assert_no_leak(eng)
    return out


@pytest.mark.parametrize("algorithm, shape", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_output_identical_for_every_chunk_size_and_cache_setting(algorithm, shape, page_size):
    prompts = prompts_of(LENGTHS, 97, seed=11)
    reference = run(build(algorithm, shape, page_size=page_size, chunked_prefill_size=-1,
                          disable_radix_cache=True), prompts, MAX_NEW)
    want = [r["output_ids"] for r in reference]
    for chunk in (1, 5, 16):
        for disable in (True, False):
            eng = build(algorithm, shape, page_size=page_size, chunked_prefill_size=chunk,
                        disable_radix_cache=disable)
            got = run(eng, prompts, MAX_NEW)
            assert [r["output_ids"] for r in got] == want, (chunk, disable)
            assert [r["meta_info"]["spec_accept_lengths"] for r in got] == \
                [r["meta_info"]["spec_accept_lengths"] for r in reference], (chunk, disable)


@pytest.mark.parametrize("algorithm, shape", CONFIGS[1:], ids=CONFIG_IDS[1:])
def test_chunked_prefill_kv_equals_one_prefill(algorithm, shape):
    """A 29-token prompt in chunks of 6: each chunk's draft extend takes the next prompt token at
    its last position, so target KV, draft KV and the root expansion equal one whole prefill's."""
    prompt = prompts_of([29], 97, seed=12)[0]
    whole = build(algorithm, shape, chunked_prefill_size=-1)
    ref = _prefill_only(whole, prompt)
    chunked = build(algorithm, shape, chunked_prefill_size=6)
    req = chunked.make_request(input_ids=prompt, sampling_params=greedy(4))
    chunked.add_request(req)
    for _ in range(5):  # 6 + 6 + 6 + 6 + 5
        chunked.step()
    assert req.kv_len == len(prompt) and req.output_ids == ref.output_ids
    got, want = _kv_of(chunked, req.row, len(prompt)), _kv_of(whole, ref.row, len(prompt))
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, msg=name)
    _finish(whole, ref)
    _finish(chunked, req)


def test_chunks_alternate_with_decode_steps():
    """While a 40-token prompt prefills in chunks of 8, a running request decodes every other step."""
    target, _ = make_pair("EAGLE", "random")
    eng = engine(target, chunked_prefill_size=8)
    short, long = prompts_of([3, 40], 97, seed=13)
    running = eng.make_request(input_ids=short, sampling_params=greedy(30))
    eng.add_request(running)
    eng.step()
    arriving = eng.make_request(input_ids=long, sampling_params=greedy(3))
    eng.add_request(arriving)
    outputs, prefilled = [], []
    for _ in range(10):
        eng.step()
        outputs.append(len(running.output_ids))
        prefilled.append(arriving.kv_len)
    # the step before was a prefill: a decode step first, then a chunk every other step
    assert prefilled[1:10:2] == [8, 16, 24, 32, 40]
    assert outputs[0:10:2] == [2, 3, 4, 5, 6]
    _finish(eng, running)
    _finish(eng, arriving)


def test_abort_while_chunked_frees_everything_and_keeps_the_final_pages():
    target, _ = make_pair("EAGLE", "random")
    eng = engine(target, chunked_prefill_size=8, page_size=4)
    prompt = prompts_of([30], 97, seed=14)[0]
    req = eng.make_request(input_ids=prompt, sampling_params=greedy(3))
    eng.add_request(req)
    eng.step()
    eng.step()
    assert eng.scheduler.chunked is req and req.kv_len == 16
    eng.abort(req.rid)
    assert eng.scheduler.chunked is None and not eng.scheduler.has_work
    assert eng.scheduler.cache.cached_pages == 4  # the 16 computed positions, cached
    again = eng.generate(input_ids=prompt, sampling_params=greedy(3))
    assert again["meta_info"]["cached_tokens"] == 16


# trees small enough that several requests share the 10-page pool
PRESSURE_CONFIGS = [(None, None), ("EAGLE", (3, 1, 4)), ("EAGLE", (5, 4, 8)), ("EAGLE3", (3, 2, 6))]


@pytest.mark.parametrize("algorithm, shape", PRESSURE_CONFIGS, ids=["plain", "eagle-chain", "eagle-5x4x8",
                                                                    "eagle3-3x2x6"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("disable_cache", [False, True])
def test_full_pool_retracts_and_recomputes_losslessly(algorithm, shape, overlap, disable_cache):
    """Eight requests whose outputs together need ~4x the pool; admission promises each only a
    few percent of its output (conservativeness 0.05), so decode runs out of pages and retracts requests,
    which recompute later; outputs equal a large pool's."""
    prompts = prompts_of([12, 20, 7, 16, 25, 9, 14, 18], 97, seed=15)
    max_new = [60, 45, 70, 50, 40, 66, 55, 48]
    kw = dict(page_size=16, max_running_requests=8, overlap_schedule=overlap, disable_radix_cache=disable_cache)
    want = run(build(algorithm, shape, **kw), prompts, max_new)
    small = build(algorithm, shape, max_total_tokens=160, schedule_conservativeness=0.05, **kw)
    got = run(small, prompts, max_new)
    assert [r["output_ids"] for r in got] == [r["output_ids"] for r in want]
    assert small.scheduler.num_retracted > 0


def test_a_request_that_can_never_fit_is_refused_at_admission():
    target, _ = make_pair("EAGLE", "random")
    eng = engine(target, max_total_tokens=64, page_size=16)
    with pytest.raises(ValueError, match="KV cache holds 64"):
        eng.make_request(input_ids=[3] * 10, sampling_params=greedy(60))
    assert not eng.scheduler.has_work
