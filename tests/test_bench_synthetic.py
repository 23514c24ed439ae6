"""The synthetic full-size benchmark's sweep, on a tiny shape on CPU (the 8B run is a GPU benchmark)."""

import gzip
import json

import numpy as np
import pytest

from specdec.bench import synthetic as bench_synthetic
from specdec.bench import synthetic_report
from specdec.cli.bench import synthetic_main
from specdec.eagle.acceptance import AcceptanceModel
from specdec.eagle.replay import DraftTrace
from specdec.engine.spec_profile import PRIOR, TRACE


def test_tiny_sweep_reports_every_point(tmp_path):
    out = tmp_path / "synthetic.json"
    synthetic_main(["--synthetic", "tiny", "--device", "cpu", "--attention-backend", "torch_native",
                    "--batch-sizes", "1,3", "--configs", "3,1,4;2,2,4", "--context-len", "12",
                    "--decode-steps", "4", "--warmup-steps", "1", "--output", str(out)])
    res = json.loads(out.read_text())
    assert [p["batch_size"] for p in res["plain"]] == [1, 3]
    assert all(abs(p["committed_per_request_step"] - 1.0) < 1e-9 for p in res["plain"])
    assert all(p["decode_steps"] == 4 for p in res["plain"])
    for p in res["plain"]:  # the host's view of the timed steps: their quantiles sum to no more than the window
        spread = p["step_ms_spread"]
        assert 0 < spread["p50"] <= spread["p90"] <= spread["max"] <= p["step_ms"] * p["decode_steps"]
        assert p["steady_tokens_per_s"] >= p["tokens_per_s"]  # the window less its pauses, if any
        assert p["kernels_built"] == []  # the CPU builds no Triton kernel (a GPU's timed window should not)
    assert set(res["speculative"]) == {"3x1x4", "2x2x4"}
    for name, points in res["speculative"].items():
        for p in points:
            assert p["speedup"] > 0 and set(p["phases_ms"]) == {"draft", "verify", "commit", "draft_extend", "other"}
            host = p["host_ms"]  # rank 0's host: its wait for the reads (none on CPU) and its own work
            assert 0 <= host["read_wait"] < 1.0 and host["busy"] + host["read_wait"] == pytest.approx(p["step_ms"])
            assert 1.0 <= p["committed_per_request_step"] <= 4.0
            assert p["shapes"] == {name: p["decode_steps"]}  # a fixed shape speculates every step
            # timed over the tokens plain decoding commits in its 4 steps, in no more steps than it
            assert p["decode_steps"] <= 4 and p["committed_per_request_step"] * p["decode_steps"] >= 4
    assert any(p["decode_steps"] < 4 for points in res["speculative"].values() for p in points)
    # adaptive speculation, bounded by (3, 2, 4): every timed step is one of its shapes, or plain
    adaptive = res["adaptive"]
    assert [p["batch_size"] for p in adaptive] == [1, 3]
    allowed = set(res["adaptive_policy"]["expected_committed"]) | {"plain"}
    for p in adaptive:
        assert p["speedup"] > 0 and sum(p["shapes"].values()) == p["decode_steps"] and set(p["shapes"]) <= allowed
    # the measured acceptance model (by default the replayed trace) is recorded, and the sweep rows
    acceptance = res["setup"]["acceptance_model"]
    assert acceptance["kind"] == "replay" and acceptance["protocol"]["dataset"] == "mt_bench"
    assert set(acceptance["expected_committed"]) == set(synthetic_report.shapes_run(res)) >= {"3x1x4", "2x2x4"}
    assert [r["bs"] for r in res["sweep"]] == [1, 3] and set(res["sweep"][0]["fixed"]) == {"3x1x4", "2x2x4"}
    assert res["sweep"][0]["ctx"] == 12 and res["sweep"][0]["adaptive_speedup"] == adaptive[0]["speedup"]
    # and each speedup at the acceptance model's expectation: drawn tokens swapped for expected ones
    trace = DraftTrace.load(TRACE)
    assert acceptance["expected_committed"]["2x2x4"] == pytest.approx(trace.expected_committed(2, 2, 4))
    point = res["speculative"]["2x2x4"][1]
    assert res["sweep"][1]["fixed_expected"]["2x2x4"] == pytest.approx(
        point["speedup"] * trace.expected_committed(2, 2, 4) / point["committed_per_request_step"])
    assert res["sweep"][0]["adaptive_speedup_expected"] > 0
    # and without the host's pauses: every policy's speedup over plain from their steady rates
    assert res["sweep"][1]["fixed_expected_steady"]["2x2x4"] == pytest.approx(
        point["steady_tokens_per_s"] / res["plain"][1]["steady_tokens_per_s"]
        * trace.expected_committed(2, 2, 4) / point["committed_per_request_step"])


