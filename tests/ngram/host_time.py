"""Host time of an NGRAM decode step on CPU, with the device's work taken away (a diagnostic, not a test).

At one request a small model's step on a GPU is bound by the host when its host work passes the GPU's ~0.9
ms. ``tests/ngram/test_op_count.py`` counts a step's torch launches; this times everything else too (the
policy's choice, the reach lookup, numpy): each CUDA-graph function of the engine returns its first outputs
again, so a step costs only its host work. The tests' tiny target, one request at a time, overlap on,
adaptive on; every step plain, every step a lookup, and the policy's choice. The lookup steps' figure
includes the lookup and acceptance kernels' torch references, which a GPU runs as one launch each.

    python -m tests.ngram.host_time
"""

from __future__ import annotations

import time

import numpy as np
import torch

from specdec.ngram.worker import LOOK_UP_EVERY_STEP

from ..e2e.helpers import make_pair
from ..e2e.test_ngram import ngram_engine


def without_device_work(engine) -> None:
    """Each graph function returns its first outputs at each batch size again (no model forward)."""
    for runner in engine.runner.graphs.values():
        fn, outputs = runner.fn, {}

        def first_outputs(_fn=fn, _outputs=outputs, **views):
            bs = views["req_pool_indices"].shape[0]
            if bs not in _outputs:
                _outputs[bs] = tuple(o.clone() for o in _fn(**views))
            return _outputs[bs]

        runner.fn = first_outputs


def host_us_a_step(force: int | None, *, steps: int = 600, warm: int = 50) -> tuple[float, dict[str, int]]:
    """Mean host microseconds a decode step over ``steps`` steps, and the steps by shape."""
    torch.manual_seed(0)
    target, _ = make_pair("EAGLE", "mixed")
    prompt = np.random.default_rng(0).integers(3, target.config.vocab_size, 100).tolist()
    engine = ngram_engine(target, max_running_requests=4, max_total_tokens=4096, speculative_adaptive="on",
                          speculative_num_draft_tokens=12, speculative_ngram_max_match_window_size=12)
    engine.capture_cuda_graphs([1, 2, 4], use_graphs=False)
    without_device_work(engine)
    engine.worker.force = force
    params = {"temperature": 0, "max_new_tokens": 380, "ignore_eos": True}
    scheduler, spent = engine.scheduler, 0.0
    for i in range(warm + steps):
        if not scheduler.running and not scheduler.waiting:
            engine.add_request(engine.make_request(input_ids=prompt, sampling_params=params))
        start = time.perf_counter()
        scheduler.step()
        if i >= warm:
            spent += time.perf_counter() - start
    return spent / steps * 1e6, dict(scheduler.decoder.spec_shape_steps)


if __name__ == "__main__":
    for label, force in [("every step plain", 0), ("every step a lookup", LOOK_UP_EVERY_STEP),
                         ("the policy's choice", None)]:
        us, shapes = host_us_a_step(force)
        print(f"{label}: {us:.0f} us a step (shapes {shapes})")
