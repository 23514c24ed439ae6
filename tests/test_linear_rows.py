"""``benchmarks/linear_rows.py`` (CPU): each M's rows against the same rows computed one at a time, and
a row that changes with M is counted."""

import importlib.util
import json
from pathlib import Path

import torch

SPEC = importlib.util.spec_from_file_location(
    "linear_rows", Path(__file__).resolve().parents[1] / "benchmarks" / "linear_rows.py")
linear_rows = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(linear_rows)


def test_rows_that_depend_on_m_are_counted(monkeypatch):
    real = linear_rows.gemv.linear

    def split_k_past_4(x, w):  # rows past M = 4 summed in two halves of K: other rounding
        if x.shape[0] <= 4:
            return real(x, w)
        half = x.shape[1] // 2
        return (real(x[:, :half], w[:, :half]).float() + real(x[:, half:], w[:, half:]).float()).to(x.dtype)

    monkeypatch.setattr(linear_rows.gemv, "linear", split_k_past_4)
    rows = {r["m"]: r for r in linear_rows.check_shape(64, 576, [1, 3, 4, 5, 9], device="cpu", seed=0)}
    assert [rows[m]["rows_differing"] for m in (1, 3, 4)] == [0, 0, 0]
    assert rows[5]["rows_differing"] > 0 and rows[9]["rows_differing"] > 0 and rows[9]["max_abs_diff"] > 0
    assert rows[9]["rows"] == linear_rows.ROWS and rows[3]["rows"] == 3


def test_json_rows(tmp_path):
    out = tmp_path / "rows.json"
    linear_rows.main(["--device", "cpu", "--shapes", "smollm2", "--m", "1", "2", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert {(r["layer"], r["m"]) for r in rows} == {(layer, m) for layer in linear_rows.SHAPES["smollm2"]
                                                    for m in (1, 2)}
    assert all(r["kernel"] == "F.linear" and not r["deterministic"] for r in rows)  # on CPU: the reference
    assert torch.tensor([r["rows_differing"] for r in rows if r["m"] == 1]).eq(0).all()
