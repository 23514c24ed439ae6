"""--speculative-algorithm STANDALONE end to end on CPU: a whole causal LM of the target's vocabulary
drafts. Greedy output equals plain decoding token for token (chains and trees, page sizes 1 and 16,
overlap scheduling, the padded CUDA-graph path, plain steps between speculative ones, chunked
prefill, retraction, the prefix cache), the target as its own draft accepts every chain token,
sampled output follows the target distribution, no KV slot leaks, and what does not fit is refused.

Drafts: ``small_draft`` is a random LM with fewer layers and a narrower hidden state (rarely right);
``chain_draft`` a one-layer LM that reproduces the perfect-draft fixture's next-token map
(``tests/builders.py``), so on the perturbed ("mixed") target it is right often, not always.
"""

import copy
import dataclasses

import pytest
import torch

from specdec.config import ConfigError
from specdec.engine.engine import Engine
from specdec.engine.sampling import SamplingParams
from specdec.models.llama import LlamaForCausalLM

from ..builders import make_random_target, randomize_, tiny_llama_config
from .helpers import assert_no_leak, engine, make_pair, perturb_target, prompts_of
from .test_sampling_distribution import LENGTH, PROMPT, VOCAB, chi_square_p, exact_distribution, sample_counts

LENGTHS, MAX_NEW = [1, 9, 4, 23, 2, 15, 6], [17, 5, 30, 12, 1, 24, 9]
GREEDY = [{"temperature": 0, "max_new_tokens": m, "ignore_eos": True} for m in MAX_NEW]


def small_draft(target: LlamaForCausalLM, seed: int = 5) -> LlamaForCausalLM:
    """A random LM of the target's vocabulary: 1 layer, H 32, 2 query / 1 KV heads."""
    config = tiny_llama_config(vocab_size=target.config.vocab_size, num_hidden_layers=1, hidden_size=32,
                               intermediate_size=48, num_attention_heads=2, num_key_value_heads=1)
    return make_random_target(config, seed)


@torch.no_grad()
def chain_draft(perfect_target: LlamaForCausalLM) -> LlamaForCausalLM:
    """One layer, the fixture target's embedding, norm and lm_head, zero o/down projections: its
    next token is the fixture's f(current token)."""
    draft = randomize_(LlamaForCausalLM(dataclasses.replace(perfect_target.config, num_hidden_layers=1)), 7)
    shared = {k: v for k, v in perfect_target.state_dict().items() if not k.startswith("model.layers.")}
    draft.load_state_dict(shared, strict=False)
    for layer in draft.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    return draft.eval()


def mixed_pair(seed: int = 0) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    target, _ = make_pair("EAGLE", "perfect", seed=seed)
    draft = chain_draft(target)
    return perturb_target(target, 1.2, seed + 3), draft


def standalone(target, draft, shape, **kw) -> Engine:
    return engine(target, draft, algorithm="STANDALONE", shape=shape, **kw)


def _ids(outs):
    return [o["output_ids"] for o in outs]


def _accepts(outs):
    return [k for o in outs for k in o["meta_info"]["spec_accept_lengths"]]


@pytest.mark.parametrize("shape, page_size, overlap, graphs", [
    ((3, 1, 4), 1, False, False),
    ((4, 3, 8), 1, False, True),
    ((3, 1, 4), 16, True, False),
    ((4, 3, 8), 16, True, True),
    ((5, 4, 8), 16, False, True),
], ids=["chain", "tree-graphs", "chain-paged-overlap", "tree-paged-overlap-graphs", "5x4x8-paged-graphs"])
@pytest.mark.parametrize("which", ["small", "chain"])
def test_greedy_equals_plain_decoding(which, shape, page_size, overlap, graphs):
    """Batches of 7 (padded to the captured sizes [2, 8] on the graph path, run eagerly on CPU)."""
    target, draft = mixed_pair() if which == "chain" else (make_random_target(seed=0), None)
    draft = draft if draft is not None else small_draft(target)
    prompts = prompts_of(LENGTHS, target.config.vocab_size)
    expected = engine(target, page_size=page_size).generate(input_ids=prompts, sampling_params=GREEDY)
    spec = standalone(target, draft, shape, page_size=page_size, overlap_schedule=overlap)
    if graphs:
        spec.capture_cuda_graphs([2, 8], use_graphs=False)
    got = spec.generate(input_ids=prompts, sampling_params=GREEDY)
    assert _ids(got) == _ids(expected)
    if graphs:
        assert spec.worker.draft_graph.runner.num_calls > 0 and spec.worker.draft_extend_graph.runner.num_calls > 0
    if which == "chain":  # a draft right often, not always
        assert 0 in _accepts(got) and max(_accepts(got)) == shape[0]
    assert_no_leak(spec)


