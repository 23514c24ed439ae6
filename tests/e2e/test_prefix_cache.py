"""Prefix cache end to end: multi-turn requests reuse their history's KV, greedy output and
speculative acceptance are identical with the cache on and off, and a cached prefix's target and
draft KV equal what a fresh prefill computes (the draft KV at a position depends on the *next*
token: a diverging request must not reuse it)."""

from __future__ import annotations

import pytest
import torch


from .helpers import assert_no_leak, engine, make_pair, prompts_of

# (algorithm, tree shape): plain decoding, a chain, trees with topk > 1
CONFIGS = [(None, None), ("EAGLE", (3, 1, 4)), ("EAGLE", (5, 4, 8)), ("EAGLE3", (4, 8, 32))]
CONFIG_IDS = ["plain", "eagle-chain", "eagle-5x4x8", "eagle3-4x8x32"]


def greedy(max_new: int) -> dict:
    return {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}


def build(algorithm, shape, *, kind="mixed", **kw):
    target, draft = make_pair(algorithm or "EAGLE", kind)
    if algorithm is None:
        return engine(target, **kw)
    return engine(target, draft, algorithm=algorithm, shape=shape, **kw)


def two_turns(eng, firsts: list[list[int]], extra: list[list[int]], max_new=(12, 9)) -> list[list[dict]]:
    """Turn 1 of every conversation, then turn 2 = turn 1's prompt + its output + new tokens."""
    one = eng.generate(input_ids=firsts, sampling_params=[greedy(max_new[0])] * len(firsts))
    seconds = [p + r["output_ids"] + e for p, r, e in zip(firsts, one, extra)]
    two = eng.generate(input_ids=seconds, sampling_params=[greedy(max_new[1])] * len(seconds))
    return [one, two]


