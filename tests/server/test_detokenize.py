"""TextStream: a streamed request's text, decoded a delivery at a time, is the text of all its tokens
decoded at once, and every intermediate text is a prefix of it (what a client was sent stays true),
for SentencePiece (leading spaces) and byte-level BPE (characters split across tokens)."""

from __future__ import annotations

import random

import pytest

from specdec.engine.embedded import DEFAULT_MODEL
from specdec.models.tokenizer import load_tokenizer
from specdec.server.detokenize import TextStream

TEXTS = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "  leading spaces,\ttabs and\nnew lines\n\n",
    "Accents: café, naïve, Ærø; CJK: 中文字符; emoji: 🙂👍🏽 and 🇫🇷 flags.",
    "a",
]


def byte_level_bpe():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 4, trainer)

    class Wrapped:  # the decode the server's tokenizers give
        def encode(self, text: str) -> list[int]:
            return tok.encode(text).ids

        def decode(self, ids: list[int]) -> str:
            return tok.decode(ids)

    return Wrapped()


def sentencepiece():
    pytest.importorskip("sentencepiece")
    tok = load_tokenizer(DEFAULT_MODEL)

    class Wrapped:
        def encode(self, text: str) -> list[int]:
            return tok.encode(text, add_bos=False)

        def decode(self, ids: list[int]) -> str:
            return tok.decode(ids)

    return Wrapped()


def streamed(tok, ids: list[int], rng: random.Random) -> tuple[str, list[str]]:
    """The final text of ``ids`` delivered in chunks of 1-4 tokens, and the text after each chunk."""
    stream, grown, seen = TextStream(tok), [], []
    while len(grown) < len(ids):
        grown.extend(ids[len(grown):len(grown) + rng.randint(1, 4)])
        seen.append(stream.update(grown, final=len(grown) == len(ids)))
    return seen[-1], seen


@pytest.mark.parametrize("make", [sentencepiece, byte_level_bpe])
def test_streamed_text_equals_one_decode(make):
    tok, rng = make(), random.Random(0)
    for text in TEXTS:
        ids = tok.encode(text)
        for _ in range(5):
            final, seen = streamed(tok, ids, rng)
            assert final == tok.decode(ids)
            assert all(final.startswith(s) for s in seen)
            assert not any(s.endswith("\ufffd") for s in seen)  # half characters wait


def test_streamed_random_ids_equal_one_decode():
    """Any ids (SentencePiece decodes every sequence): the same text as one decode."""
    tok, rng = sentencepiece(), random.Random(1)
    for _ in range(20):
        ids = [rng.randrange(3, 512) for _ in range(rng.randint(1, 60))]
        final, seen = streamed(tok, ids, rng)
        assert final == tok.decode(ids)
        assert all(final.startswith(s) for s in seen)


def test_a_character_split_across_tokens_waits_for_its_last_byte():
    tok = byte_level_bpe()
    ids = tok.encode("🙂")
    assert len(ids) > 1 and tok.decode(ids[:1]).endswith("\ufffd")  # the emoji's bytes span tokens
    stream = TextStream(tok)
    assert stream.update(ids[:1]) == ""
    assert stream.update(ids) == "🙂"
    cut = TextStream(tok)
    assert cut.update(ids[:1], final=True) == tok.decode(ids[:1])  # the request ended mid-character
