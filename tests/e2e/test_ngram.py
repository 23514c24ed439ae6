"""--speculative-algorithm NGRAM end to end on CPU: greedy output equals plain decoding token for token
(chains, BFS and PROB trees, paged KV, the padded CUDA-graph path, chunked prefill, retraction),
sampled output follows the target distribution, no KV slot leaks, and flags that do not apply
are refused by name.

Prompts repeat themselves so that lookups find matches. On the perfect-draft fixture's target the
next token depends only on the current one (``tests/builders.py``), so a prompt holding a stretch
of the target's own chain, ending where that stretch began, is continued by copying the stretch:
drafts are accepted whole.
"""

import numpy as np
import pytest
import torch

from specdec.config import ConfigError
from specdec.engine.engine import Engine
from specdec.engine.sampling import SamplingParams

from .helpers import assert_no_leak, make_pair, prompts_of
from .test_sampling_distribution import LENGTH, PROMPT, chi_square_p, exact_distribution, flat_pair, \
    sample_counts

SMALL = dict(speculative_ngram_max_match_window_size=4, speculative_num_draft_tokens=6)


def ngram_engine(target, *, page_size=1, **kw) -> Engine:
    kw.setdefault("max_total_tokens", 8192)
    kw.setdefault("max_running_requests", 16)
    for key, value in SMALL.items():
        kw.setdefault(key, value)
    kw.setdefault("overlap_schedule", True)
    return Engine(target_model=target, page_size=page_size, speculative_algorithm="NGRAM", **kw)


def plain_engine(target, *, page_size=1, **kw) -> Engine:
    kw.setdefault("max_total_tokens", 8192)
    kw.setdefault("max_running_requests", 16)
    return Engine(target_model=target, page_size=page_size, **kw)


def chain_of(target, start: int, length: int) -> list[int]:
    """The fixture target's greedy chain from ``start`` (its next token depends on the current one only)."""
    w = target.lm_head_weight.float() @ target.model.norm(target.embed_tokens.weight.float()).T  # [V, V]
    out = [start]
    for _ in range(length - 1):
        out.append(int(w[:, out[-1]].argmax()))
    return out