@pytest.mark.parametrize("algorithm, shape", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_multi_turn_identical_with_cache_on_and_off(algorithm, shape, page_size):
    vocab = 97
    firsts = prompts_of([5, 23, 40, 2], vocab, seed=1)
    extra = prompts_of([3, 1, 17, 6], vocab, seed=2)
    runs = {}
    for disable in (True, False):
        eng = build(algorithm, shape, page_size=page_size, disable_radix_cache=disable)
        runs[disable] = two_turns(eng, firsts, extra)
        assert_no_leak(eng)
    off, on = runs[True], runs[False]
    for turn_off, turn_on in zip(off, on):
        assert [r["output_ids"] for r in turn_on] == [r["output_ids"] for r in turn_off]
        # the draft saw the same KV, so it proposed the same trees: identical acceptance
        assert [r["meta_info"]["spec_accept_lengths"] for r in turn_on] == \
            [r["meta_info"]["spec_accept_lengths"] for r in turn_off]
    assert all(r["meta_info"]["cached_tokens"] == 0 for turn in off for r in turn)
    for first, r1, r2 in zip(firsts, on[0], on[1]):
        # turn 1's KV: every position but the last output token's, in whole pages
        history = len(first) + len(r1["output_ids"]) - 1
        assert r2["meta_info"]["cached_tokens"] == history // page_size * page_size


@pytest.mark.parametrize("overlap", [False, True], ids=["", "overlap"])
@pytest.mark.parametrize("algorithm, shape", CONFIGS, ids=CONFIG_IDS)
def test_stop_token_inside_a_step_caches_only_the_kept_history(algorithm, shape, overlap):
    """Turn 1 ends on a stop token that a speculative step committed with tokens after it: their
    target and draft KV was written, but the request drops them. Turn 2 = turn 1's prompt + the
    kept output + new tokens reuses exactly the kept history's KV (page_size 1, so one stale
    position would show), and outputs and acceptance equal the uncached engine's."""
    vocab = 97
    firsts = prompts_of([5, 23, 40, 2], vocab, seed=1)
    extra = prompts_of([3, 1, 17, 6], vocab, seed=2)
    free = build(algorithm, shape, disable_radix_cache=True).generate(input_ids=firsts,
                                                                        sampling_params=[greedy(20)] * 4)
    # each request stops at its free run's 7th token (or an earlier copy of it)
    params = [{**greedy(20), "stop_token_ids": [r["output_ids"][6]]} for r in free]
    runs = {}
    for disable in (True, False):
        eng = build(algorithm, shape, disable_radix_cache=disable, overlap_schedule=overlap)
        one = eng.generate(input_ids=firsts, sampling_params=params)
        seconds = [p + r["output_ids"] + e for p, r, e in zip(firsts, one, extra)]
        two = eng.generate(input_ids=seconds, sampling_params=[greedy(9)] * len(seconds))
        runs[disable] = [one, two]
        assert_no_leak(eng)
    off, on = runs[True], runs[False]
    assert all(r["meta_info"]["finish_reason"] == "stop" for r in on[0])
    if algorithm is not None:  # tokens committed (prefill's one, then k + 1 per step) exceed those kept
        assert any(1 + sum(k + 1 for k in r["meta_info"]["spec_accept_lengths"]) > len(r["output_ids"])
                   for r in on[0])
    for turn_off, turn_on in zip(off, on):
        assert [r["output_ids"] for r in turn_on] == [r["output_ids"] for r in turn_off]
        assert [r["meta_info"]["spec_accept_lengths"] for r in turn_on] == \
            [r["meta_info"]["spec_accept_lengths"] for r in turn_off]
    for first, r1, r2 in zip(firsts, on[0], on[1]):
        assert r2["meta_info"]["cached_tokens"] == len(first) + len(r1["output_ids"]) - 1


def _kv_of(eng, row: int, length: int) -> dict[str, torch.Tensor]:
    """The target's and (with a head) the draft's K and V at positions [0, length) of a row."""
    slots = eng.memory.req_to_token[row, :length].long()
    out = {"target_k": eng.runner.kv_cache.k[:, slots], "target_v": eng.runner.kv_cache.v[:, slots]}
    if eng.worker is not None:
        draft = eng.worker.resources.kv
        out.update(draft_k=draft.k[:, slots], draft_v=draft.v[:, slots])
        state = eng.worker.resources.state
        out.update(root_p=state.topk_p[row], root_index=state.topk_index[row].float(), root_hidden=state.hidden[row])
    return out


def _prefill_only(eng, prompt: list[int]):
    """Admit and prefill one request (one step); returns it, still running."""
    req = eng.make_request(input_ids=prompt, sampling_params=greedy(4))
    eng.add_request(req)
    eng.step()
    assert req.kv_len == len(prompt) and not req.finished
    return req


def _finish(eng, req) -> None:
    eng.abort(req.rid)
    while eng.scheduler.has_work:
        eng.step()


def _diverging_prefixes(vocab: int) -> tuple[list[int], list[int]]:
    """A = P x ..., B = P y ...: they agree on P (13 tokens) and differ right after it."""
    p = prompts_of([13], vocab, seed=3)[0]
    return p + [5, 6, 7, 8], p + [9, 10, 11]


@pytest.mark.parametrize("algorithm, shape", CONFIGS, ids=CONFIG_IDS)
def test_cached_prefix_kv_equals_a_fresh_prefill(algorithm, shape):
    """B reuses A's KV up to where their *pairs* of tokens agree: 12 positions (the draft entry at
    position 12 saw A's next token), with a draft head or not, so B's prefill starts at the same
    position in every engine. Its target KV, draft KV and root expansion then equal those of an
    engine that never saw A."""
    a, b = _diverging_prefixes(97)
    cached = build(algorithm, shape)
    cached.generate(input_ids=a, sampling_params=greedy(10))
    req = _prefill_only(cached, b)
    assert req.cached_tokens == 12
    fresh = build(algorithm, shape, disable_radix_cache=True)
    ref = _prefill_only(fresh, b)
    got, want = _kv_of(cached, req.row, len(b)), _kv_of(fresh, ref.row, len(b))
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, msg=name)
    _finish(cached, req)
    _finish(fresh, ref)


def test_token_keys_would_reuse_a_stale_draft_entry():
    """The control: keyed by single tokens, B would take A's entry at position 12, whose draft KV
    was computed with A's next token; the draft KV there differs from a fresh prefill's."""
    a, b = _diverging_prefixes(97)
    cached = build("EAGLE", (3, 1, 4))
    cached.scheduler.cache.keys_of = list  # one key a position: the token
    cached.generate(input_ids=a, sampling_params=greedy(10))
    req = _prefill_only(cached, b)
    assert req.cached_tokens == 13
    fresh = build("EAGLE", (3, 1, 4), disable_radix_cache=True)
    ref = _prefill_only(fresh, b)
    got, want = _kv_of(cached, req.row, len(b)), _kv_of(fresh, ref.row, len(b))
    torch.testing.assert_close(got["target_k"], want["target_k"], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got["draft_k"][:, 12], want["draft_k"][:, 12], atol=1e-3)
    _finish(cached, req)
    _finish(fresh, ref)