def test_expected_committed_weighs_the_shapes_a_point_ran():
    """Three steps of (2, 2, 4) and one plain step: (3 * E[2x2x4] + 1) / 4; the worked example of
    specdec.eagle.acceptance gives E[2x2x4] = 2.44."""
    model = AcceptanceModel(np.array([[0.8, 0.5], [0.6, 0.5]]))
    point = {"shapes": {"2x2x4": 3, "plain": 1}, "speedup": 2.0, "committed_per_request_step": 2.0}
    expected = {"2x2x4": model.expected_committed(2, 2, 4)}
    assert synthetic_report.expected_committed(point, expected) == pytest.approx((3 * 2.44 + 1) / 4)
    assert synthetic_report.speedup_at_expectation(point, expected) == pytest.approx(2.0 * 2.08 / 2.0)


def test_hazards_model_is_recorded_with_its_expectations(tmp_path):
    """--acceptance-model hazards: the static model's JSON as it is, and its expectation per shape run."""
    record = synthetic_report.acceptance_record(str(PRIOR), ["3x1x4", "5x4x8"])
    model = AcceptanceModel.load(PRIOR)
    assert record["kind"] == "hazards" and record["hazards"] == model.to_json()["hazards"]
    assert record["expected_committed"] == pytest.approx({"3x1x4": model.expected_committed(3, 1, 4),
                                                          "5x4x8": model.expected_committed(5, 4, 8)})
    settings = bench_synthetic.SyntheticSettings(synthetic="tiny", acceptance_model="hazards")
    assert settings.acceptance_path() == str(PRIOR)


def test_constant_accept_length_without_an_acceptance_model(tmp_path):
    out = tmp_path / "synthetic.json"
    synthetic_main(["--synthetic", "tiny", "--device", "cpu", "--attention-backend", "torch_native",
                    "--batch-sizes", "2", "--configs", "3,1,4", "--context-len", "12", "--decode-steps", "4",
                    "--warmup-steps", "1", "--acceptance-model", "none", "--speculative-simulate-accept-length",
                    "4", "--skip-adaptive", "--output", str(out)])
    res = json.loads(out.read_text())
    assert "adaptive" not in res and res["setup"]["acceptance_model"] is None
    # TAU = S + 1: every draft token is accepted, every step commits 4 tokens per request
    assert res["speculative"]["3x1x4"][0]["committed_per_request_step"] == 4.0


def test_server_context_length_bounds_the_engines_not_the_kv_pool(tmp_path):
    """--server-context-length is the engines' --context-length (what their CUDA graphs plan attention
    for); the KV pool stays sized for the run, and the results record it."""
    settings = bench_synthetic.SyntheticSettings(synthetic="tiny", server_context_length=4096)
    args = bench_synthetic._engine_args(settings, bench_synthetic.EngineArgs(device="cpu"), (3, 1, 4), [1, 2], 100,
                                        ("target", "head"))
    assert args.context_length == 4096 and args.max_total_tokens == 2 * (100 + 64)
    out = tmp_path / "synthetic.json"
    synthetic_main(["--synthetic", "tiny", "--device", "cpu", "--attention-backend", "torch_native",
                    "--batch-sizes", "2", "--configs", "3,1,4", "--context-len", "12", "--decode-steps", "2",
                    "--warmup-steps", "1", "--skip-adaptive", "--server-context-length", "4096", "--output", str(out)])
    assert json.loads(out.read_text())["setup"]["engine_context_length"] == 4096