def repetitive_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    """Random spans repeated two or three times: lookups match from the second copy on."""
    rng = np.random.default_rng(seed)
    prompts = []
    for length, copies in [(5, 3), (9, 2), (3, 4), (12, 2), (7, 3)]:
        span = rng.integers(3, vocab, size=length).tolist()
        prompts.append(span * copies + span[: length // 2])
    return prompts


def _ids(outs):
    return [o["output_ids"] for o in outs]


def _accepts(outs):
    return [k for o in outs for k in o["meta_info"]["spec_accept_lengths"]]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("ngram", [
    dict(speculative_ngram_max_bfs_breadth=1),
    dict(speculative_ngram_max_bfs_breadth=3),
    dict(speculative_ngram_max_bfs_breadth=3, speculative_ngram_match_type="PROB", speculative_adaptive="off"),
], ids=["chain", "bfs-tree", "prob-tree-fixed"])
def test_greedy_equals_plain_decoding(ngram, page_size):
    target, _ = make_pair("EAGLE", "mixed")
    prompts = repetitive_prompts(target.config.vocab_size) + prompts_of([4, 17], target.config.vocab_size)
    params = [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in (30, 9, 25, 1, 40, 16, 22)]
    expected = plain_engine(target, page_size=page_size).generate(input_ids=prompts, sampling_params=params)
    eng = ngram_engine(target, page_size=page_size, **ngram)
    got = eng.generate(input_ids=prompts, sampling_params=params)
    assert _ids(got) == _ids(expected)
    assert max(_accepts(got)) >= 2  # drafts were accepted, several tokens at a time
    assert_no_leak(eng)


def test_copying_accepts_whole_drafts():
    target, _ = make_pair("EAGLE", "perfect")
    stretch = chain_of(target, 11, 24)
    prompt = stretch + [5, 7] + stretch[:3]
    params = {"temperature": 0, "max_new_tokens": 30, "ignore_eos": True}
    expected = plain_engine(target).generate(input_ids=prompt, sampling_params=params)
    got = ngram_engine(target, speculative_num_draft_tokens=9).generate(input_ids=prompt, sampling_params=params)
    assert got["output_ids"] == expected["output_ids"]
    # the 21 tokens left of the stretch in two whole drafts
    assert got["meta_info"]["spec_accept_lengths"][:2] == [8, 8]


def test_forced_lookups_look_up_every_step_and_stay_lossless():
    """``force = LOOK_UP_EVERY_STEP`` (benchmarks' diagnostic): each step looks up, the policy never asked;
    the output is still plain decoding's. A mixed target rejects often (rows' budgets shrink, some steps
    then find nothing to draft); a perfect one copying a stretch finds a match every step."""
    from specdec.ngram.worker import LOOK_UP_EVERY_STEP

    for kind in ("mixed", "perfect"):
        target, _ = make_pair("EAGLE", kind)
        stretch = chain_of(target, 11, 40)  # copied past the 24 new tokens
        prompts = repetitive_prompts(target.config.vocab_size) + [stretch + [5, 7] + stretch[:3]]
        params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
        expected = plain_engine(target).generate(input_ids=prompts, sampling_params=params)
        eng = ngram_engine(target, speculative_adaptive="on")  # the policy on (CPU: off by default)
        eng.worker.force = LOOK_UP_EVERY_STEP
        got = eng.generate(input_ids=prompts, sampling_params=params)
        assert _ids(got) == _ids(expected)
        assert eng.worker.policy.chosen == {}  # the policy was never asked
        if kind == "perfect":
            assert "plain" not in got[-1]["meta_info"]["spec_shapes"]
        assert_no_leak(eng)


def test_no_match_decodes_plainly():
    """Distinct tokens: no lookup ever matches, so every step is a plain step."""
    target, _ = make_pair("EAGLE", "random")
    prompt = list(range(3, 23))
    params = {"temperature": 0, "max_new_tokens": 1, "ignore_eos": True}
    eng = ngram_engine(target)
    out = eng.generate(input_ids=prompt, sampling_params={**params, "max_new_tokens": 2})
    assert out["meta_info"]["spec_shapes"] == {"plain": 1}
    assert set(eng.scheduler.spec_shape_steps) == {"plain"}  # (and one launched ahead of its end, overlap)
    assert_no_leak(eng)


def test_padded_graph_path_and_chunked_prefill_are_lossless():
    """The verify sizes' static (CUDA-graph) path run eagerly, batches padded to [2, 8]; prompts
    prefilled in 8-token chunks alternating with decode steps."""
    target, _ = make_pair("EAGLE", "mixed")
    prompts = repetitive_prompts(target.config.vocab_size, seed=1)
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    expected = plain_engine(target).generate(input_ids=prompts, sampling_params=params)
    eng = ngram_engine(target, speculative_ngram_max_bfs_breadth=2, chunked_prefill_size=8)
    assert eng.worker.verify_graph_sizes([2, 8]) == {2: [2, 8], 3: [2, 8], 5: [2, 8], 6: [2, 8]}
    eng.capture_cuda_graphs([2, 8], use_graphs=False)
    got = eng.generate(input_ids=prompts, sampling_params=params)
    assert _ids(got) == _ids(expected)
    verify_calls = sum(g.num_calls for (mode, _, _), g in eng.runner.graphs.items() if mode.name == "TARGET_VERIFY")
    assert verify_calls > 0
    assert_no_leak(eng)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-path"])
def test_device_lookups_read_every_requests_exact_history(graphs):
    """Every forward records its input tokens at their KV slots (``ForwardBatch.slot_tokens``; on the
    graph path inside the captured function): after prefill, plain and lookup steps, each running
    request's KV slots hold exactly its tokens, as its device lookups read them."""
    target, _ = make_pair("EAGLE", "mixed")
    eng = ngram_engine(target, max_running_requests=8)
    if graphs:
        eng.capture_cuda_graphs([2, 8], use_graphs=False)
    _assert_slots_hold_each_requests_tokens(eng)


@pytest.mark.gpu
def test_gpu_graphs_record_each_requests_tokens_at_its_slots():
    """The same on CUDA with captured graphs: the write of ``slot_tokens`` is part of each replayed
    decode and verify graph (a graph that lost it would leave stale tokens for the lookups)."""
    target, _ = make_pair("EAGLE", "mixed")
    eng = ngram_engine(target.cuda(), max_running_requests=8, device="cuda", attention_backend="triton",
                       disable_cuda_graph=True)
    eng.capture_cuda_graphs([1, 2, 4, 8])
    assert all(g.use_graphs for g in eng.runner.graphs.values())
    _assert_slots_hold_each_requests_tokens(eng)


def _assert_slots_hold_each_requests_tokens(eng) -> None:
    assert eng.worker.slot_tokens is not None  # device lookups, the default
    if eng.runner.graphs:
        assert eng.runner.graph_slot_tokens is eng.worker.slot_tokens
    params = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 40, "ignore_eos": True})
    reqs = [eng.make_request(input_ids=p, sampling_params=params)
            for p in repetitive_prompts(eng.runner.model.config.vocab_size, seed=2)]
    for req in reqs:
        eng.add_request(req)
    checked = 0
    for _ in range(12):
        eng.step()
        for req in eng.scheduler.running:
            if not req.output_ids:
                continue
            tokens = (req.prompt_ids + req.output_ids)[:req.kv_len]
            slots = eng.memory.req_to_token[req.row, :req.kv_len].long()
            assert eng.worker.slot_tokens[slots].tolist() == tokens
            checked += 1
    assert checked > 0 and sum(n for k, n in eng.scheduler.spec_shape_steps.items() if k != "plain") > 0
    if eng.runner.graphs:
        assert sum(g.num_calls for g in eng.runner.graphs.values()) > 0


