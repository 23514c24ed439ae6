"""``specdec bench`` and ``specdec serve`` with ``--speculative-algorithm STANDALONE`` on the embedded
stories260K target: a tiny random Qwen3 checkpoint of its vocabulary and tokenizer (written to a tmp
dir) or stories260K itself as the draft; drafts whose vocabulary or tokenizer differ are refused
naming the flag."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from specdec.cli import main
from specdec.eagle.standalone import check_vocab
from specdec.engine.embedded import DEFAULT_MODEL

from .models.hf_checkpoints import write_hf_checkpoint
from .serve_process import serve_process

TOKENIZER = Path(DEFAULT_MODEL).with_name("tok512.model")


def qwen3_draft(path: Path, *, vocab_size: int = 512, tokenizer: bool = True) -> str:
    """A 1-layer random Qwen3 (H 32) of stories260K's vocabulary, with its SentencePiece model."""
    write_hf_checkpoint("qwen3", path, seed=3, vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                        max_position_embeddings=512)
    if tokenizer:
        shutil.copy(TOKENIZER, path / "tokenizer.model")
    return str(path)


def _bench(tmp_path: Path, draft: str, *extra: str) -> dict:
    output = tmp_path / "bench.json"
    main(["bench", "--model-path", DEFAULT_MODEL, "--num-prompts", "3", "--max-new-tokens", "16", "--ignore-eos",
          "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", draft, *extra,
          "--output", str(output)])
    return json.loads(output.read_text())


def test_bench_runs_standalone_with_another_architecture_as_the_draft(tmp_path, capsys):
    res = _bench(tmp_path, qwen3_draft(tmp_path / "draft"), "--speculative-num-steps", "3",
                 "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "5")
    printed = capsys.readouterr().out
    for line in ["Throughput:", "Acceptance length:", "Speedup:"]:
        assert line in printed
    assert res["identical_outputs"] == 3 and res["algorithm"] == "STANDALONE"
    assert res["speculative"]["completion_tokens"] == 48 and res["speculative"]["verify_steps"] > 0


def test_bench_refuses_drafts_of_another_vocabulary_or_tokenizer(tmp_path):
    with pytest.raises(ValueError, match="--speculative-draft-model-path: the draft model's vocabulary has 97 "):
        _bench(tmp_path, qwen3_draft(tmp_path / "d97", vocab_size=97, tokenizer=False))
    with pytest.raises(ValueError, match="--speculative-token-map does not apply"):
        _bench(tmp_path, DEFAULT_MODEL, "--speculative-token-map", str(tmp_path / "map.pt"))
    with pytest.raises(ValueError, match="is an EAGLE draft head"):
        _bench(tmp_path, str(Path(DEFAULT_MODEL).with_name("eagle_head")))


def _tok(pieces: list[str], bos: int = 1, eos: int = 2):
    vocab = {p: i for i, p in enumerate(pieces)}
    inner = SimpleNamespace(get_vocab=lambda with_added_tokens=True: vocab)
    return SimpleNamespace(tok=inner, bos_token_id=bos, eos_token_id=eos, vocab_size=len(pieces))


def test_tokenizers_must_agree_on_every_token_and_the_special_ids():
    config = SimpleNamespace(vocab_size=4)
    check_vocab(config, config, _tok(["<s>", "a", "b", "c"]), _tok(["<s>", "a", "b", "c"]))
    with pytest.raises(ValueError, match=r"differs from the target's at token 2 \('x' vs 'b'\)"):
        check_vocab(config, config, _tok(["<s>", "a", "b", "c"]), _tok(["<s>", "a", "x", "c"]))
    with pytest.raises(ValueError, match="eos_token_id=3, the target's 2"):
        check_vocab(config, config, _tok(["<s>", "a", "b", "c"]), _tok(["<s>", "a", "b", "c"], eos=3))
    check_vocab(config, config, _tok(["<s>", "a", "b", "c"]), None)  # one tokenizer only: vocab size decides


def test_serve_standalone_answers():
    """stories260K as its own draft (a perfect draft): served output equals plain greedy decoding's."""
    with serve_process("--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", DEFAULT_MODEL,
                       "--speculative-num-steps", "3", "--speculative-eagle-topk", "1") as (url, _):
        body = {"text": "Once upon a time", "sampling_params": {"temperature": 0, "max_new_tokens": 25}}
        out = httpx.post(f"{url}/generate", json=body, timeout=60).json()
        assert out["meta_info"]["completion_tokens"] == 25 and out["text"].strip()
        assert out["meta_info"]["spec_accept_lengths"][:5] == [3] * 5  # every chain token accepted
        assert httpx.get(f"{url}/get_server_info", timeout=5).json()["speculative_algorithm"] == "STANDALONE"
