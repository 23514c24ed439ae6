"""The target's prefill through the triton backend gives each request the same bits alone and beside
other kinds of request: with the prefix cache holding a prompt, its last token is recomputed over the
cached entries in whatever group of prompts is admitted with it (a row over its own list,
``row_attention``; eagerly or on the one-token prefill graphs), a fresh prompt takes the extend kernel's
one pass, and a few new tokens over a cached prompt (a conversation's next turn) its plan by such requests
alone. A request's first output token and its logprobs must not depend on the other kinds beside it. On
CPU the kernels run interpreted (a few cases: minutes); the one-token prefill graphs run on the GPU. A
prompt prefilled in chunks cut by the backend's ``prefill_chunk_rule`` takes the bits of the prompt
prefilled whole."""

from __future__ import annotations

import pytest
import torch

from ..triton_env import import_kernels

import_kernels("specdec.attention.triton_backend")

from specdec.cuda_graph.runner import CudaGraphRunner  # noqa: E402
from specdec.forward import ForwardMode  # noqa: E402

from .helpers import assert_no_leak, engine, make_pair, prompts_of  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FIRST_TOKEN = {"temperature": 0, "ignore_eos": True, "max_new_tokens": 1, "return_logprob": True,
               "top_logprobs_num": 5}


def _first_tokens(eng, prompts):
    """Each prompt's first output token with its logprob and top-5 list, all admitted at once."""
    reqs = [eng.make_request(input_ids=p, sampling_params=FIRST_TOKEN) for p in prompts]
    for req in reqs:
        eng.add_request(req)
    while any(not r.finished for r in reqs):
        eng.step()
    return [(r.output_ids[0], r.output_logprobs[0], r.output_top_logprobs[0]) for r in reqs]


def test_a_prompts_first_token_alone_and_beside_others():
    _check_first_tokens(False)


@pytest.mark.gpu
def test_gpu_a_prompts_first_token_alone_and_beside_others_on_graphs():
    """The same with the one-token prefill graphs captured and replayed on the GPU (on CPU the eager case
    alone: the interpreter's minutes)."""
    _check_first_tokens(True)


def _check_first_tokens(graphs):
    """A 260-token prompt, cached but for its last token (which then sees 259 entries: enough for the
    decode kernel's plan to split them one way alone and another beside others, so that path fails
    here), alone, beside another cached prompt, and beside a prompt prefilled whole; a cached 40-token
    prompt likewise; the 260-token prompt with 6 tokens more (its next turn, over the cached 260: the
    planned path) alone and beside a fresh prompt and a recomputed one, in two engines with the same cache."""
    target, _ = make_pair("EAGLE", "random", dtype=torch.bfloat16, seed=5)
    long, cached, fresh, fresh2, more = prompts_of([260, 20, 40, 7, 6], target.config.vocab_size, seed=6)

    def warm():  # an engine whose prefix cache holds long, cached and fresh, computed together
        eng = engine(target.to(DEVICE), attention_backend="triton", device=DEVICE)
        if graphs:  # (on the GPU the engine captured sizes 1-4 itself)
            assert (ForwardMode.EXTEND, 0, 1) in {(m, int(h), t) for m, h, t in eng.runner.graphs}
        _first_tokens(eng, [long, cached, fresh])
        return eng

    eng = warm()
    alone = _first_tokens(eng, [long])[0]  # (the cache keeps the entries it holds: long's stay warm()'s)
    assert _first_tokens(eng, [long, cached])[0] == alone
    short_alone = _first_tokens(eng, [fresh])[0]  # a recomputed 40-token prompt
    beside = _first_tokens(eng, [fresh2, long, fresh])  # fresh2 is prefilled whole beside them
    assert beside[1] == alone and beside[2] == short_alone
    turn = long + more
    other = warm()
    assert _first_tokens(other, [fresh2 + more, turn, fresh])[1] == _first_tokens(eng, [turn])[0]
    assert_no_leak(eng)
    assert_no_leak(other)


def test_cached_prompts_last_tokens_replay_the_one_token_prefill_graph(monkeypatch):
    """Two cached prompts' last tokens take the one-token prefill graph (its padded static path, eagerly on
    CPU), not the decode graph."""
    target, _ = make_pair("EAGLE", "random", dtype=torch.bfloat16, seed=5)
    prompts = prompts_of([12, 9], target.config.vocab_size, seed=9)
    eng = engine(target.to(DEVICE), attention_backend="triton", device=DEVICE, cuda_graph_max_bs=2)
    if DEVICE == "cpu":
        eng.capture_cuda_graphs([1, 2], use_graphs=False)
    _first_tokens(eng, prompts)  # prefilled whole (eagerly): now cached
    modes = {id(graph): key[0] for key, graph in eng.runner.graphs.items()}
    calls, call = [], CudaGraphRunner.__call__
    monkeypatch.setattr(CudaGraphRunner, "__call__",
                        lambda self, bs, **kw: calls.append((modes.get(id(self)), bs)) or call(self, bs, **kw))
    _first_tokens(eng, prompts)
    assert calls == [(ForwardMode.EXTEND, 2)]
    assert_no_leak(eng)


def test_a_fresh_prompts_rows_alone_and_beside_a_longer_one():
    """Without the prefix cache every prompt is prefilled whole: the extend kernel's one pass, wired so that
    a prompt's rows are its own beside a longer one (the kernel's test shows the group's plan failing it;
    in the interpreter these two prompts take the same bits under either plan)."""
    target, _ = make_pair("EAGLE", "random", dtype=torch.bfloat16, seed=5)
    long, fresh = prompts_of([100, 40], target.config.vocab_size, seed=7)
    eng = engine(target.to(DEVICE), attention_backend="triton", device=DEVICE, disable_radix_cache=True)
    alone = _first_tokens(eng, [fresh])[0]
    assert _first_tokens(eng, [long, fresh])[1] == alone
    assert_no_leak(eng)


@pytest.mark.parametrize("budget_tiles, short_len", [
    (9, 90), pytest.param(9, 5, marks=pytest.mark.gpu), pytest.param(10.5, 5, marks=pytest.mark.gpu)])
def test_a_prompt_in_chunks_cut_by_the_rule_takes_the_bits_of_the_whole(budget_tiles, short_len):
    """Steps of at most 9 (10.5) KV tiles of tokens (16 entries in the interpreter, 128 on a GPU), the first
    shared with a short prompt, cut a prompt of 12.5 tiles at the last tile boundary each step's budget
    reaches that leaves four tiles or more on either side (after a prompt of 5.6 tiles the first step's
    budget leaves too little: it waits a step), and give it the first token and logprobs of one prefill of
    the whole prompt. (Cut where the budget ends, ``ChunkRule()``, both CPU cases fail.)"""
    align = 16 if DEVICE == "cpu" else 128
    target, _ = make_pair("EAGLE", "random", dtype=torch.bfloat16, seed=5, max_position_embeddings=4096)
    short, long = prompts_of([short_len * align // 16, align * 25 // 2], target.config.vocab_size, seed=8)
    whole = engine(target.to(DEVICE), attention_backend="triton", device=DEVICE, disable_radix_cache=True,
                   chunked_prefill_size=-1)
    chunked = engine(target.to(DEVICE), attention_backend="triton", device=DEVICE, disable_radix_cache=True,
                     chunked_prefill_size=int(budget_tiles * align))
    assert chunked.scheduler.chunk_rule == (align, 4 * align)
    want = _first_tokens(whole, [short, long])
    assert _first_tokens(chunked, [short, long]) == want
    assert chunked.scheduler.prefill_steps >= 2  # it was chunked
    assert_no_leak(chunked)