def test_retraction_under_a_small_kv_pool_is_lossless():
    target, _ = make_pair("EAGLE", "mixed")
    prompts = repetitive_prompts(target.config.vocab_size, seed=2) + prompts_of([12, 20, 7], 97, seed=15)
    params = {"temperature": 0, "max_new_tokens": 50, "ignore_eos": True}
    expected = plain_engine(target).generate(input_ids=prompts, sampling_params=params)
    eng = ngram_engine(target, max_total_tokens=160, page_size=16, max_running_requests=8,
                       schedule_conservativeness=0.05)
    got = eng.generate(input_ids=prompts, sampling_params=params)
    assert _ids(got) == _ids(expected)
    assert eng.cache_stats()["num_retracted_reqs"] > 0
    assert_no_leak(eng)


def test_sampling_follows_the_target_distribution():
    """Chi-square over all 3-token continuations (tests/e2e/test_sampling_distribution.py): a
    6-token vocabulary makes matches frequent, so drafts are accepted and rejected alike."""
    target, _ = flat_pair()
    params = {"temperature": 1.0, "max_new_tokens": LENGTH, "ignore_eos": True}
    exact = exact_distribution(target, SamplingParams.from_dict(params))
    eng = ngram_engine(target, max_running_requests=64, random_seed=1, speculative_ngram_max_bfs_breadth=2,
                       speculative_num_draft_tokens=3, speculative_ngram_max_match_window_size=2)
    counts = sample_counts(eng, params, 3000)
    assert chi_square_p(counts, exact) > 1e-3
    results = eng.generate(input_ids=[PROMPT * 2] * 32, sampling_params={**params, "max_new_tokens": 12})
    accepted = _accepts(results)
    assert 0 in accepted and max(accepted) >= 1
    assert_no_leak(eng)


@pytest.mark.parametrize("flags, name", [
    (dict(speculative_draft_model_path="/some/head"), "--speculative-draft-model-path"),
    (dict(speculative_eagle_topk=4), "--speculative-eagle-topk"),
    (dict(speculative_num_steps=3), "--speculative-num-steps"),
    (dict(speculative_token_map="/some/map"), "--speculative-token-map"),
    (dict(speculative_ngram_capacity=-1), "--speculative-ngram-capacity"),
    (dict(speculative_ngram_capacity=100, speculative_ngram_branch_length=1), "--speculative-ngram-branch-length"),
    (dict(speculative_ngram_branch_length=8), "--speculative-ngram-branch-length needs --speculative-ngram-capacity"),
    (dict(speculative_draft_kv_cache_dtype="fp8_e4m3"), "--speculative-draft-kv-cache-dtype"),
    (dict(speculative_ngram_min_match_window_size=5), "--speculative-ngram-min-match-window-size"),
    (dict(speculative_ngram_min_bfs_breadth=0), "--speculative-ngram-min-bfs-breadth"),
    (dict(speculative_ngram_match_type="LRU"), "--speculative-ngram-match-type"),
])
def test_flags_that_do_not_apply_are_refused_by_name(flags, name):
    target, _ = make_pair("EAGLE", "random")
    with pytest.raises(ConfigError, match=name):
        ngram_engine(target, **flags)


