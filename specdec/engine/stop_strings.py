"""Stop strings (``sampling_params.stop``): a request ends with the token that completes one of
its stop strings in the decoded output; the text shown for it is cut before the stop string.

Where: in the engine's finish check (``Request.append``), token by token as committed tokens are
appended, as SGLang's scheduler checks its decoded tail. Not in the HTTP server, which sees a
request's tokens only after a step committed them, several at once when speculating (accepted +
bonus), and could only abort the request a step or more later. Here the tokens after the stop are
never appended, so ``output_ids``, logprobs, ``completion_tokens``, the KV the prefix cache keeps
and the accept statistics all describe the same output, and the request finishes like one stopped
by a stop token: complete ``meta_info``, KV freed in the step that found the stop. Under tensor
parallelism every rank appends the same tokens and decodes them with its own tokenizer, so all
ranks finish the request in the same step. The server only trims the text (``trim_at_stop``) and,
while streaming, holds back a tail that may still become a stop string.

Matching: after each appended token the last ``stop_window`` tokens are decoded and searched for
an occurrence that ends inside the last token's text (past the decoded text of the window's
other tokens): one the last token completed. A token decodes to at least one byte, so a stop
string of B UTF-8 bytes spans at most B tokens; two more keep it clear of the window's edge, where
a decoder may drop a leading space or show half a character as U+FFFD. (A token that decodes to
nothing, e.g. a skipped special token, between the characters of a stop string can hide it.)

``min_new_tokens`` holds stop strings back as it holds stop tokens back (SGLang checks neither
before it): the check starts at output token ``min_new_tokens``, so a stop string counts only if
that token or a later one completes it. The text is then cut at the first occurrence that ends
past the first ``min_new_tokens - 1`` tokens' text (``stop_search_start``); an earlier one stays in
the text.

Worked example, stop "\\n\\n" (B = 2, window 4), one speculative step commits the tokens
["a", "\\n", "\\nThe", " end"]:

    after "a"       tail "...a"          no stop string
    after "\\n"      tail "...a\\n"        no stop string
    after "\\nThe"   tail "...a\\n\\nThe"   "\\n\\n": finished (stop); " end" is not appended
    output_ids end with "\\nThe"'s id; the text shown is "...a" (the stop string and the rest of
    its token are cut; OpenAI and SGLang leave the stop string out of the text)
"""

from __future__ import annotations

from typing import Any

# tokens past a stop string's UTF-8 length that the decoded window spans (see the module docstring)
WINDOW_MARGIN = 2


def stop_window(strings: tuple[str, ...]) -> int:
    """Tokens to decode to find any of ``strings`` completed by the last token."""
    return max(len(s.encode("utf-8")) for s in strings) + WINDOW_MARGIN


def completes_stop(output_ids: list[int], strings: tuple[str, ...], tokenizer: Any) -> bool:
    """Whether the last token of ``output_ids`` completes one of ``strings``: an occurrence in the
    decoded tail that ends inside that token's text."""
    window = output_ids[-stop_window(strings):]
    text = tokenizer.decode(window)
    # NOTE: U+FFFD stands for bytes of a character the last token completes: not text before it
    before = len(tokenizer.decode(window[:-1]).rstrip("\ufffd"))
    return any(text.find(s, max(0, before - len(s) + 1)) >= 0 for s in strings)


def stop_search_start(output_ids: list[int], min_new_tokens: int, tokenizer: Any) -> int:
    """Characters of the decoded output that no counted stop string ends within: those of the
    first ``min_new_tokens - 1`` tokens (0 without ``min_new_tokens``)."""
    n = min_new_tokens - 1  # NOTE: with fewer tokens than that, all of the text: nothing counts yet
    return len(tokenizer.decode(output_ids[:n]).rstrip("\ufffd")) if n > 0 else 0


def trim_at_stop(text: str, strings: tuple[str, ...], min_end: int = 0) -> str:
    """``text`` up to the first stop string in it that ends past character ``min_end`` (all of it
    when none does)."""
    hits = [i for i in (text.find(s, max(0, min_end - len(s) + 1)) for s in strings) if i >= 0]
    return text[: min(hits)] if hits else text
