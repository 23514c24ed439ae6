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


def _hf_directory(directory: Path, *, adds_bos: bool, config: dict, template_file: str | None = None) -> Path:
    """A word-level tokenizer.json whose ids 0-2 are <unk>, <s>, </s>; its post-processor adds <s> or not."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4, "a": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", **config}))
    if template_file is not None:
        (directory / "chat_template.jinja").write_text(template_file)
    return directory


@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None, reason="needs tokenizers")
def test_hf_tokenizer_adds_bos_as_transformers_does(tmp_path):
    # no add_bos_token in the config: BOS only where tokenizer.json's post-processor adds it
    assert load_tokenizer(_hf_directory(tmp_path / "a", adds_bos=True, config={})).encode("hello world") == [1, 3, 4]
    plain = load_tokenizer(_hf_directory(tmp_path / "b", adds_bos=False, config={}))
    assert plain.encode("<s> hello") == [1, 3]  # a chat template's own BOS is not doubled
    assert plain.chat_template is None
    # the config's add_bos_token wins
    forced = load_tokenizer(_hf_directory(tmp_path / "c", adds_bos=False, config={"add_bos_token": True}))
    assert forced.encode("hello") == [1, 3]


@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None, reason="needs tokenizers")
def test_hf_tokenizer_reads_the_chat_template_of_either_transformers_layout(tmp_path):
    from specdec.engine.chat import render_user_prompt

    old = load_tokenizer(_hf_directory(tmp_path / "v4", adds_bos=False, config={"chat_template": "{{ messages[0].content }}!"}))
    new = load_tokenizer(_hf_directory(tmp_path / "v5", adds_bos=False, config={}, template_file="<{{ messages[0].content }}>"))
    assert render_user_prompt(old, "hi") == "hi!" and render_user_prompt(new, "hi") == "<hi>"


@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None or not STORIES.is_dir(),
                    reason="needs tokenizers and the shared models")
def test_tokenizers_travel_to_another_process(tmp_path):
    """``specdec serve`` builds the engine in a process of its own and sends its tokenizer to the
    server's process by pickle: the copy encodes, decodes and templates as the original."""
    import pickle

    hf = _hf_directory(tmp_path / "hf", adds_bos=True, config={"chat_template": "{{ messages[0].content }}!"})
    for tok in (load_tokenizer(STORIES / "stories260K.bin"), load_tokenizer(hf)):
        copy = pickle.loads(pickle.dumps(tok))
        ids = tok.encode("hello world")
        assert copy.encode("hello world") == ids and copy.decode(ids) == tok.decode(ids)
        assert (copy.bos_token_id, copy.eos_token_id) == (tok.bos_token_id, tok.eos_token_id)
        assert getattr(copy, "chat_template", None) == getattr(tok, "chat_template", None)