@pytest.mark.parametrize("algorithm, shape", [CONFIGS[0], CONFIGS[2]], ids=["plain", "eagle-5x4x8"])
def test_identical_prompts_in_one_batch_share_pages_after_prefill(algorithm, shape):
    """Four copies of one prompt submitted together: one prefills, the other three wait one step and
    take its pages from the tree (n > 1 computes the prompt once); every row points at one copy of
    the prompt's pages. Outputs equal the uncached engine's."""
    prompt = prompts_of([37], 97, seed=5)[0]
    outs = {}
    for disable in (True, False):
        eng = build(algorithm, shape, page_size=4, disable_radix_cache=disable)
        reqs = [eng.make_request(input_ids=prompt, sampling_params=greedy(8 + i)) for i in range(4)]
        for req in reqs:
            eng.add_request(req)
        eng.step()  # the prefill
        if not disable:
            assert [r.row >= 0 for r in reqs] == [True, False, False, False]
            first = eng.memory.req_to_token[reqs[0].row, :36].clone()  # (its row is freed once it finishes)
            while any(not r.output_ids for r in reqs[1:]):
                eng.step()  # a decode step of the first, then the three twins' (one-token) prefill
            assert [r.cached_tokens for r in reqs] == [0, 36, 36, 36]
            rows = [eng.memory.req_to_token[r.row, :36] for r in reqs[1:]]
            assert all(torch.equal(first, r) for r in rows)  # one copy of the 9 whole pages
        while eng.scheduler.has_work:
            eng.step()
        outs[disable] = [r.output_ids for r in reqs]
        assert_no_leak(eng)
    assert outs[False] == outs[True]


def test_hit_rate_and_eviction_under_a_small_pool():
    """A pool of 12 pages of 16 cannot keep every conversation: least recently used prefixes are
    evicted on demand, outputs stay identical, and the hit rate counts what was reused."""
    vocab = 97
    firsts = prompts_of([30, 41, 25, 50, 33, 38], vocab, seed=7)
    extra = prompts_of([4] * 6, vocab, seed=8)
    runs, stats = {}, {}
    for disable in (True, False):
        eng = build("EAGLE", (5, 4, 8), page_size=16, max_total_tokens=192, max_running_requests=2,
                    disable_radix_cache=disable)
        runs[disable] = two_turns(eng, firsts, extra)
        stats[disable] = eng.cache_stats()
        assert_no_leak(eng)
    assert [[r["output_ids"] for r in t] for t in runs[False]] == [[r["output_ids"] for r in t] for t in runs[True]]
    on = stats[False]
    assert 0 < on["cache_hit_rate"] < 1 and on["cached_prompt_tokens"] > 0
    assert on["prefill_tokens"] + on["cached_prompt_tokens"] == stats[True]["prefill_tokens"]
    assert stats[True]["cache_hit_rate"] == 0


@pytest.mark.parametrize("algorithm, shape", [CONFIGS[0], CONFIGS[2]], ids=["plain", "eagle-5x4x8"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_admission_charges_the_cached_prefix_a_request_locks(algorithm, shape, page_size):
    """Issue #40: 10 prompts cached (most of the pool, unused, so reclaimable), then the same 10 and
    10 fresh ones. Admitting a cached prompt locks its prefix, which room had counted as
    reclaimable: charged only its uncached tail, too many were admitted at once and their prefill
    did not fit ("KV pool: 1610 pages needed, 458 reclaimable", as in the adaptive profile, which
    decodes the same prompts for every shape). Admission now charges the locked pages; outputs
    equal the uncached engine's."""
    cached, fresh = prompts_of([160] * 10, 97, seed=11), prompts_of([160] * 10, 97, seed=12)
    outs = {}
    for disable in (True, False):
        eng = build(algorithm, shape, page_size=page_size, max_total_tokens=2048, max_running_requests=32,
                    disable_radix_cache=disable)
        eng.generate(input_ids=cached, sampling_params=[greedy(1)] * len(cached))
        if not disable:  # every cached page reclaimable, and most of the pool cached
            assert eng.scheduler.cache.reclaimable_pages() * page_size == 2048
            assert eng.scheduler.cache.cached_pages * page_size >= 1400
        out = eng.generate(input_ids=cached + fresh, sampling_params=[greedy(4)] * 20)
        outs[disable] = [r["output_ids"] for r in out]
        assert_no_leak(eng)
    assert outs[False] == outs[True]
