"""The replayed acceptance against the head's own runs, shape by shape: each shape's measured tokens a
step (this folder's and ../2026-11-26-cpu-acceptance-by-parent/'s CPU runs, all 80 MT-bench questions,
256 tokens) against what the shipped trace replays and what the static hazards model expects. Prints
markdown.

    PYTHONPATH=. python benchmarks/results/2026-11-26-cpu-acceptance-replay/table.py
"""
import json
from pathlib import Path

import numpy as np
import torch

from specdec.eagle.acceptance import AcceptanceModel
from specdec.eagle.replay import DraftReplay, DraftTrace, replay_accept_lengths
from specdec.engine.spec_profile import PRIOR, TRACE

HERE = Path(__file__).resolve().parent
BY_PARENT = HERE.parent / "2026-11-26-cpu-acceptance-by-parent"
RUNS = {"3x1x4": BY_PARENT / "acc_3x1x4.json", "3x2x4": HERE / "acc_3x2x4.json", "3x4x4": HERE / "acc_3x4x4.json",
        "5x4x8": BY_PARENT / "acc_5x4x8.json", "6x8x32": BY_PARENT / "acc_6x8x32.json"}

trace, model = DraftTrace.load(TRACE), AcceptanceModel.load(PRIOR)
print(f"Trace: {len(trace)} recorded steps of {trace.protocol['shape']} ({trace.protocol['verify_steps']} in the run, "
      f"acceptance length {trace.protocol['acceptance_length']:.3f})\n")
steps, k, n = (int(x) for x in trace.protocol["shape"].split("x"))
known = trace.recorded >= 0
replayed = replay_accept_lengths(DraftReplay(trace, torch.device("cpu")), torch.arange(len(trace)), steps, k, n)
same = (replayed.numpy()[known] == trace.recorded[known]).mean()
print(f"Replayed at {trace.protocol['shape']}, row by row: {same:.4f} of {known.sum()} rows accept what the run did\n")
print("| shape | measured (the head's run) | replay | replay / measured | hazards model | model / measured |")
print("|---|---|---|---|---|---|")
for name, path in RUNS.items():
    measured = json.loads(path.read_text())["protocol"]["acceptance_length"]
    s, kk, nn = (int(x) for x in name.split("x"))
    rep, stat = trace.expected_committed(s, kk, nn), model.expected_committed(s, kk, nn)
    print(f"| {name} | {measured:.3f} | {rep:.3f} | {rep / measured:.3f} | {stat:.3f} | {stat / measured:.3f} |")
print("\nReplay only (no run of its own):\n")
print("| shape | replay | hazards model |")
print("|---|---|---|")
for name in ("1x1x2", "2x1x3", "2x2x3", "4x1x5", "4x2x5", "5x1x6", "6x1x7", "6x8x48", "6x8x64"):
    s, kk, nn = (int(x) for x in name.split("x"))
    print(f"| {name} | {trace.expected_committed(s, kk, nn):.3f} | {model.expected_committed(s, kk, nn):.3f} |")
