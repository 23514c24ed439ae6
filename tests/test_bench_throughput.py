"""``specdec bench``'s timing: a warm-up, repeated timed runs from an empty prefix cache, their median
and spread, and the warning when runs disagree (the embedded stories260K on CPU)."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from specdec.bench import throughput
from specdec.bench.step_log import StepLog, choices
from specdec.bench.throughput import ThroughputSettings, TimingPlan
from specdec.engine import embedded
from specdec.engine.engine import Engine


def test_timing_plan_by_device():
    settings = ThroughputSettings()
    assert TimingPlan.for_device("cuda", settings) == TimingPlan(full_warmup=True, repeats=3, min_seconds=5.0)
    assert TimingPlan.for_device("cpu", settings) == TimingPlan(full_warmup=False, repeats=1, min_seconds=0.0)
    assert TimingPlan.for_device("cuda:1", ThroughputSettings(repeats=5, min_seconds=2)).repeats == 5
    with pytest.raises(ValueError, match="--repeats"):
        ThroughputSettings(repeats=0)


def test_repeated_runs_each_prefill_from_an_empty_cache_and_agree():
    engine = Engine(embedded.DEFAULT_MODEL, device="cpu")
    prompts = embedded.load_prompts("tinystories", 3)
    params = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    prompt_tokens = sum(len(engine.tokenizer.encode(p)) for p in prompts)
    before = engine.scheduler.prefill_tokens
    plan = TimingPlan(full_warmup=True, repeats=2, min_seconds=0.0)
    res = throughput._run(engine, prompts, params, plan, desc="t", progress=False)
    # warm-up + 2 runs, one pass each, every one prefilling every prompt (the cache is flushed between)
    assert res["passes_per_run"] == 1 and len(res["runs"]) == 2
    assert engine.scheduler.prefill_tokens - before == 3 * prompt_tokens
    assert res["completion_tokens"] == 3 * 6 and all(r["completion_tokens"] == 18 for r in res["runs"])
    rates = [r["throughput_tok_s"] for r in res["runs"]]
    assert res["throughput_tok_s"] == pytest.approx(sum(rates) / 2)  # the median of two
    assert res["spread"]["relative"] == pytest.approx(max(rates) / min(rates) - 1)
    assert res["repeats_identical"] and res["warmup_seconds"] > 0
    # the timed runs' engine steps (the warm-up's not): 3 prompts prefilled a run, the rest plain decode
    assert res["steps"]["prefill"]["steps"] >= 2 and set(res["steps"]) == {"prefill", "decode"}
    assert res["steps"]["decode"]["ms"] > 0
    # each run's own, summed over the runs
    for kind in ("prefill", "decode"):
        per_run = [r["steps"][kind] for r in res["runs"]]
        assert res["steps"][kind]["steps"] == sum(v["steps"] for v in per_run)
        assert res["steps"][kind]["ms"] == pytest.approx(
            sum(v["steps"] * v["ms"] for v in per_run) / res["steps"][kind]["steps"])


def test_step_log_files_steps_by_the_policys_choice():
    """A speculative engine's steps go under the decode choice its policy counted (NGRAM's cost-aware
    steps: plain or a lookup of N nodes), prefills apart; the counts are the engine's, and ``take``
    starts over."""
    engine = Engine(embedded.DEFAULT_MODEL, device="cpu", speculative_algorithm="NGRAM", speculative_adaptive="on")
    log = StepLog(engine)
    req = engine.make_request("Once upon a time", None, {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True})
    engine.add_request(req)
    before = choices(engine)
    while not req.finished:
        log.step()
    steps = log.take()
    decided = {k: n - before.get(k, 0) for k, n in choices(engine).items() if n != before.get(k, 0)}
    assert steps["prefill"]["steps"] == 1
    assert decided and {k: v["steps"] for k, v in steps.items() if k != "prefill"} == decided
    assert log.take() == {}
    log.forced = "lookup"
    engine.add_request(engine.make_request("The cat", None, {"temperature": 0, "max_new_tokens": 3}))
    for _ in range(3):
        log.step()
    assert set(log.take()) <= {"prefill", "lookup"}


def test_a_short_pass_is_repeated_to_last_min_seconds(monkeypatch):
    engine = Engine(embedded.DEFAULT_MODEL, device="cpu")
    prompts = embedded.load_prompts("tinystories", 2)
    params = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
    clock = iter(range(0, 10_000, 1))  # each of the pass's clock reads advances one second: a pass lasts 1 s
    monkeypatch.setattr(throughput, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    res = throughput._run(engine, prompts, params, TimingPlan(full_warmup=True, repeats=1, min_seconds=3.0),
                          desc="t", progress=False)
    assert res["passes_per_run"] == 3 and res["runs"][0]["completion_tokens"] == 3 * 2 * 4
    assert res["runs"][0]["seconds"] == 3.0 and res["completion_tokens"] == 8


def test_runs_that_disagree_are_reported(capsys):
    run = {"throughput_tok_s": 100.0, "spread": {"min": 90.0, "max": 110.0, "relative": 110 / 90 - 1},
           "runs": [{"throughput_tok_s": r, "steps": {"3x1x4": {"steps": 40, "ms": 2.5}},
                     "kernels_built": [("_commit(n: i32)", 0.25)] if r == 90.0 else []}
                    for r in (90.0, 100.0, 110.0)],
           "passes_per_run": 2, "acceptance_length": 2.0, "acceptance_histogram": {2: 1},
           "steps": {"3x1x4": {"steps": 40, "ms": 2.5}, "prefill": {"steps": 2, "ms": 10.0}}}
    res = {"note": None, "ignore_eos": True, "model_path": "m", "dataset": "d", "num_prompts": 1,
           "max_new_tokens": 4, "temperature": 0, "algorithm": "EAGLE", "num_steps": 1, "topk": 1,
           "num_draft_tokens": 2, "attention_backend": "torch_native", "baseline": dict(run, spread={
               "min": 99.0, "max": 101.0, "relative": 101 / 99 - 1}, runs=[{**r, "kernels_built": []} for r in
                                                                      run["runs"]]), "speculative": run, "speedup": 1.0,
           "identical_outputs": 1}
    throughput.print_report(res)
    out = capsys.readouterr()
    assert "median of 3 runs, 90.0-110.0, 2 passes" in out.out
    assert "Steps, speculative: 3x1x4 40 x 2.50 ms, prefill 2 x 10.00 ms" in out.out
    assert "timed speculative runs disagree by 22.2 %" in out.err and "baseline" not in out.err
    assert "run 3: 110.0 token/s, 3x1x4 40 x 2.50 ms" in out.err  # each run's steps, to see what differed
    # the slowest run waited 250 ms for a Triton kernel the warm-up missed: named
    assert "Triton built 1 kernel(s) during the timed speculative runs (250 ms" in out.err
    assert "250 ms  _commit(n: i32)" in out.err and "timed baseline runs (" not in out.err


def test_embedded_prompt_sets_plain_and_gzipped():
    """Every embedded set loads (Spec-Bench's long-prompt sets ship gzipped); an unknown name is an
    error naming the flag and the sets."""
    assert {"mt_bench", "humaneval", "summarization", "rag", "translation"} <= set(embedded.DATASETS)
    for name in embedded.DATASETS:
        rows = embedded.load_rows(name)
        assert rows and all(isinstance(r["turns"][0], str) and r["turns"][0] for r in rows)
    assert embedded.load_prompts("summarization", 2)[0].startswith("Summarize:")
    assert len(embedded.load_rows("mt_bench")[0]["turns"]) == 2
    with pytest.raises(ValueError, match="--dataset: unknown dataset 'nope'.*summarization"):
        embedded.load_prompts("nope", 1)


def test_the_baseline_engine_is_gone_before_the_speculative_one_is_built():
    """The speculative engine sizes its KV pool from the memory left: the baseline engine (whose parts
    hold each other) must be collected first, not merely deleted. In a fresh interpreter: this suite's
    KV-leak fixture keeps every engine a test builds."""
    script = """
import argparse, weakref
import specdec.engine.engine as engine_module
from specdec.bench import throughput
from specdec.cli.bench import add_bench_args, bench_target
from specdec.engine import embedded

runners = []

class Recording(engine_module.Engine):
    def __init__(self, *args, **kw):
        assert all(ref() is None for ref in runners), "an earlier engine's runner is still alive"
        super().__init__(*args, **kw)
        runners.append(weakref.ref(self.runner))

engine_module.Engine = Recording
parser = argparse.ArgumentParser()
add_bench_args(parser)
args = parser.parse_args(["--model-path", embedded.DEFAULT_MODEL, "--speculative-algorithm", "EAGLE",
                          "--num-prompts", "1", "--max-new-tokens", "4", "--device", "cpu", "--disable-tqdm"])
res = throughput.run_benchmark(*bench_target(args))
assert len(runners) == 2 and res["identical_outputs"] == 1
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
