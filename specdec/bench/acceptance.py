"""Measure a draft head's acceptance model: per-depth, per-rank hazards on a prompt set.

    python -m specdec.cli.bench acceptance --dataset mt_bench --num-prompts 80   (SmolLM2 + its EAGLE-3 head)

Runs the target greedily with speculation at one wide tree shape (default (6, 8, 32): deep and
wide enough to observe ranks 0-7 at depths 1-6), every verify step recording which draft ranks
its accepted path tried and accepted at each depth, under a parent of which rank
(``specdec.eagle.acceptance``), and writes the hazards with their counts as JSON: the acceptance
model that ``specdec bench --synthetic --acceptance-model hazards`` draws from and that adaptive
speculation starts from. Each parent rank's row is shrunk toward the row pooled over parents by
``PSEUDO_COUNTS`` (the online statistics' prior weight): the deep ranks of low-ranked parents are
reached a few times a run, and ``pooled_hazards`` keeps the pool. ``--trace-output`` also records
the draft's trees and the target's path through them (``specdec.eagle.replay``): what
``--acceptance-model replay`` replays.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from specdec.engine.args import EngineArgs, flag

ACC = "acceptance model"
PSEUDO_COUNTS = 16.0  # a parent row's pull toward the pooled row (AcceptanceStats' prior_weight)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AcceptanceSettings:
    dataset: str = dataclasses.field(default="mt_bench", metadata=flag("prompt set", group=ACC))
    num_prompts: int = dataclasses.field(default=80, metadata=flag("prompts, run as one batch", group=ACC))
    max_new_tokens: int = dataclasses.field(default=256, metadata=flag(
        "longest answer (answers end at the end of turn)", group=ACC))
    output: str = dataclasses.field(default="acceptance_model.json", metadata=flag("JSON output", group=ACC))
    trace_output: str | None = dataclasses.field(default=None, metadata=flag(
        "also record the draft's trees and the target's path through them at every verify step (.npz): the "
        "trace 'specdec bench --synthetic --acceptance-model' replays (specdec.eagle.replay)", group=ACC,
        metavar="PATH"))


def measure_acceptance(settings: AcceptanceSettings, engine_args: EngineArgs) -> dict:
    """The hazards of ``engine_args``' head at its configured shape, over the prompt set."""
    from specdec.config import SpecConfig
    from specdec.eagle.acceptance import AcceptanceModel, AcceptanceStats
    from specdec.eagle.policy import PLAIN, SpecShape, StepCosts, candidate_shapes
    from specdec.eagle.replay import TraceRecorder
    from specdec.engine.chat import has_chat_template, render_user_prompt
    from specdec.engine.embedded import load_prompts
    from specdec.engine.engine import Engine

    with tempfile.TemporaryDirectory() as tmp:  # flat costs: the forced shape runs every step anyway
        config = SpecConfig.from_flags(engine_args.speculative_algorithm,
                                       speculative_num_steps=engine_args.speculative_num_steps,
                                       speculative_eagle_topk=engine_args.speculative_eagle_topk,
                                       speculative_num_draft_tokens=engine_args.speculative_num_draft_tokens)
        names = [PLAIN] + [s.name for s in candidate_shapes(config)]
        costs = Path(tmp) / "costs.json"
        costs.write_text(json.dumps(StepCosts({n: {1: 1.0} for n in names}, {}).to_json()))
        engine = Engine(args=dataclasses.replace(engine_args, speculative_adaptive="on",
                                                 speculative_adaptive_profile=str(costs),
                                                 max_running_requests=settings.num_prompts))
    worker = engine.worker
    worker.force = SpecShape(config.num_steps, config.topk, config.num_draft_tokens)
    worker.policy.stats = AcceptanceStats(worker.policy.stats.prior, horizon=float("inf"))  # raw counts
    recorder = None
    if settings.trace_output:
        if not engine.args.disable_cuda_graph and engine.args.device != "cpu":
            raise ValueError("--trace-output: the trace is read from eager draft steps; add --disable-cuda-graph")

        def owners(rows: list[int]) -> list[object]:  # request-pool row -> the request holding it now
            running = {r.row: r for r in engine.scheduler.running if r.row >= 0}
            return [running[row] for row in rows]

        recorder = TraceRecorder(owners)
        worker.workers[worker.force].draft.observer = recorder
    prompts = load_prompts(settings.dataset, settings.num_prompts)
    if has_chat_template(engine.tokenizer):
        prompts = [render_user_prompt(engine.tokenizer, p) for p in prompts]
    results = engine.generate(prompts, {"temperature": 0, "max_new_tokens": settings.max_new_tokens})
    stats = worker.policy.stats  # [depth, parent rank, rank] counts
    model = AcceptanceModel.from_counts(stats.tried, stats.accepted, pseudo_counts=PSEUDO_COUNTS)
    pooled = AcceptanceModel.from_counts(stats.tried.sum(1, keepdims=True), stats.accepted.sum(1, keepdims=True),
                                         pseudo_counts=0.0)
    committed = [k + 1 for r in results for k in r["meta_info"]["spec_accept_lengths"]]
    protocol = {"model_path": engine_args.model_path, "draft": engine_args.speculative_draft_model_path,
                "algorithm": engine_args.speculative_algorithm, "dataset": settings.dataset,
                "num_prompts": len(prompts), "max_new_tokens": settings.max_new_tokens, "temperature": 0,
                "shape": worker.force.name, "verify_steps": len(committed),
                "acceptance_length": sum(committed) / max(len(committed), 1)}
    if recorder is not None:
        recorder.finish(lambda req: list(req.prompt_ids) + list(req.output_ids), protocol).save(settings.trace_output)
    return {
        "hazards": model.to_json()["hazards"],
        "pooled_hazards": pooled.to_json()["hazards"],
        "pseudo_counts": PSEUDO_COUNTS,
        "tried": stats.tried.round(1).tolist(),
        "accepted": stats.accepted.round(1).tolist(),
        "protocol": protocol,
    }
