"""Stop-string matching in the engine's finish check (specdec.engine.stop_strings, Request.append):
only a string the last token completes counts, min_new_tokens holds stop strings back as it holds
stop tokens back, and the text is cut at the stop string that counted, not at an earlier one."""

from __future__ import annotations

import string

from specdec.engine.request import FinishReason, Request
from specdec.engine.sampling import SamplingParams
from specdec.engine.stop_strings import completes_stop, stop_search_start, trim_at_stop


class Chars:
    """One character per token; token ids are the characters' offsets in ``alphabet``."""

    alphabet = " " + string.ascii_lowercase

    def encode(self, text: str) -> list[int]:
        return [self.alphabet.index(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.alphabet[i] for i in ids)


TOK = Chars()


def _request(stop: tuple[str, ...], min_new_tokens: int = 0, max_new_tokens: int = 64) -> Request:
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, stop=stop)
    return Request(rid="r", prompt_ids=[1], params=params, stop_ids=frozenset())


def test_only_a_string_the_last_token_completes_counts():
    assert completes_stop(TOK.encode("xab"), ("ab",), TOK)
    assert not completes_stop(TOK.encode("xabc"), ("ab",), TOK)  # completed a token earlier, still in the window
    assert completes_stop(TOK.encode("abab"), ("ab",), TOK)  # a repeat, an earlier one in the window
    assert completes_stop(TOK.encode("aab"), ("zz", "ab"), TOK)


def test_trim_at_the_first_stop_string_ending_past_min_end():
    assert trim_at_stop("xabyab", ("ab",)) == "x"
    assert trim_at_stop("xabyab", ("ab",), min_end=3) == "xaby"  # "ab" at 1-2 ends at 3: not past it
    assert trim_at_stop("xabyab", ("ab",), min_end=2) == "x"  # ends at 3, past 2
    assert trim_at_stop("xaby", ("ab",), min_end=3) == "xaby"
    assert stop_search_start(TOK.encode("xabyab"), 0, TOK) == 0
    assert stop_search_start(TOK.encode("xabyab"), 4, TOK) == 3  # the first 3 tokens' text
    assert stop_search_start(TOK.encode("xab"), 5, TOK) == 3  # fewer tokens than that: all of the text


def test_without_min_new_tokens_the_first_stop_string_ends_the_request():
    req = _request(("ab",))
    req.append(TOK.encode("xabyabz"), tokenizer=TOK)
    assert req.finish_reason == FinishReason.STOP and TOK.decode(req.output_ids) == "xab"
    assert req.result(TOK)["text"] == "x"


def test_min_new_tokens_skips_a_stop_string_completed_before_it():
    req = _request(("ab",), min_new_tokens=4)
    req.append(TOK.encode("xa"), tokenizer=TOK)
    req.append(TOK.encode("byabz"), tokenizer=TOK)  # "ab" completed by token 3 (< 4): not counted
    assert req.finish_reason == FinishReason.STOP and TOK.decode(req.output_ids) == "xabyab"
    assert req.result(TOK)["text"] == "xaby"  # the earlier "ab" stays in the text


def test_a_stop_string_completed_by_token_min_new_tokens_counts():
    req = _request(("ab",), min_new_tokens=3)
    req.append(TOK.encode("xabyab"), tokenizer=TOK)
    assert TOK.decode(req.output_ids) == "xab" and req.result(TOK)["text"] == "x"


def test_no_stop_string_after_min_new_tokens_runs_to_max_new_tokens():
    req = _request(("ab",), min_new_tokens=5, max_new_tokens=6)
    req.append(TOK.encode("abxab"), tokenizer=TOK)  # "ab" completed by tokens 2 and 5 (5 counts)
    assert req.finish_reason == FinishReason.STOP and req.result(TOK)["text"] == "abx"
    req = _request(("ab",), min_new_tokens=5, max_new_tokens=6)
    req.append(TOK.encode("abxa"), tokenizer=TOK)
    req.append(TOK.encode("cdef"), tokenizer=TOK)
    assert req.finish_reason == FinishReason.LENGTH and req.result(TOK)["text"] == "abxacd"


def test_a_request_shorter_than_min_new_tokens_keeps_every_stop_string_in_its_text():
    """max_new_tokens below min_new_tokens: no stop string counted, none is cut from the text."""
    req = _request(("ab",), min_new_tokens=8, max_new_tokens=3)
    req.append(TOK.encode("xabq"), tokenizer=TOK)
    assert req.finish_reason == FinishReason.LENGTH and req.result(TOK)["text"] == "xab"
