"""Host launches per speculative decode step at 64 requests, pinned from above (issue #40).

On a GPU a small model's decode step is host-bound: between the CUDA-graph replays each torch op
and Triton kernel costs host time. ``specdec.bench.op_count`` counts them on CPU over steady-state
steps of EAGLE-3 workers (tiny random models, overlap on, adaptive on with the shape forced, the
graph path run eagerly with each graph counted as one replay). The bounds below are the counts
measured when they were set, so a change that adds launches between the graphs fails here.

Run as a script to print the counts by phase and op: ``python -m tests.eagle.test_op_count [3x1x4 ...]``.
"""

from __future__ import annotations

import pytest
import torch

from ..triton_env import import_kernels

for _module in ("cache_ops", "commit", "frontier", "packbits", "replay", "row_kv", "simulate", "tree_build", "verify"):
    import_kernels(f"specdec.kernels.triton.{_module}")  # interpreted on CPU: launches to count

from specdec.bench.op_count import DecodeOps, count_batch_steps  # noqa: E402
from specdec.eagle.policy import SpecShape  # noqa: E402

from ..e2e.helpers import make_pair, prompts_of  # noqa: E402
from ..e2e.test_adaptive import adaptive_engine  # noqa: E402

BS = int(__import__("os").environ.get("OPS_BS", 64))
# (steps, topk, draft tokens) -> the most kernels a decode step may launch outside the graphs
MAX_KERNELS = {(3, 1, 4): 25, (5, 4, 8): 26}
# the most view / metadata ops (each a dispatch on the host, no launch)
MAX_VIEWS = {(3, 1, 4): 43, (5, 4, 8): 43}


def measure(shape: tuple[int, int, int], tmp_path, *, greedy: bool = True) -> DecodeOps:
    target, draft = make_pair("EAGLE3", "mixed")
    eng = adaptive_engine(target, draft, "EAGLE3", tmp_path, overlap_schedule=True,
                          max_running_requests=BS, max_total_tokens=BS * 160)
    eng.capture_cuda_graphs([BS], use_graphs=False)
    eng.worker.force = SpecShape(*shape)
    params = {"temperature": 0 if greedy else 0.8, "max_new_tokens": 60, "ignore_eos": True}
    prompts = prompts_of([5 + i % 7 for i in range(BS)], target.config.vocab_size, seed=3)
    return count_batch_steps(eng, [eng.make_request(input_ids=ids, sampling_params=params) for ids in prompts])


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts the CPU interpreter's launches")
@pytest.mark.parametrize("shape", list(MAX_KERNELS), ids=lambda s: "x".join(map(str, s)))
def test_launches_per_decode_step_stay_within_bounds(shape, tmp_path):
    ops = measure(shape, tmp_path)
    assert ops.bs == BS and ops.shape == "x".join(map(str, shape))
    print(ops.table())
    assert ops.kernels() <= MAX_KERNELS[shape], ops.table()
    assert ops.per_phase["total"]["views"] <= MAX_VIEWS[shape], ops.table()


if __name__ == "__main__":
    import sys
    import tempfile
    from pathlib import Path

    shapes = [tuple(map(int, a.split("x"))) for a in sys.argv[1:]] or list(MAX_KERNELS)
    for shape in shapes:
        with tempfile.TemporaryDirectory() as tmp:
            ops = measure(shape, Path(tmp))
        print(ops.table())
        for phase, names in ops.names.items():
            print(f"  {phase}: " + ", ".join(f"{n} {c:g}" for n, c in names.items()))
