"""Host launches per NGRAM decode step, pinned from above (issue #42).

At one request a small model's lookup step is host-bound on a GPU: between its one CUDA graph (the
verify forward) every torch op and Triton kernel costs host time. ``specdec.bench.op_count`` counts
them on CPU over steady-state steps of an NGRAM engine (the tests' tiny target, overlap on, device
lookups, every step a lookup or every step plain, the graph path run eagerly). The bounds are the
counts measured when they were set, so a change that adds launches to a step fails here.

Run as a script to print the counts by op: ``python -m tests.ngram.test_op_count [lookup|plain ...]``.
"""

from __future__ import annotations

import pytest
import torch

from ..triton_env import import_kernels

for _module in ("cache_ops", "commit", "frontier", "ngram_match", "packbits", "replay", "row_kv", "tree_build",
                "verify"):
    import_kernels(f"specdec.kernels.triton.{_module}")  # interpreted on CPU: launches to count

from specdec.bench.op_count import DecodeOps, count_batch_steps  # noqa: E402
from specdec.ngram.worker import LOOK_UP_EVERY_STEP  # noqa: E402

from ..e2e.helpers import make_pair  # noqa: E402
from ..e2e.test_ngram import ngram_engine, repetitive_prompts  # noqa: E402

BS = 4
# step kind -> the most kernels one decode step may launch outside its graph
# (the plain step's equals a plain engine's since the forwards record their tokens in their graphs)
MAX_KERNELS = {"lookup": 20, "plain": 12}
# the most view / metadata ops (each a dispatch on the host, no launch)
MAX_VIEWS = {"lookup": 30, "plain": 9}


def measure(kind: str) -> DecodeOps:
    target, _ = make_pair("EAGLE", "mixed")
    eng = ngram_engine(target, max_running_requests=BS, speculative_adaptive="on")
    eng.capture_cuda_graphs([BS], use_graphs=False)
    eng.worker.force = LOOK_UP_EVERY_STEP if kind == "lookup" else 0  # (0: every step plain)
    params = {"temperature": 0, "max_new_tokens": 60, "ignore_eos": True}
    prompts = repetitive_prompts(target.config.vocab_size)
    return count_batch_steps(eng, [eng.make_request(input_ids=prompts[i % len(prompts)], sampling_params=params)
                                   for i in range(BS)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts the CPU interpreter's launches")
@pytest.mark.parametrize("kind", list(MAX_KERNELS))
def test_launches_per_decode_step_stay_within_bounds(kind):
    ops = measure(kind)
    assert ops.bs == BS and ops.shape.startswith("ngram" if kind == "lookup" else "plain"), ops.table()
    assert ops.per_phase["total"]["graphs"] == 1, ops.table()  # the verify / decode forward's graph
    assert ops.kernels() <= MAX_KERNELS[kind], ops.table()
    assert ops.per_phase["total"]["views"] <= MAX_VIEWS[kind], ops.table()


if __name__ == "__main__":
    import sys

    for kind in sys.argv[1:] or list(MAX_KERNELS):
        ops = measure(kind)
        print(ops.table())
        for phase, names in ops.names.items():
            print(f"  {phase}: " + ", ".join(f"{n} {c:g}" for n, c in names.items()))