def test_server_context_length_below_the_runs_need_names_the_flag():
    with pytest.raises(ValueError, match="--server-context-length 40: this run needs at least"):
        synthetic_main(["--synthetic", "tiny", "--device", "cpu", "--batch-sizes", "1", "--configs", "3,1,4",
                        "--context-len", "12", "--server-context-length", "40"])


def test_bad_acceptance_model_names_the_flag():
    with pytest.raises(ValueError, match="--acceptance-model"):
        bench_synthetic.SyntheticSettings(synthetic="tiny", acceptance_model="/nonexistent.json")


def test_profile_trace_writes_each_profiled_points_timeline(tmp_path):
    out, traces = tmp_path / "s.json", tmp_path / "traces"
    synthetic_main(["--synthetic", "tiny", "--device", "cpu", "--attention-backend", "torch_native",
                    "--batch-sizes", "1", "--configs", "2,1,3", "--context-len", "8", "--decode-steps", "2",
                    "--warmup-steps", "1", "--skip-adaptive", "--output", str(out),
                    "--profile-device", str(tmp_path / "kernels.txt"), "--profile-trace", str(traces)])
    assert "==== 2x1x3 bs=1" in (tmp_path / "kernels.txt").read_text()
    for name in ("plain_bs1", "2x1x3_bs1"):
        events = json.loads(gzip.decompress((traces / f"{name}.json.gz").read_bytes()))["traceEvents"]
        assert any(e.get("ph") == "X" for e in events)


def test_profile_batch_sizes_pick_the_profiled_points(tmp_path):
    """--profile-batch-sizes profiles only the points named (the default: the sweep's two ends)."""
    synthetic_main(["--synthetic", "tiny", "--device", "cpu", "--attention-backend", "torch_native",
                    "--batch-sizes", "1,2,3", "--configs", "2,1,3", "--context-len", "8", "--decode-steps", "2",
                    "--warmup-steps", "1", "--skip-adaptive", "--output", str(tmp_path / "s.json"),
                    "--profile-host", str(tmp_path / "host.txt"), "--profile-batch-sizes", "2"])
    titles = [line for line in (tmp_path / "host.txt").read_text().splitlines() if line.startswith("====")]
    assert [t.split(" (")[0] for t in titles] == ["==== plain bs=2", "==== 2x1x3 bs=2"]
    settings = bench_synthetic.SyntheticSettings(synthetic="tiny", batch_sizes="4,1,2")
    assert settings.profiled_batch_sizes() == [1, 4]


@pytest.mark.parametrize("sizes", ["5", "1,x", ""])
def test_profile_batch_sizes_outside_the_sweep_name_the_flag(sizes):
    with pytest.raises(ValueError, match="--profile-batch-sizes"):
        bench_synthetic.SyntheticSettings(synthetic="tiny", batch_sizes="1,2", profile_batch_sizes=sizes)


def test_add_steady_takes_the_pauses_out_of_recorded_points():
    """Points that recorded their step spread only (results before steady rates): plain's 10 steps of
    10 ms and one of 60 (50 ms past the median) commit 11 tokens: 11 / 0.11 s over the window,
    11 / 0.06 s without the pause; a speculative point with no pause keeps its rate."""
    def point(tps, committed, excess):
        return {"batch_size": 1, "tokens_per_s": tps, "committed_per_request_step": committed, "decode_steps": 11,
                "step_ms_spread": {"slow_excess_ms": excess}}

    plain, spec = point(100.0, 1.0, 50.0), point(250.0, 2.5, 0.0)
    results = {"plain": [plain], "speculative": {"3x1x4": [spec]}}
    synthetic_report.add_steady(results)
    assert plain["steady_tokens_per_s"] == pytest.approx(11 / 0.06)
    assert spec["steady_tokens_per_s"] == pytest.approx(250.0)
    assert spec["speedup_steady"] == pytest.approx(250.0 / (11 / 0.06))


