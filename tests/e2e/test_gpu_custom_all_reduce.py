"""The one-shot all-reduce over peer memory (specdec.models.all_reduce: torch's kernel and our push
kernel) on two and four GPUs, for
bf16 and fp32 messages from 1 element to the threshold, eagerly and replayed from a captured CUDA
graph (past the threshold NCCL takes over): every rank holds the same bits, within rounding of the
exact sum; on two GPUs the sums equal NCCL's bit for bit (two ranks add a + b once). The push
kernel's fused all-reduce + add_rms_norm likewise, against NCCL's sum then ``add_rms_norm``. The ranks run
in their own processes (custom_all_reduce_ranks.py), so a hang ends in a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="the one-shot all-reduce needs two GPUs")]

RANKS = Path(__file__).with_name("custom_all_reduce_ranks.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kernel,name", [("torch", "one-shot"), ("push", "push")])
@pytest.mark.parametrize("world_size", [n for n in (2, 4) if torch.cuda.device_count() >= n],
                         ids=lambda n: f"ranks{n}")
def test_one_shot_all_reduce_equals_nccl(tmp_path, world_size, kernel, name):
    output = tmp_path / "all_reduce.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(RANKS), "--world-size", str(world_size), "--kernel", kernel,
                           "--output", str(output)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads(output.read_text())
    assert record["reducer"] == name, proc.stderr[-3000:]  # the warning says why it fell back
    cases = record["cases"]
    assert len(cases) > 60 and any(c["mode"].startswith("graph") for c in cases)
    assert (kernel == "push") == any(c["mode"].startswith("fused-graph") for c in cases)
    diverged = [c for c in cases if not (c["same_on_every_rank"] and c["within_rounding"])]
    assert not diverged, [_brief(c) for c in diverged[:10]]
    unfused = [c for c in cases if not c.get("equal_unfused", True)]  # fused: its own sum, then the norm
    assert not unfused, [_brief(c) for c in unfused[:10]]
    if world_size == 2:
        wrong = [c for c in cases if not c["equal"]]
        assert not wrong, [_brief(c) for c in wrong[:10]]


def _brief(case: dict) -> str:
    """A case in one line (pytest cuts a list of dicts short)."""
    return (f"{case['mode']} {case['dtype']} n={case['numel']} same_on_every_rank={case['same_on_every_rank']} "
            f"error/bound={case.get('max_error_over_bound', 0):.2f} max_abs_diff={case['max_abs_diff']:.3g}")
