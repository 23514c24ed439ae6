"""The side-by-side record (benchmarks/peer/report.py): best configuration per engine, the ratio,
speculation over plain, and greedy answers compared by digest."""

import importlib.util
import json
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "peer_report", Path(__file__).resolve().parents[1] / "benchmarks" / "peer" / "report.py")
report = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(report)


def _row(engine, config, tok_s, digests, conc=1):
    return {"workload": "chat", "concurrency": conc, "ctx": None, "engine": engine, "config": config,
            "tok_s": tok_s, "tau": None if config == "plain" else 2.5, "ttft_ms": 5.0, "tpot_ms": 1.0,
            "digests": digests}


ROWS = [
    _row("specdec", "plain", 700.0, ["a", "b", "c"]),
    _row("specdec", "eagle3", 1000.0, ["a", "x", "c"]),
    _row("vllm", "plain", 600.0, ["a", "b", "c"]),
    _row("vllm", "eagle3-k3", 500.0, ["a", "b", "c"]),
]


def test_table_puts_each_engines_best_side_by_side():
    [header, _, line] = report.table(ROWS)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == "1000 (eagle3)" and cells[4] == "600 (plain)"
    assert cells[5] == "1.67" and cells[6] == "1.43"  # 1000 / 600, 1000 / 700
    assert cells[7] == "eagle3: 2/3; eagle3-k3: 3/3"


def test_a_configuration_run_several_times_is_its_median_run_with_the_range():
    """Three runs of specdec's eagle3 (900, 1300, 1000 tok/s) and two of vLLM's plain (600, 640): the
    median run of each (1000; the lower middle of two, 600) enters the ratio, the ranges beside them."""
    rows = ROWS[:1] + [_row("specdec", "eagle3", t, ["a", "b", "c"]) for t in (900.0, 1300.0, 1000.0)] \
        + [_row("vllm", "plain", t, ["a", "b", "c"]) for t in (600.0, 640.0)]
    [_, _, line] = report.table(rows)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == "1000 (900-1300) (eagle3)" and cells[4] == "600 (600-640) (plain)"
    assert cells[5] == "1.67" and cells[6] == "1.43"


def test_diagnostic_rows_stay_out_of_the_record(tmp_path):
    """offline.py's --force and --waiting rows measure one choice or setting, not a configuration."""
    rows = tmp_path / "rows.jsonl"
    forced = {**_row("specdec", "eagle3", 5000.0, ["a", "b", "c"]), "force": "plain"}
    waited = {**_row("specdec", "plain", 9000.0, ["a", "b", "c"]), "waiting": "0:0"}
    rows.write_text("\n".join(json.dumps(r) for r in ROWS + [forced, waited]))
    assert report.load_rows(str(rows)) == ROWS


def test_peer_json_has_the_record_keys(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in ROWS))
    report.main([str(rows), str(tmp_path / "out")])
    record = json.loads((tmp_path / "out" / "peer.json").read_text())
    assert [set(r) for r in record] == [set(report.KEYS)] * 4
    assert (tmp_path / "out" / "table.md").read_text().count("\n") == 3


def test_ngram_record_has_the_issue_keys_and_speedups_over_the_same_engines_plain(tmp_path):
    rows = [dict(r, workload="smollm2-summarization") for r in ROWS]
    rows.append(dict(_row("vllm", "ngram-k5", 900.0, ["a"], conc=32), workload="smollm2-summarization"))
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    report.main([str(path), str(tmp_path / "out"), "--ngram-model", "SmolLM2-135M-Instruct"])
    record = json.loads((tmp_path / "out" / "ngram.json").read_text())
    assert all(set(r) == {"model", "dataset", "concurrency", "engine", "algorithm", "tok_s", "tau", "speedup"}
               for r in record)
    by = {(r["engine"], r["algorithm"], r["concurrency"]): r for r in record}
    assert by[("specdec", "eagle3", 1)]["speedup"] == 1000.0 / 700.0 and by[("vllm", "plain", 1)]["speedup"] == 1.0
    assert by[("vllm", "ngram-k5", 32)]["speedup"] is None  # no vLLM plain row at 32 requests
    assert {r["dataset"] for r in record} == {"summarization"}


def test_a_bench_serving_result_becomes_a_record_row(tmp_path, capsys):
    """``gpu_peer.sh serve``: each server's bench-serving JSON appended as a row the table reads."""
    stats = {"mean": 9.0, "median": 8.0, "p50": 8.0, "p90": 12.0, "p99": 14.0}
    result = {"concurrency": 32, "speculative": {
        "throughput_tok_s": 1234.5, "acceptance_length": 2.4, "ttft_ms": stats, "tpot_ms": {**stats, "median": 1.5},
        "completed": 80, "failed": 0}}
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(result))
    report.main(["--serving-row", str(path), "vllm:eagle3-k3", "smollm2-mtbench-serve"])
    row = json.loads(capsys.readouterr().out)
    assert {k: row[k] for k in report.KEYS} == {
        "workload": "smollm2-mtbench-serve", "concurrency": 32, "ctx": None, "engine": "vllm", "config": "eagle3-k3",
        "tok_s": 1234.5, "tau": 2.4, "ttft_ms": 8.0, "tpot_ms": 1.5}
    assert (row["completed"], row["failed"]) == (80, 0)
    [_, _, line] = report.table([row, {**row, "engine": "specdec", "config": "plain", "tok_s": 2469.0}])
    assert "2469 (plain)" in line and "1234 (eagle3-k3)" in line
