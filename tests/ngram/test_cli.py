"""``specdec bench`` and ``specdec serve`` with ``--speculative-algorithm NGRAM`` (the embedded
stories260K, no draft model), and a flag that does not apply refused by name."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from specdec.cli import main
from specdec.config import ConfigError
from specdec.engine.embedded import DEFAULT_MODEL

REPO = Path(__file__).resolve().parents[2]


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_ngram_answers():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--port", str(port), "--log-level",
                             "warning", "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "specdec serve did not come up"
            time.sleep(0.2)
        text = "Tim saw a dog. The dog was big. Tim saw a dog. The dog was big. Tim saw a"
        body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": 32}}
        out = httpx.post(f"{url}/generate", json=body, timeout=60).json()
        assert out["meta_info"]["completion_tokens"] > 0 and out["text"].strip()
        assert out["meta_info"]["spec_verify_ct"] > 0
        assert httpx.get(f"{url}/get_server_info", timeout=5).json()["speculative_algorithm"] == "NGRAM"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
