"""The synthetic full-size benchmark's sweep, on a tiny shape on CPU (the 8B run is a GPU benchmark)."""

import json

import pytest

from specdec.bench import synthetic as bench_synthetic
from specdec.cli.bench import synthetic_main


def test_tiny_sweep_reports_every_point(tmp_path):
    out = tmp_path / "synthetic.json"
    synthetic_main(["--synthetic", "tiny", "--device", "cpu", "--attention-backend", "torch_native",
                          "--batch-sizes", "1,3", "--configs", "3,1,4;2,2,4", "--context-len", "12",
                          "--decode-steps", "4", "--warmup-steps", "1", "--speculative-simulate-accept-length", "2.5",
                          "--output", str(out)])
    res = json.loads(out.read_text())
    assert [p["batch_size"] for p in res["plain"]] == [1, 3]
    assert all(abs(p["committed_per_request_step"] - 1.0) < 1e-9 for p in res["plain"])
    assert set(res["speculative"]) == {"3x1x4", "2x2x4"}
    for points in res["speculative"].values():
        for p in points:
            assert p["speedup"] > 0 and set(p["phases_ms"]) == {"draft", "verify", "commit", "draft_extend", "other"}
            assert 1.0 <= p["committed_per_request_step"] <= 4.0


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
