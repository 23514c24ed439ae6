"""The scaling record (benchmarks/scale_report.py): rows of the synthetic sweep, the side-by-side
decode driver and the server runs, each with its tp and dp size, and the goal tables."""

import importlib.util
import json
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "scale_report", Path(__file__).resolve().parents[1] / "benchmarks" / "scale_report.py")
report = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(report)


def _point(bs, step_ms, tok_s, **extra):
    return {"batch_size": bs, "step_ms": step_ms, "tokens_per_s": tok_s, **extra}


def _sweep(tp, plain_ms, spec_tok_s):
    plain = [_point(1, plain_ms, 1e3 / plain_ms, weight_floor_ms=3.8 / tp, floor_share=3.8 / tp / plain_ms)]
    return {"setup": {"tp_size": tp}, "plain": plain, "speculative": {"3x1x4": [_point(1, 6.0, spec_tok_s)]},
            "adaptive": [_point(1, 6.0, spec_tok_s)],
            "device_profile": {"plain": [{"batch_size": 1, "step_ms": plain_ms, "collective_ms": 0.3,
                                          "collective_share": 0.3 / plain_ms if tp > 1 else 0.0}]}}


def _write_run(out: Path) -> None:
    (out / "synthetic_tp1.json").write_text(json.dumps(_sweep(1, 4.0, 500.0)))  # speedup 2.0
    (out / "synthetic_tp2.json").write_text(json.dumps(_sweep(2, 2.5, 640.0)))  # speedup 1.6
    rows = [{"engine": "specdec", "config": "plain", "workload": "llama-3.1-8b-decode", "concurrency": 1,
             "ctx": 1024, "ms_per_step": 2.5, "tok_s": 400.0, "flags": {"tp_size": 2}},
            {"engine": "vllm", "config": "plain", "workload": "llama-3.1-8b-decode", "concurrency": 1,
             "ctx": 1024, "ms_per_step": 3.0, "tok_s": 333.3, "flags": {"tensor_parallel_size": 2}}]
    (out / "scale_rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    serve = {"speculative": {"throughput_tok_s": 9000.0, "completed": 256, "failed": 0, "tpot_ms": {"median": 12.5}}}
    (out / "dp2_tp2_c256.json").write_text(json.dumps(serve))


def test_scale_json_rows_carry_tp_dp_and_the_collectives_share(tmp_path):
    _write_run(tmp_path)
    report.main([str(tmp_path)])
    rows = json.loads((tmp_path / "scale.json").read_text())
    keys = {"tp", "dp", "bs", "engine", "config", "ms_per_step", "tok_s", "collective_share"}
    assert all(keys <= set(r) for r in rows)
    plain2 = next(r for r in rows if r["workload"] == "synthetic" and r["tp"] == 2 and r["config"] == "plain")
    assert plain2["collective_share"] == 0.3 / 2.5 and plain2["ms_per_step"] == 2.5
    decode = {(r["engine"], r["tp"]) for r in rows if r["workload"] == "decode"}
    assert decode == {("specdec", 2), ("vllm", 2)}
    [serve] = [r for r in rows if r["workload"] == "serve"]
    assert (serve["dp"], serve["tp"], serve["bs"], serve["tok_s"]) == (2, 2, 256, 9000.0)


def test_tables_state_the_goals_figures(tmp_path):
    _write_run(tmp_path)
    report.main([str(tmp_path)])
    text = (tmp_path / "scale.md").read_text()
    assert "| 2 (one-shot) | 1 | 2.50 | 1.90 | 76 % | 12 % |" in text  # 1.9 / 2.5 of the floor, 0.3 / 2.5 in collectives
    assert "| 2 (one-shot) | 1 | 1.60x (80 %; 60 %) |" in text  # 1.6 / 2.0 of tp 1's speedup; 0.6 of its 1.0 gain
    assert "| 2 | 1 | 2.50 | 3.00 | 1.20x |" in text  # vLLM's 3.0 ms over specdec's 2.5