@pytest.mark.parametrize("overlap", [False, True])
def test_the_target_as_its_own_draft_accepts_every_chain_token(overlap):
    """A perfect draft: every verify step of a (4, 1, 5) chain accepts all 4 draft tokens, except a
    request's last step, cut at max_new_tokens."""
    target = make_random_target(seed=3)
    prompts = prompts_of([3, 11, 6], target.config.vocab_size, seed=1)
    params = {"temperature": 0, "max_new_tokens": 21, "ignore_eos": True}
    expected = engine(target).generate(input_ids=prompts, sampling_params=params)
    spec = standalone(target, target, (4, 1, 5), overlap_schedule=overlap)
    got = spec.generate(input_ids=prompts, sampling_params=params)
    assert _ids(got) == _ids(expected)
    for out in got:  # 20 tokens after the prefill's: 4 steps of 5
        assert out["meta_info"]["spec_accept_lengths"] == [4, 4, 4, 4]
    assert_no_leak(spec)


def test_plain_steps_between_speculative_ones_keep_the_draft_in_step():
    """Above the batch-size threshold steps decode plainly (the draft extends over one token), and
    requests asking for no speculation never speculate; output stays plain decoding's."""
    target, draft = mixed_pair(seed=1)
    prompts = prompts_of(LENGTHS, target.config.vocab_size, seed=2)
    expected = engine(target).generate(input_ids=prompts, sampling_params=GREEDY)
    spec = standalone(target, draft, (3, 2, 6), speculative_batch_size_threshold=3)
    params = [{**p, "speculative": i % 3 != 0} for i, p in enumerate(GREEDY)]
    got = spec.generate(input_ids=prompts, sampling_params=params)
    assert _ids(got) == _ids(expected)
    assert max(_accepts(got)) > 0
    assert_no_leak(spec)


@pytest.mark.parametrize("overlap", [False, True])
def test_adaptive_speculation_over_every_shape_and_plain_steps(overlap, tmp_path):
    """Adaptive speculation drives the standalone draft too: a policy stand-in cycling through every
    candidate shape and plain steps (tests/e2e/test_adaptive.py) stays lossless."""
    from specdec.eagle.adaptive import AdaptiveEAGLEWorker
    from specdec.eagle.policy import PLAIN

    from .test_adaptive import Cycle, adaptive_engine

    target, draft = mixed_pair(seed=5)
    prompts = prompts_of([5, 12, 3, 9], target.config.vocab_size, seed=4)
    params = [{"temperature": 0, "ignore_eos": True, "max_new_tokens": n} for n in (30, 17, 41, 25)]
    expected = engine(target).generate(input_ids=prompts, sampling_params=params)
    spec = adaptive_engine(target, draft, "STANDALONE", tmp_path, page_size=16, overlap_schedule=overlap)
    assert isinstance(spec.worker, AdaptiveEAGLEWorker)
    spec.worker.policy = Cycle(spec.worker.shapes)
    got = spec.generate(input_ids=prompts, sampling_params=params)
    assert _ids(got) == _ids(expected)
    chosen = {name for g in got for name in g["meta_info"]["spec_shapes"]}
    assert chosen == {PLAIN} | {s.name for s in spec.worker.shapes}
    assert_no_leak(spec)


def test_chunked_prefill_retraction_and_the_prefix_cache():
    target, draft = mixed_pair(seed=2)
    prompts = prompts_of([12, 30, 7, 21, 9, 15, 5, 18], target.config.vocab_size, seed=3)
    params = {"temperature": 0, "max_new_tokens": 50, "ignore_eos": True}
    expected = engine(target).generate(input_ids=prompts, sampling_params=params)
    spec = standalone(target, draft, (3, 2, 6), chunked_prefill_size=8, max_total_tokens=160, page_size=16,
                      max_running_requests=8, schedule_conservativeness=0.05)
    assert _ids(spec.generate(input_ids=prompts, sampling_params=params)) == _ids(expected)
    assert spec.cache_stats()["num_retracted_reqs"] > 0
    assert_no_leak(spec)
    # a prompt sharing 20 tokens takes 19 positions' target and draft KV from the cache: every engine keys
    # by token pairs (specdec.engine.prefix_cache), so its prefill starts where plain decoding's does
    cached = standalone(target, draft, (3, 2, 6))
    cached.generate(input_ids=prompts[1], sampling_params=params)
    branch = prompts[1][:20] + [(prompts[1][20] + 1) % 97] + prompts[1][21:25]
    again = cached.generate(input_ids=branch, sampling_params=params)
    assert again["meta_info"]["cached_tokens"] == 19
    assert again["output_ids"] == engine(target).generate(input_ids=branch, sampling_params=params)["output_ids"]
    assert cached.kv_bytes_per_token["draft"] > 0
    assert_no_leak(cached)


