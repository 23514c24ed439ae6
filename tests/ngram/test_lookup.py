"""Prompt lookup (specdec.ngram): worked examples, the vectorised search against its reference on
random histories, the batch layout serving engines keep, and the vLLM custom-proposer contract."""

import importlib
from types import SimpleNamespace

import numpy as np
import pytest

from specdec.ngram import NgramLookup, propose_ngram, propose_ngram_ref


@pytest.mark.parametrize("history, min_n, max_n, k, expected", [
    # the module docstring's example: "5 9" ends at 1 and 5, the latest wins
    ([5, 9, 7, 2, 5, 9, 7, 8, 5, 9], 1, 3, 3, [7, 8, 5]),
    # a longer match beats a later shorter one: "1 2 3" at 2 over "3" at 6
    ([1, 2, 3, 4, 4, 4, 3, 0, 1, 2, 3], 1, 3, 2, [4, 4]),
    # ... unless longer than max_n allows: then the latest of length max_n
    ([1, 2, 3, 4, 4, 4, 3, 0, 1, 2, 3], 1, 1, 2, [0, 1]),
    # below min_n nothing counts
    ([1, 2, 3, 4, 9, 3], 2, 3, 2, []),
    # the draft stops at the history's end
    ([7, 8, 7], 1, 2, 5, [8, 7]),
    # a run: the match may overlap the suffix itself
    ([6, 6, 6, 6], 1, 4, 3, [6]),
    ([3], 1, 2, 4, []),
    ([1, 2, 1], 1, 2, 0, []),
])
def test_worked_examples(history, min_n, max_n, k, expected):
    h = np.array(history, dtype=np.int32)
    assert propose_ngram(h, min_n=min_n, max_n=max_n, k=k).tolist() == expected
    assert propose_ngram_ref(h, min_n=min_n, max_n=max_n, k=k).tolist() == expected


@pytest.mark.parametrize("history, max_n, k, cut, repeated", [
    # the module docstring's example: a run of one token, the latest match one token before the end
    ([4, 7, 7, 7, 7], 4, 3, [7], [7, 7, 7]),
    # period 2: "1 2 1 2" ends at 3, then 1 2 and the repeat on
    ([1, 2, 1, 2, 1, 2], 4, 5, [1, 2], [1, 2, 1, 2, 1]),
    # enough tokens after the match: the same draft
    ([5, 9, 7, 2, 5, 9, 7, 8, 5, 9], 3, 3, [7, 8, 5], [7, 8, 5]),
    # no match: nothing to repeat
    ([1, 2, 3], 2, 4, [], []),
])
def test_repeat_continues_a_short_repeat(history, max_n, k, cut, repeated):
    h = np.array(history, dtype=np.int64)
    for fn in (propose_ngram, propose_ngram_ref):
        assert fn(h, min_n=1, max_n=max_n, k=k).tolist() == cut
        assert fn(h, min_n=1, max_n=max_n, k=k, repeat=True).tolist() == repeated


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("vocab", [2, 5, 50, 70000])
def test_search_equals_the_reference(vocab, dtype):
    # (small vocabularies: mostly zero bytes, so the suffix's bytes also occur across token boundaries)
    rng = np.random.default_rng(vocab)
    for _ in range(300):
        h = rng.integers(0, vocab, size=int(rng.integers(1, 80))).astype(dtype)
        min_n = int(rng.integers(1, 4))
        max_n = int(rng.integers(min_n, 7))
        k = int(rng.integers(0, 6))
        got = propose_ngram(h, min_n=min_n, max_n=max_n, k=k)
        assert np.array_equal(got, propose_ngram_ref(h, min_n=min_n, max_n=max_n, k=k)), (h, min_n, max_n, k)
        assert got.dtype == h.dtype
        repeated = propose_ngram(h, min_n=min_n, max_n=max_n, k=k, repeat=True)
        ref = propose_ngram_ref(h, min_n=min_n, max_n=max_n, k=k, repeat=True)
        assert np.array_equal(repeated, ref), (h, min_n, max_n, k)
        assert repeated.dtype == h.dtype and len(repeated) == (k if len(got) else 0)
        assert np.array_equal(repeated[:len(got)], got)  # the cut draft, continued


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match="min_n"):
        propose_ngram(np.arange(4), min_n=3, max_n=2, k=1)
    with pytest.raises(ValueError, match="min_n"):
        NgramLookup(min_n=0)


def test_batch_rows_and_the_context_length():
    # [3 requests, 8 slots]: each row's first num_tokens are its history, the rest stale
    tokens = np.full((3, 8), 99, dtype=np.int32)
    tokens[0, :5] = [4, 5, 6, 4, 5]  # "4 5" ended at 1 -> 6 4 5
    tokens[1, :3] = [1, 2, 3]  # no repeat
    tokens[2, :7] = [8, 9, 8, 9, 8, 9, 8]  # 6 free slots? no: max_len 8 leaves room for one token
    lookup = NgramLookup(min_n=1, max_n=3, k=3, max_len=8)
    assert lookup.propose(tokens, np.array([5, 3, 7])) == [[6, 4, 5], [], [9]]
    assert lookup.propose(tokens, np.array([5, 3, 7]), rows=[2, 0], k=1) == [[9], [6]]


def test_vllm_custom_proposer_contract():
    """What vLLM 0.26 does with ``speculative_config={"method": "custom_class", "model": PATH}``:
    import the module, build the class with its config, call ``propose`` after each step."""
    module, name = "specdec.ngram.vllm_proposer.NgramProposer".rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=3, prompt_lookup_min=None, prompt_lookup_max=2),
        model_config=SimpleNamespace(max_model_len=16))
    proposer = cls(config)
    assert callable(proposer.propose) and proposer.load_model() is None
    tokens = np.zeros((4, 16), dtype=np.int32)
    tokens[0, :6] = [10, 11, 12, 13, 10, 11]
    tokens[1, :4] = [7, 7, 7, 7]
    tokens[2, :15] = np.arange(15) % 5  # one slot of context left
    tokens[3, :2] = [1, 1]
    sampled = [[11], [7], [4], []]  # request 3 sampled nothing this step: no draft
    drafts = proposer.propose(sampled, np.array([6, 4, 15, 2]), tokens, slot_mappings=None)
    assert drafts == [[12, 13, 10], [7, 7, 7], [0], []]  # request 1's run continued past its end
