"""The tokenizer interface every tokenizer of ours gives, and the shared ``tokenizers``-package base.

Interface: ``encode(text, add_bos=True)``, ``decode(ids)``, ``bos_token_id``, ``eos_token_id``,
``vocab_size``. Optional packages are imported only when used (``require``).
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

__all__ = ["Tokenizer", "TokenizersTokenizer", "require"]


class Tokenizer(Protocol):
    bos_token_id: int | None
    eos_token_id: int | None
    vocab_size: int

    def encode(self, text: str, add_bos: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def require(package: str, extra: str) -> Any:
    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise ImportError(f"{extra} needs the package {package!r}; install it with `pip install {package}`") from e


class TokenizersTokenizer:
    """Shared encode/decode over a ``tokenizers.Tokenizer`` (``self.tok``); subclasses fill it in
    with ``vocab_size``, ``bos_token_id``, ``eos_token_id`` and ``add_bos``."""

    tok: Any
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos: bool

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(self.tok.encode(text, add_special_tokens=False).ids)
        if add_bos and self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)
