"""Tokenizers: SentencePiece (llama2.c's ``tok512.model``), HF ``tokenizer.json``, and the one
entry point ``load_tokenizer`` (GGUF files: ``gguf_tokenizer``; the interface: ``tokenizer_base``).

Both give the same small interface: ``encode(text, add_bos=True)``, ``decode(ids)``,
``bos_token_id``, ``eos_token_id``, ``vocab_size``. Optional packages are imported only when used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from specdec.models.gguf_tokenizer import load_gguf_tokenizer
from specdec.models.tokenizer_base import Tokenizer, TokenizersTokenizer, require

__all__ = ["Tokenizer", "TokenizersTokenizer", "SentencePieceTokenizer", "HFTokenizer", "load_tokenizer"]


class SentencePieceTokenizer:
    def __init__(self, model_file: str | Path) -> None:
        spm = require("sentencepiece", f"the tokenizer {model_file}")
        self.sp = spm.SentencePieceProcessor(model_file=str(model_file))
        self.vocab_size = int(self.sp.get_piece_size())
        self.bos_token_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
        self.eos_token_id = self.sp.eos_id() if self.sp.eos_id() >= 0 else None

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(self.sp.encode(text))
        return ([self.bos_token_id] if add_bos and self.bos_token_id is not None else []) + ids

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode([int(i) for i in ids])


class HFTokenizer(TokenizersTokenizer):
    def __init__(self, directory: str | Path) -> None:
        directory = Path(directory)
        tokenizers = require("tokenizers", f"the tokenizer {directory / 'tokenizer.json'}")
        self.tok = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.vocab_size = int(self.tok.get_vocab_size(with_added_tokens=True))
        meta = _read_json(directory / "tokenizer_config.json")
        cfg = _read_json(directory / "config.json")
        self.bos_token_id = self._special_id(meta.get("bos_token"), cfg.get("bos_token_id"))
        eos = cfg.get("eos_token_id")
        self.eos_token_id = self._special_id(meta.get("eos_token"), eos[0] if isinstance(eos, list) else eos)
        # NOTE: like transformers: add_bos_token where the config says, else whatever tokenizer.json's
        # post-processor adds (Llama 3's adds <|begin_of_text|>; SmolLM2's none: its chat template
        # starts with <|im_start|>, its BOS, and a second one changes every answer)
        self.add_bos = bool(meta.get("add_bos_token", self._post_processor_adds_bos()))
        # transformers 4 keeps the chat template in tokenizer_config.json, 5 in chat_template.jinja
        template = directory / "chat_template.jinja"
        named = meta.get("chat_template")
        self.chat_template: str | None = template.read_text() if template.is_file() else (
            named if isinstance(named, str) else None)

    def _post_processor_adds_bos(self) -> bool:
        if self.bos_token_id is None:
            return False
        ids = self.tok.encode("a", add_special_tokens=True).ids
        return bool(ids) and ids[0] == self.bos_token_id

    def _special_id(self, token: Any, fallback: int | None) -> int | None:
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str):
            tid = self.tok.token_to_id(token)
            if tid is not None:
                return int(tid)
        return fallback


def _read_json(file: Path) -> dict[str, Any]:
    return json.loads(file.read_text()) if file.is_file() else {}


def _sentencepiece_next_to(bin_file: Path) -> Path | None:
    """llama2.c keeps ``tok{vocab}.model`` (or ``tokenizer.model``) next to the checkpoint."""
    vocab = abs(int(np.fromfile(bin_file, dtype=np.int32, count=7)[5]))
    for name in (f"tok{vocab}.model", "tokenizer.model"):
        if (bin_file.parent / name).is_file():
            return bin_file.parent / name
    return None


def load_tokenizer(path: str | Path) -> Tokenizer | None:
    """The tokenizer of a model path (HF directory, llama2.c ``.bin``) or a tokenizer file itself.

    Returns None when the model has no tokenizer next to it.
    """
    path = Path(path)
    if path.is_file():
        if path.suffix == ".model":
            return SentencePieceTokenizer(path)
        if path.name == "tokenizer.json":
            return HFTokenizer(path.parent)
        if path.suffix == ".gguf":
            return load_gguf_tokenizer(path)
        if path.suffix == ".bin":
            sp = _sentencepiece_next_to(path)
            return SentencePieceTokenizer(sp) if sp is not None else None
        raise ValueError(f"{path}: not a tokenizer (.model / tokenizer.json) or a llama2.c .bin")
    if (path / "tokenizer.json").is_file():
        return HFTokenizer(path)
    if (path / "tokenizer.model").is_file():
        return SentencePieceTokenizer(path / "tokenizer.model")
    return None
