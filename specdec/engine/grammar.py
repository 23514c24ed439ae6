"""Structured outputs: a request's grammar (JSON schema, regex, EBNF) as token masks, via xgrammar.

Why xgrammar (not outlines-core): it compiles context-free grammars (``json_object`` is arbitrary
nested JSON, which no regular language expresses), its matcher rolls back, and it walks a whole
draft tree in one call (``GrammarMatcher.traverse_draft_tree``) to give every node its own bitmask
along its own path, which is what verification needs. It is optional: ``pip install xgrammar``
(the ``serve`` extra); a request with a grammar gets a clear error when it is missing.

Per request one ``RequestGrammar`` holds the matcher of its committed tokens. Each step:

    tree_mask(tree)   node t's mask = the tokens the grammar allows after the path root -> t
                      (root = the last committed token; the matcher is at the root's state);
                      a node whose own token the grammar rejects gets an all-False row (it can
                      never be accepted: its parent's mask excludes its token)
    accept(tokens)    the committed tokens advance the matcher

Glossary: N = num_draft_tokens (tree nodes incl. the root); V = vocab size; W = ceil(V / 32)
int32 words of a packed bitmask (bit j of word w = token 32 w + j, little-endian).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

GRAMMAR_EXTRA = "structured outputs (json_schema / regex / ebnf / response_format) need the package " \
                "'xgrammar'; install it with `pip install xgrammar` (the specdec[serve] extra)"


def _xgrammar() -> Any:
    try:
        return importlib.import_module("xgrammar")
    except ImportError:
        raise ValueError(GRAMMAR_EXTRA) from None


def _encoded_vocab(tokenizer: Any, vocab_size: int) -> tuple[list, Any]:
    """Every token's surface form and xgrammar's vocab type for it."""
    xgr = _xgrammar()
    sp = getattr(tokenizer, "sp", None)
    if sp is not None:  # SentencePiece: "▁" for spaces, <0xNN> byte pieces
        return [sp.id_to_piece(i) if i < sp.get_piece_size() else "" for i in range(vocab_size)], \
            xgr.VocabType.BYTE_FALLBACK
    tok = getattr(tokenizer, "tok", None)
    if tok is not None:  # tokenizers.Tokenizer
        pieces = [tok.id_to_token(i) or "" for i in range(vocab_size)]
        decoder = str(getattr(tok, "decoder", "") or "")
        if "ByteLevel" in decoder:
            return pieces, xgr.VocabType.BYTE_LEVEL
        return pieces, xgr.VocabType.BYTE_FALLBACK if "<0x0A>" in pieces else xgr.VocabType.RAW
    # any other tokenizer: each token decoded on its own
    return [tokenizer.decode([i]) for i in range(vocab_size)], xgr.VocabType.RAW


class GrammarBackend:
    """Compiles request grammars for one tokenizer (built on first use; compiled grammars cached)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        if tokenizer is None:
            raise ValueError("structured outputs need a tokenizer; this model has none")
        xgr = _xgrammar()
        encoded, vocab_type = _encoded_vocab(tokenizer, vocab_size)
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo(encoded, vocab_type, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._compile = functools.lru_cache(maxsize=64)(self._compile_uncached)

    def _compile_uncached(self, kind: str, source: str) -> Any:
        try:
            if kind == "json_schema":
                return self.compiler.compile_json_schema(source, any_whitespace=False)
            if kind == "regex":
                return self.compiler.compile_regex(source)
            return self.compiler.compile_grammar(source)
        except Exception as e:  # noqa: BLE001 — xgrammar raises RuntimeError / ValueError subclasses
            raise ValueError(f"sampling_params.{kind}: the grammar does not compile: {e}") from None

    def matcher(self, kind: str, source: str) -> "RequestGrammar":
        return RequestGrammar(_xgrammar().GrammarMatcher(self._compile(kind, source)), self.vocab_size)


class RequestGrammar:
    """The matcher of one request's committed tokens."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.words = -(-vocab_size // 32)

    @property
    def terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def accept(self, token: int) -> bool:
        """Advance over one committed token; False when the grammar rejects it (state unchanged)."""
        if self.matcher.is_terminated():
            return False
        return bool(self.matcher.accept_token(int(token)))

    def tree_mask(
        self,
        tokens: torch.Tensor,  # [N] node tokens, root first (the root's is already committed)
        next_token: torch.Tensor,  # [N] first child of each node (local index), -1 for leaves
        next_sibling: torch.Tensor,  # [N] next sibling, -1 for none
    ) -> torch.Tensor:  # [N, V] bool: token allowed after the path root -> node
        n = int(tokens.shape[0])
        bitmask = torch.zeros(n, self.words, dtype=torch.int32)
        if n == 1:
            self.matcher.fill_next_token_bitmask(bitmask, 0)
        else:
            self.matcher.traverse_draft_tree(next_token.long().cpu().contiguous(),
                                             next_sibling.long().cpu().contiguous(),
                                             tokens.long().cpu().contiguous(), bitmask)
        return unpack_bitmask(bitmask, self.vocab_size)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, W] int32 packed bits -> [rows, V] bool (bit j of word w = token 32 w + j)."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask[:, :, None] >> shifts) & 1  # [rows, W, 32]
    return bits.flatten(1)[:, :vocab_size].bool()