def test_ngram_flags_without_ngram_are_refused():
    target, draft = make_pair("EAGLE", "random")
    with pytest.raises(ConfigError, match="--speculative-ngram-max-bfs-breadth applies only to"):
        Engine(target_model=target, draft_model=draft, speculative_algorithm="EAGLE",
               speculative_ngram_max_bfs_breadth=3)
    with pytest.raises(ConfigError, match="takes no draft model"):
        Engine(target_model=target, draft_model=draft, speculative_algorithm="NGRAM")


def _cross_request_prompts(target):
    """An earlier request whose output is the fixture target's chain from 11, and a later one with
    distinct tokens of its own ending in 11: its continuation appears only in the earlier output."""
    chain = chain_of(target, 11, 40)
    others = [t for t in range(3, target.config.vocab_size) if t not in chain]
    return [others[:6] + [11], others[6:14] + [11]]


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("cache", [True, False])
def test_cross_request_cache_drafts_from_finished_requests(cache, overlap):
    target, _ = make_pair("EAGLE", "perfect")
    first, second = _cross_request_prompts(target)
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    plain = plain_engine(target)
    flags = dict(speculative_ngram_capacity=5000, speculative_ngram_branch_length=8) if cache else {}
    eng = ngram_engine(target, overlap_schedule=overlap, speculative_ngram_max_bfs_breadth=1, **flags)
    for prompt in (first, second):
        got = eng.generate(input_ids=prompt, sampling_params=params)
        assert got["output_ids"] == plain.generate(input_ids=prompt, sampling_params=params)["output_ids"]
    accepted = got["meta_info"]["spec_accept_lengths"]
    if cache:  # the first request finished: its windows draft the second's continuation
        assert max(accepted) >= 3 and got["meta_info"]["spec_verify_ct"] < 24
    else:
        assert max(accepted, default=0) == 0
    assert_no_leak(eng)


def test_cross_request_cache_greedy_equals_plain_decoding():
    """Trees and a small cache (evicting) over a batch and a second round: output equals plain decoding."""
    target, _ = make_pair("EAGLE", "mixed")
    prompts = repetitive_prompts(target.config.vocab_size, seed=4) + prompts_of([5, 13], target.config.vocab_size)
    params = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}
    expected = plain_engine(target).generate(input_ids=prompts, sampling_params=params)
    eng = ngram_engine(target, speculative_ngram_max_bfs_breadth=3, speculative_ngram_capacity=300,
                       speculative_ngram_branch_length=6)
    for _ in range(2):
        assert _ids(eng.generate(input_ids=prompts, sampling_params=params)) == _ids(expected)
    assert 0 < eng.worker.cache.size <= 300
    assert_no_leak(eng)


def test_logprobs_penalties_and_seeds_under_ngram():
    """Greedy logprobs and penalised output equal plain decoding's; a seeded sample repeats itself."""
    target, _ = make_pair("EAGLE", "mixed")
    with torch.no_grad():
        target.lm_head_weight.mul_(0.3)  # real spread in the logprobs
    prompts = repetitive_prompts(target.config.vocab_size, seed=3)[:3]
    plain, eng = plain_engine(target), ngram_engine(target)
    for extra in ({"return_logprob": True, "top_logprobs_num": 3}, {"frequency_penalty": 0.7, "return_logprob": True}):
        params = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True, **extra}
        expected, got = plain.generate(input_ids=prompts, sampling_params=params), \
            eng.generate(input_ids=prompts, sampling_params=params)
        assert _ids(got) == _ids(expected)
        for e, g in zip(expected, got):
            torch.testing.assert_close(g["meta_info"]["output_token_logprobs"],
                                       e["meta_info"]["output_token_logprobs"], rtol=0, atol=1e-5)
    # a seeded request repeats itself; NOTE: not always inside a batch (README, `seed`): a step of its
    # batch verifies if any request drafted, and a verify step draws its coins unlike a plain one
    seeded = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True, "sampling_seed": 5}
    first, again = (eng.generate(input_ids=prompts[0], sampling_params=seeded)["output_ids"] for _ in range(2))
    assert first == again
    assert_no_leak(eng)


