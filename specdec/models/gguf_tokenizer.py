"""Tokenizers stored inside GGUF files, rebuilt with the ``tokenizers`` package.

* ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE: SmolLM2, Llama 3, Qwen2/3): vocabulary and
  merges from ``tokenizer.ggml.tokens`` / ``merges``; the pre-tokenizer ``tokenizer.ggml.pre`` names.
* ``tokenizer.ggml.model == "llama"`` (SentencePiece BPE: Gemma, Llama 2, Mistral): spaces become
  "▁", pieces merge in the order of their scores (llama.cpp's SPM tokenizer picks the bigram whose
  merged piece scores highest; the merge list below ranks merges by exactly that), and characters
  outside the vocabulary fall back to the ``<0xNN>`` byte tokens.

Control and user-defined tokens (``token_type`` 3 / 4) become added tokens, so ``<|im_start|>`` or
``<start_of_turn>`` in text encodes to its id. ``tokenizer.chat_template`` is ``chat_template``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from specdec.models.gguf_file import GGUFMeta, open_reader
from specdec.models.tokenizer_base import TokenizersTokenizer, require

__all__ = ["GGUFTokenizer", "load_gguf_tokenizer"]

# llama.cpp token types (gguf.TokenType): 1 NORMAL, 3 CONTROL, 4 USER_DEFINED, 6 BYTE
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4
_SPACE = "▁"


def _pre_tokenizer(tokenizers: Any, pre: str | None, add_prefix_space: bool) -> Any:
    """The pre-tokenizer llama.cpp's ``tokenizer.ggml.pre`` names (GPT-2's regex by default)."""
    pt = tokenizers.pre_tokenizers
    byte_level = pt.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    if pre == "smollm":  # llama.cpp: "\p{N}" then GPT-2's regex == HF's Digits(individual) + ByteLevel
        return pt.Sequence([pt.Digits(individual_digits=True), byte_level])
    if pre not in (None, "default", "gpt2", "gpt-2"):
        warnings.warn(f"GGUF tokenizer.ggml.pre={pre!r}: using GPT-2's pre-tokenizer regex", stacklevel=3)
    return byte_level


def _gpt2_model(tokenizers: Any, meta: GGUFMeta, tokens: list[str]) -> Any:
    pairs = []
    for m in meta.get("tokenizer.ggml.merges", []):
        a, sep, b = str(m).partition(" ")
        if not sep:
            raise ValueError(f"{meta.path}: malformed tokenizer.ggml.merges entry {m!r}")
        pairs.append((a, b))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    tok.pre_tokenizer = _pre_tokenizer(
        tokenizers, meta.get("tokenizer.ggml.pre"), bool(meta.get("tokenizer.ggml.add_space_prefix", False))
    )
    tok.decoder = tokenizers.decoders.ByteLevel()
    return tok


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece-BPE scores: every split of a normal piece into two
    vocabulary pieces, ranked by the merged piece's score (highest first; ties by piece ids).

    Example: pieces a(-3) b(-4) ab(-1) abc(-2) c(-5) -> merges (a, b) then (ab, c): "abc" -> ab c -> abc.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for i, piece in enumerate(tokens):
        if int(types[i]) != _NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[i]), vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def _spm_model(tokenizers: Any, meta: GGUFMeta, tokens: list[str], types: list[int]) -> Any:
    scores = meta.require("tokenizer.ggml.scores")
    vocab = {t: i for i, t in enumerate(tokens)}
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    model = tokenizers.models.BPE(
        vocab=vocab, merges=spm_merges(tokens, scores, types), byte_fallback=True, fuse_unk=True,
        unk_token=None if unk is None else tokens[int(unk)],
    )
    tok = tokenizers.Tokenizer(model)
    norm = [tokenizers.normalizers.Replace(" ", _SPACE)]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        norm.insert(0, tokenizers.normalizers.Prepend(_SPACE))
    tok.normalizer = tokenizers.normalizers.Sequence(norm)
    dec = tokenizers.decoders
    tok.decoder = dec.Sequence([dec.Replace(_SPACE, " "), dec.ByteFallback(), dec.Fuse()])
    return tok


class GGUFTokenizer(TokenizersTokenizer):
    """The tokenizer stored in a GGUF file; same interface as ``HFTokenizer``."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        tokenizers = require("tokenizers", f"the tokenizer in {path}")
        meta = GGUFMeta(open_reader(path), path)
        kind = meta.require("tokenizer.ggml.model")
        tokens = [str(t) for t in meta.require("tokenizer.ggml.tokens")]
        types = [int(t) for t in (meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens))]
        if kind == "gpt2":
            tok = _gpt2_model(tokenizers, meta, tokens)
        elif kind == "llama":
            tok = _spm_model(tokenizers, meta, tokens, types)
        else:
            raise ValueError(f"{path}: tokenizer.ggml.model={kind!r} is not supported ('gpt2' BPE, 'llama' SentencePiece)")
        special = [tokenizers.AddedToken(t, special=True, normalized=False)
                   for t, ty in zip(tokens, types) if ty == _CONTROL]
        user = [tokenizers.AddedToken(t, special=False, normalized=False)
                for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
        if special:
            tok.add_special_tokens(special)
        if user:
            tok.add_tokens(user)
        self.tok = tok
        self.vocab_size = len(tokens)
        bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
        self.bos_token_id = None if bos is None else int(bos)
        self.eos_token_id = None if eos is None else int(eos)
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", self.bos_token_id is not None))
        self.chat_template: str | None = meta.get("tokenizer.chat_template")


def load_gguf_tokenizer(path: str | Path) -> GGUFTokenizer:
    return GGUFTokenizer(path)
