"""What a decode step costs rank 0's host under tensor parallelism (issue #44), counted on CPU (gloo,
2 ranks): every collective of a steady-state speculative step is one of the forwards' own (the
all-reduces of the layers and of the vocab-parallel embedding, the logits' all-gather), which CUDA
graphs capture on the GPU; no step broadcasts, gathers objects or waits at a barrier; the scheduler
call reaches each worker as one message, pickled once per engine, without polling every rank's
connection and process first; with adaptive speculation rank 0's choice follows as a second message
of a few bytes, never pickled (the other ranks take it: rank 0 alone learns from its clock)."""

import collections
import json
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("transformers")

from specdec.config import SpecConfig  # noqa: E402
from specdec.eagle.policy import PLAIN, StepCosts, candidate_shapes  # noqa: E402
from specdec.engine import tp_worker  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402
from specdec.engine.sampling import SamplingParams  # noqa: E402

STEPS, TOPK, TOKENS = 3, 2, 5
SPEC = dict(speculative_algorithm="EAGLE3", speculative_num_steps=STEPS, speculative_eagle_topk=TOPK,
            speculative_num_draft_tokens=TOKENS)
FORWARD_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor")
HOST_COLLECTIVES = ("broadcast", "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
                    "barrier", "reduce", "gather", "scatter", "send", "recv", "reduce_scatter")
TIMED_STEPS = 8


@pytest.fixture(scope="module")
def checkpoint(qwen3_tp_checkpoint):
    path, head = qwen3_tp_checkpoint
    layers = json.loads((Path(path) / "config.json").read_text())["num_hidden_layers"]
    return path, head, layers


def _flat_costs(tmp_path) -> str:
    shapes = candidate_shapes(SpecConfig.from_flags("EAGLE3", speculative_num_steps=STEPS,
                                                    speculative_eagle_topk=TOPK, speculative_num_draft_tokens=TOKENS))
    table = {PLAIN: {1: 1.0, 2: 1.0}, **{s.name: {1: 0.5, 2: 0.5} for s in shapes}}
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(StepCosts(table, slope={}).to_json()))
    return str(path)


def _count_steps(engine, monkeypatch) -> collections.Counter:
    """Rank 0's calls per steady-state decode step (two requests, greedy, overlap on)."""
    params = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 200, "ignore_eos": True})
    gen = torch.Generator().manual_seed(3)
    for i in range(2):
        engine.add_request(engine.make_request(input_ids=torch.randint(3, 90, (9,), generator=gen).tolist(),
                                               sampling_params=params, rid=f"r{i}"))
    for _ in range(4):  # prefill and the first decode steps
        engine.step()
    counts = collections.Counter()

    def counted(key, fn):
        def call(*args, **kw):
            counts[key] += 1
            return fn(*args, **kw)
        return call

    for name in FORWARD_COLLECTIVES + HOST_COLLECTIVES:
        monkeypatch.setattr(dist, name, counted(name, getattr(dist, name)))
    monkeypatch.setattr(Connection, "send_bytes", counted("message", Connection.send_bytes))
    monkeypatch.setattr(Connection, "send", counted("message", Connection.send))
    monkeypatch.setattr(ForkingPickler, "dumps", classmethod(counted("pickle", ForkingPickler.dumps.__func__)))
    monkeypatch.setattr(tp_worker.TPWorkers, "_gone", counted("poll ranks", tp_worker.TPWorkers._gone))
    for _ in range(TIMED_STEPS):
        engine.step()
    monkeypatch.undo()
    assert engine.scheduler.spec_shape_steps  # the steps speculated
    return counts


@pytest.mark.parametrize("adaptive", [False, True])
def test_tp2_speculative_step_calls(checkpoint, adaptive, tmp_path, monkeypatch):
    path, head, layers = checkpoint
    extra = dict(speculative_adaptive="on", speculative_adaptive_profile=_flat_costs(tmp_path)) if adaptive else {}
    engine = Engine(path, tp_size=2, speculative_draft_model_path=head, max_running_requests=2, **SPEC, **extra)
    try:
        counts = _count_steps(engine, monkeypatch)
    finally:
        engine.shutdown()
    per_step = {k: v / TIMED_STEPS for k, v in counts.items()}
    # the forwards' own: the verify's 2 a layer + the embedding's + the logits' gather; each draft
    # forward's embedding all-reduce (the small head is replicated, the embedding is the target's)
    most = 2 * layers + 2 + STEPS
    assert sum(per_step.get(k, 0) for k in FORWARD_COLLECTIVES) <= most, per_step
    assert not any(counts[k] for k in HOST_COLLECTIVES), per_step
    assert per_step.get("message") == (2 if adaptive else 1), per_step  # one worker: the step (and its choice)
    assert counts["pickle"] == 0 and counts["poll ranks"] == 0, per_step
