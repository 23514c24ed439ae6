"""``specdec bench`` and ``specdec serve`` with ``--speculative-algorithm NGRAM`` (the embedded
stories260K, no draft model), and a flag that does not apply refused by name."""

import json

import httpx
import pytest

from specdec.cli import main
from specdec.config import ConfigError
from specdec.engine.embedded import DEFAULT_MODEL

from ..serve_process import serve_process



def test_bench_runs_ngram(tmp_path, capsys):
    output = tmp_path / "bench.json"
    main(["bench", "--model-path", DEFAULT_MODEL, "--num-prompts", "3", "--max-new-tokens", "24", "--ignore-eos",
          "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6",
          "--speculative-ngram-max-match-window-size", "4", "--speculative-ngram-max-bfs-breadth", "2",
          "--output", str(output)])
    printed = capsys.readouterr().out
    for line in ["Throughput:", "Acceptance length:", "Speedup:"]:
        assert line in printed
    res = json.loads(output.read_text())
    assert res["identical_outputs"] == 3 and res["algorithm"] == "NGRAM"
    assert res["speculative"]["completion_tokens"] == 72


def test_bench_refuses_a_draft_head_flag_under_ngram(tmp_path):
    with pytest.raises(ConfigError, match="--speculative-eagle-topk"):
        main(["bench", "--model-path", DEFAULT_MODEL, "--num-prompts", "1", "--speculative-algorithm", "NGRAM",
              "--speculative-eagle-topk", "2", "--output", str(tmp_path / "x.json")])


def test_serve_ngram_answers():
    with serve_process("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6") as (url, _):
        text = "Tim saw a dog. The dog was big. Tim saw a dog. The dog was big. Tim saw a"
        body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": 32}}
        out = httpx.post(f"{url}/generate", json=body, timeout=60).json()
        assert out["meta_info"]["completion_tokens"] > 0 and out["text"].strip()
        assert out["meta_info"]["spec_verify_ct"] > 0
        assert httpx.get(f"{url}/get_server_info", timeout=5).json()["speculative_algorithm"] == "NGRAM"
