"""Incremental detokenization: a streamed request's text grows by the text of its new tokens, so each
chunk costs a decode of the tokens since the last one, not of the whole output (which made a
256-token answer cost 256 decodes of 128 tokens on average).

The new tokens are decoded in context, ``ids[prefix:]`` against ``ids[prefix:read]`` with ``prefix``
one delivery back, keeping what the first adds to the second: a decoder may render a token
differently at the start of a sequence (SentencePiece drops a first word piece's leading space),
and shows a character whose bytes span tokens as U+FFFD until its last byte arrives, so text that
ends in U+FFFD waits for the next tokens (or the request's end).
"""

from __future__ import annotations

from typing import Any


class TextStream:
    """The decoded text of one growing list of token ids."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.text = ""
        self._prefix = 0  # ids[_prefix:_read]: the tokens decoded last, the new ones' context
        self._read = 0  # ids[:_read] are in text

    def update(self, ids: list[int], *, final: bool = False) -> str:
        """The text of ``ids`` (the list of the last call, grown); ``final``: no more tokens come (a
        character left incomplete stays U+FFFD)."""
        if len(ids) == self._read:
            return self.text
        before = self.tokenizer.decode(ids[self._prefix:self._read])
        window = self.tokenizer.decode(ids[self._prefix:])
        if window.endswith("\ufffd") and not final:
            return self.text
        self.text += window[len(before):]
        self._prefix, self._read = self._read, len(ids)
        return self.text