def test_step_spread_tells_one_pause_from_a_steady_pace():
    """Ten steps of 10 ms and one of 60: the mean is 14.5 ms either way, only the spread says why."""
    spread = bench_synthetic.step_spread(np.array([10.0] * 10 + [60.0]))
    assert spread["p50"] == 10.0 and spread["max"] == 60.0
    assert spread["slow_steps"] == 1 and spread["slow_excess_ms"] == pytest.approx(50.0)
    steady = bench_synthetic.step_spread(np.full(11, 14.5))
    assert steady["slow_steps"] == 0 and steady["slow_excess_ms"] == 0.0 and steady["p90"] == 14.5
    named = bench_synthetic.step_spread(np.array([10.0, 60.0, 10.0, 10.0]), ["3x1x4", "2x1x3", "plain", "3x1x4"])
    assert named["slow"] == [{"step": 1, "ms": 60.0, "shape": "2x1x3"}]


def test_a_kernel_built_while_timed_is_named_on_the_points_line():
    assert bench_synthetic._built_note([]) == ""
    note = bench_synthetic._built_note([{"kernel": "specdec.kernels.triton.commit._commit_kernel(n: i32 16)",
                                         "s": 0.118}, {"kernel": "specdec.x._rope_kernel(b: i32)", "s": 0.004}])
    assert note == "  BUILT 2 kernel(s) while timed, 0.12 s: _commit_kernel, _rope_kernel"


def test_profile_trace_needs_profile_device():
    with pytest.raises(ValueError, match="--profile-trace"):
        bench_synthetic.SyntheticSettings(synthetic="tiny", profile_trace="traces")


def test_bad_configs_name_the_flag():
    with pytest.raises(ValueError, match="--configs"):
        bench_synthetic.parse_configs("3,1")


def test_specdec_bench_routes_synthetic(tmp_path, capsys):
    from specdec.cli import main

    out = tmp_path / "s.json"
    main(["bench", "--synthetic", "tiny", "--device", "cpu", "--attention-backend", "torch_native",
          "--batch-sizes", "1", "--configs", "2,1,3", "--decode-steps", "2", "--warmup-steps", "1",
          "--context-len", "8", "--output", str(out)])
    assert "Speedup 2x1x3: bs1=" in capsys.readouterr().out
    assert json.loads(out.read_text())["setup"]["shape"] == "tiny"


def test_multi_turn_synthetic_on_cpu(tmp_path, capsys):
    """The in-process multi-turn run on the tiny synthetic shape: the cache saves prefill on later
    turns and the outputs are the same work (same prompt tokens) with it on and off."""
    from specdec.cli.bench import multi_turn_main

    out = tmp_path / "mt.json"
    multi_turn_main(["--synthetic", "tiny", "--device", "cpu", "--attention-backend", "torch_native",
                     "--config", "3,1,4", "--num-conversations", "4", "--turns", "3", "--first-turn-len", "40",
                     "--turn-len", "8", "--max-new-tokens", "6", "--concurrency", "2", "--output", str(out)])
    res = json.loads(out.read_text())
    on, off = res["cache_on"], res["cache_off"]
    assert on["turns"] == off["turns"] == 12 and on["prompt_tokens"] == off["prompt_tokens"]
    assert off["cached_tokens"] == 0 and on["per_turn"]["0"]["cached_tokens"] == 0
    assert on["per_turn"]["2"]["cached_tokens"] > 0 and on["prefill_tokens"] < off["prefill_tokens"]
    assert res["kv_bytes_per_token"]["draft"] > 0
    assert "KV bytes per token" in capsys.readouterr().out
