"""load_tokenizer: SentencePiece next to a llama2.c checkpoint, None without one, clear ImportError."""

import importlib.util
from pathlib import Path

import pytest

from specdec.models import load_tokenizer

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
STORIES = SHARED / "models" / "stories260K"


@pytest.mark.skipif(not STORIES.is_dir(), reason="shared models not present")
def test_sentencepiece_paths():
    for path in (STORIES / "stories260K.bin", STORIES / "tok512.model"):
        tok = load_tokenizer(path)
        ids = tok.encode("The cat sat.", add_bos=False)
        assert ids and ids[0] != tok.bos_token_id and tok.decode(ids) == "The cat sat."


def test_no_tokenizer_is_none(tmp_path):
    assert load_tokenizer(tmp_path) is None


@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is not None, reason="tokenizers is installed")
def test_hf_tokenizer_without_package_names_it(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ImportError, match="tokenizers"):
        load_tokenizer(tmp_path)