def test_prefix_cache_serves_an_ngram_engine():
    target, _ = make_pair("EAGLE", "mixed")
    prompt = repetitive_prompts(target.config.vocab_size, seed=4)[3]
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    eng = ngram_engine(target)
    first = eng.generate(input_ids=prompt, sampling_params=params)
    second = eng.generate(input_ids=prompt, sampling_params=params)
    assert second["meta_info"]["cached_tokens"] > 0 and second["output_ids"] == first["output_ids"]
    assert eng.kv_bytes_per_token["draft"] == 0
    assert_no_leak(eng)


def test_chain_helper_is_the_fixture_chain():
    """``chain_of`` reads the fixture's greedy map: plain decoding from a token follows it."""
    target, _ = make_pair("EAGLE", "perfect")
    out = plain_engine(target).generate(input_ids=[11], sampling_params={"temperature": 0, "max_new_tokens": 6,
                                                                          "ignore_eos": True})
    assert [11] + out["output_ids"] == chain_of(target, 11, 7)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("breadth", [None, 1, 3], ids=["device", "chain", "tree"])
def test_gpu_verify_graphs_replay_equal_eager_and_plain(breadth, page_size):
    """On CUDA with the triton backend: NGRAM's verify sizes replay captured graphs (batches 1-8,
    3, 5, 6, 7 padded), token for token equal to eager NGRAM and to plain decoding (fp32)."""
    target, _ = make_pair("EAGLE", "mixed")
    target = target.cuda()
    prompts = repetitive_prompts(target.config.vocab_size, seed=5) + prompts_of([6, 11, 3], 97, seed=6)
    params = [{"temperature": 0, "max_new_tokens": 20 + 3 * i, "ignore_eos": True} for i in range(len(prompts))]
    kw = dict(device="cuda", attention_backend="triton", page_size=page_size, disable_cuda_graph=True)
    expected = _ids(plain_engine(target, **kw).generate(input_ids=prompts, sampling_params=params))
    eager = ngram_engine(target, **kw, speculative_ngram_max_bfs_breadth=breadth)
    graphs = ngram_engine(target, **kw, speculative_ngram_max_bfs_breadth=breadth)
    graphs.capture_cuda_graphs([1, 2, 4, 8])
    assert all(g.use_graphs for g in graphs.runner.graphs.values())
    for bs in (1, 3, 8):
        got = _ids(graphs.generate(input_ids=prompts[:bs], sampling_params=params[:bs]))
        assert got == _ids(eager.generate(input_ids=prompts[:bs], sampling_params=params[:bs])) == expected[:bs]
    calls = sum(g.num_calls for (mode, _, _), g in graphs.runner.graphs.items() if mode.name == "TARGET_VERIFY")
    assert calls > 0
    assert_no_leak(graphs)


def test_warm_up_runs_every_verify_size_then_forgets_it():
    """``ngram_setup.warm_up`` (at start-up on CUDA with graphs): every verify size once, greedy and
    sampled; then the policy, budgets, prefix cache and step counts are as at start, no KV slot is
    held, and the engine still decodes as plain decoding does."""
    from specdec.engine.ngram_setup import warm_up

    target, _ = make_pair("EAGLE", "mixed")
    eng = ngram_engine(target, speculative_adaptive="on")
    policy, budget = eng.worker.policy, eng.worker.budget
    shapes = warm_up(eng)
    assert {f"ngram{n}" for n in eng.worker.budget.sizes} <= set(shapes)
    assert eng.worker.force is None and eng.worker.policy is not policy and eng.worker.budget is not budget
    assert eng.worker.policy.chosen == {} and not eng.scheduler.decoder.spec_shape_steps
    assert eng.cache_stats()["cached_pages"] == 0
    assert_no_leak(eng)
    prompts = repetitive_prompts(target.config.vocab_size)
    params = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    expected = plain_engine(target).generate(input_ids=prompts, sampling_params=params)
    assert _ids(eng.generate(input_ids=prompts, sampling_params=params)) == _ids(expected)


def test_warm_up_fits_a_short_context():
    """The warm-up's prompt is cut to the context length (12 tokens here): every size still runs."""
    from specdec.engine.ngram_setup import warm_up

    target, _ = make_pair("EAGLE", "mixed")
    eng = ngram_engine(target, speculative_adaptive="on", context_length=12)
    assert {f"ngram{n}" for n in eng.worker.budget.sizes} <= set(warm_up(eng))
    assert_no_leak(eng)