def test_logprobs_penalties_n_and_seeds():
    target, draft = mixed_pair(seed=4)
    with torch.no_grad():
        target.lm_head_weight.mul_(0.3)  # real spread in the logprobs
    prompts = prompts_of([5, 13, 8], target.config.vocab_size, seed=4)
    plain, spec = engine(target), standalone(target, draft, (3, 2, 6))
    for extra in ({"return_logprob": True, "top_logprobs_num": 3}, {"frequency_penalty": 0.7, "return_logprob": True}):
        params = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True, **extra}
        expected, got = plain.generate(input_ids=prompts, sampling_params=params), \
            spec.generate(input_ids=prompts, sampling_params=params)
        assert _ids(got) == _ids(expected)
        for e, g in zip(expected, got):
            torch.testing.assert_close(g["meta_info"]["output_token_logprobs"],
                                       e["meta_info"]["output_token_logprobs"], rtol=0, atol=1e-5)
    seeded = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True, "sampling_seed": 5}
    alone = spec.generate(input_ids=prompts[0], sampling_params=seeded)["output_ids"]
    batch = spec.generate(input_ids=[prompts[0]] * 3, sampling_params=[seeded, {**seeded, "sampling_seed": 6}, seeded])
    assert batch[0]["output_ids"] == alone == batch[2]["output_ids"]
    assert_no_leak(spec)


@pytest.mark.parametrize("shape", [(3, 1, 4), (3, 3, 7)], ids=["chain", "tree"])
def test_sampling_follows_the_target_distribution(shape):
    """Chi-square over all 3-token continuations (tests/e2e/test_sampling_distribution.py); the
    draft is a perturbed copy of the flattened target, so it is accepted and rejected alike."""
    target, _ = make_pair("EAGLE", "mixed", vocab_size=VOCAB)
    with torch.no_grad():
        target.lm_head_weight.mul_(0.35)
    draft = perturb_target(copy.deepcopy(target), 1.0, 11)
    params = {"temperature": 1.0, "max_new_tokens": LENGTH, "ignore_eos": True}
    exact = exact_distribution(target, SamplingParams.from_dict(params))
    spec = standalone(target, draft, shape, max_running_requests=64, random_seed=1)
    assert chi_square_p(sample_counts(spec, params, 3000), exact) > 1e-3
    accepted = _accepts(spec.generate(input_ids=[PROMPT] * 32, sampling_params={**params, "max_new_tokens": 12}))
    assert 0 in accepted and max(accepted) >= 2
    assert_no_leak(spec)


def test_a_draft_of_another_vocabulary_is_refused():
    target = make_random_target(seed=0)
    other = make_random_target(tiny_llama_config(vocab_size=101, num_hidden_layers=1), seed=1)
    with pytest.raises(ValueError, match="--speculative-draft-model-path.*101 tokens, the target's 97"):
        standalone(target, other, (3, 1, 4))


@pytest.mark.parametrize("flags, name", [
    (dict(speculative_token_map="/some/map"), "--speculative-token-map"),
    (dict(speculative_simulate_acceptance_model="/some/model.json"), "--speculative-simulate-acceptance-model"),
    (dict(speculative_ngram_max_bfs_breadth=3), "--speculative-ngram-max-bfs-breadth"),
])
def test_flags_that_do_not_apply_are_refused_by_name(flags, name):
    target = make_random_target(seed=0)
    with pytest.raises(ConfigError, match=name):
        standalone(target, small_draft(target), (3, 1, 4), **flags)


def test_heads_and_lms_are_not_mixed_up():
    target, head = make_pair("EAGLE", "random")
    with pytest.raises(ConfigError, match="--speculative-draft-model-path: STANDALONE drafts with a causal LM.*"
                                          "not a EagleDraftModel"):
        standalone(target, head, (3, 1, 4))
    with pytest.raises(ValueError, match="got a standalone draft LM; use STANDALONE"):
        from specdec.eagle.standalone import StandaloneDraft

        engine(target, StandaloneDraft(small_draft(target)), algorithm="EAGLE", shape=(3, 1, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("shape", [(3, 1, 4), (4, 3, 8)], ids=["chain", "tree"])
def test_gpu_graph_replay_equals_eager_and_plain(shape, page_size):
    """On CUDA with the triton backend: the draft loop, draft extend, verify and plain decode replay
    captured graphs (batches 1-8; 3, 5, 6, 7 padded), token for token equal to eager STANDALONE and
    to plain decoding (fp32), with and without overlap scheduling."""
    target, draft = mixed_pair()
    target, draft = target.cuda(), draft.cuda()
    prompts = prompts_of(LENGTHS, target.config.vocab_size, seed=6)
    kw = dict(device="cuda", attention_backend="triton", page_size=page_size, cuda_graph_max_bs=8)
    expected = _ids(engine(target, disable_cuda_graph=True, **kw).generate(input_ids=prompts, sampling_params=GREEDY))
    eager = standalone(target, draft, shape, disable_cuda_graph=True, **kw)
    assert _ids(eager.generate(input_ids=prompts, sampling_params=GREEDY)) == expected
    for overlap in (False, True):
        graphs = standalone(target, draft, shape, overlap_schedule=overlap, **kw)
        assert graphs.cuda_graph_bytes > 0
        assert _ids(graphs.generate(input_ids=prompts, sampling_params=GREEDY)) == expected
        assert graphs.worker.draft_graph.runner.num_calls > 0
        assert graphs.worker.draft_extend_graph.runner.num_calls > 0
        assert_no_leak(graphs)
