"""The command line: help, bad flags, and a tiny end-to-end benchmark run."""

import json
import subprocess
import sys

import pytest

from specdec.cli import main


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "bench" in capsys.readouterr().out


def test_bench_help_lists_speculative_flags():
    out = subprocess.run([sys.executable, "-m", "specdec.cli", "bench", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for flag in ["--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk",
                 "--speculative-num-draft-tokens", "--attention-backend", "--page-size"]:
        assert flag in out.stdout


def test_bench_runs_end_to_end(tmp_path, capsys):
    output = tmp_path / "bench.json"
    main(["bench", "--num-prompts", "3", "--max-new-tokens", "12", "--ignore-eos", "--speculative-algorithm", "EAGLE",
          "--speculative-draft-model-path", _default_draft(), "--speculative-num-steps", "3",
          "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "5", "--output", str(output)])
    printed = capsys.readouterr().out
    for line in ["Throughput:", "Acceptance length:", "Speedup:"]:
        assert line in printed
    res = json.loads(output.read_text())
    assert res["identical_outputs"] == 3
    assert res["speculative"]["completion_tokens"] == 36 and res["ignore_eos"] is True
    assert res["speculative"]["verify_steps"] > 0


def test_bench_bad_flag_names_it(tmp_path):
    with pytest.raises(ValueError, match="--speculative-num-draft-tokens"):
        main(["bench", "--num-prompts", "1", "--speculative-algorithm", "EAGLE",
              "--speculative-draft-model-path", _default_draft(), "--speculative-num-steps", "2",
              "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "50",
              "--output", str(tmp_path / "x.json")])


def _default_draft() -> str:
    from specdec.engine.embedded import DEFAULT_DRAFT

    return DEFAULT_DRAFT


def test_negative_adaptive_max_verify_rows_names_the_flag():
    from specdec.engine.args import EngineArgs

    with pytest.raises(ValueError, match="--speculative-adaptive-max-verify-rows=-1"):
        EngineArgs(speculative_adaptive_max_verify_rows=-1)
