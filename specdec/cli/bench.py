"""``specdec bench`` (the throughput benchmark; ``--synthetic``: the full-size GPU sweep) and
``specdec bench-serving`` (the online benchmark of a running server): flags to typed settings."""

from __future__ import annotations

import argparse
import sys

from specdec.bench.synthetic import ENGINE_FLAGS, SyntheticSettings
from specdec.bench.throughput import BenchTarget, ThroughputSettings, resolve_target
from specdec.cli.flags import add_engine_args, add_flags, engine_args_from, settings_from
from specdec.engine.args import EngineArgs
from specdec.engine.embedded import SMOLLM2_INSTALL


# ----------------------------------------------------------------------------- specdec bench
def add_bench_args(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser, default_model=None)
    # NOTE: unset means "the default target's choice" (resolve_target), so this default is None here
    parser.set_defaults(max_running_requests=None)
    add_flags(parser, ThroughputSettings)


def bench_target(args: argparse.Namespace) -> tuple[BenchTarget, ThroughputSettings, EngineArgs]:
    """The resolved target, the benchmark's settings and the engine's, from parsed flags."""
    settings = settings_from(ThroughputSettings, args)
    target = resolve_target(settings, model_path=args.model_path, algorithm=args.speculative_algorithm,
                            draft_path=args.speculative_draft_model_path,
                            max_running_requests=args.max_running_requests)
    engine_args = engine_args_from(args, model_path=target.model_path, speculative_algorithm=target.algorithm,
                                   speculative_draft_model_path=target.draft_path,
                                   max_running_requests=target.max_running_requests)
    return target, settings, engine_args


def bench_main(argv: list[str] | None = None) -> None:
    from specdec.bench.throughput import __doc__ as doc
    from specdec.bench.throughput import run_benchmark, write_report

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--synthetic" or a.startswith("--synthetic=") for a in argv):
        synthetic_main(argv)
        return
    parser = argparse.ArgumentParser(
        prog="specdec bench", description=doc.splitlines()[0],
        epilog=f"With no --model-path: SmolLM2-135M-Instruct and its EAGLE-3 head ({SMOLLM2_INSTALL}); "
        "without that package, the embedded stories260K and its EAGLE head. "
        "specdec bench --synthetic llama-3.1-8b [--help]: the full-size GPU sweep with simulated acceptance "
        "(specdec/bench/synthetic.py).")
    add_bench_args(parser)
    args = parser.parse_args(argv)
    try:
        target, settings, engine_args = bench_target(args)
    except ValueError as e:
        parser.error(str(e))
    write_report(run_benchmark(target, settings, engine_args), settings)


# ----------------------------------------------------------------------------- specdec bench --synthetic
def synthetic_main(argv: list[str] | None = None) -> None:
    from specdec.bench import synthetic, synthetic_report

    parser = argparse.ArgumentParser(prog="specdec bench --synthetic", description=synthetic.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser, EngineArgs, only=set(ENGINE_FLAGS), defaults=ENGINE_FLAGS)
    add_flags(parser, SyntheticSettings)
    args = parser.parse_args(argv)
    try:
        settings = settings_from(SyntheticSettings, args)
        engine_args = EngineArgs(**{name: getattr(args, name) for name in ENGINE_FLAGS})
    except ValueError as e:
        parser.error(str(e))
    synthetic_report.write_report(synthetic.run(settings, engine_args), settings)


# ----------------------------------------------------------------------------- specdec bench-serving
def bench_serving_main(argv: list[str] | None = None) -> None:
    from specdec.bench import serving  # NOTE: needs aiohttp and httpx (the serve extra), so only here

    parser = argparse.ArgumentParser(prog="specdec bench-serving", description=serving.__doc__.splitlines()[0])
    add_flags(parser, serving.ServingSettings)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    settings = settings_from(serving.ServingSettings, args)
    serving.write_report(serving.run_benchmark(settings), settings)


# ----------------------------------------------------------------------------- acceptance model
def acceptance_main(argv: list[str] | None = None) -> None:
    """``python -m specdec.cli.bench acceptance``: a head's acceptance hazards by depth, parent rank and rank."""
    import json
    from pathlib import Path

    from specdec.bench.acceptance import AcceptanceSettings, __doc__ as doc, measure_acceptance
    from specdec.engine import embedded

    parser = argparse.ArgumentParser(prog="python -m specdec.cli.bench acceptance", description=doc.splitlines()[0])
    add_engine_args(parser, default_model=None)
    parser.set_defaults(speculative_num_steps=6, speculative_eagle_topk=8, speculative_num_draft_tokens=32)
    add_flags(parser, AcceptanceSettings)
    args = parser.parse_args(argv)
    settings = settings_from(AcceptanceSettings, args)
    if args.model_path is None:  # the main job's default target and its EAGLE-3 head
        gguf = embedded.smollm2_gguf_path()
        if gguf is None:
            parser.error(f"--model-path: none given and SmolLM2 is not installed ({SMOLLM2_INSTALL})")
        args.model_path = str(gguf)
        args.speculative_algorithm = args.speculative_algorithm or "EAGLE3"
        args.speculative_draft_model_path = args.speculative_draft_model_path or str(
            embedded.SMOLLM2_HEADS / ("eagle3_head" if args.speculative_algorithm == "EAGLE3" else "eagle_head"))
    result = measure_acceptance(settings, engine_args_from(args))
    Path(settings.output).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["protocol"]))
    print(f"Wrote {settings.output}")


# ----------------------------------------------------------------------------- multi-turn synthetic
def multi_turn_main(argv: list[str] | None = None) -> None:
    """``python -m specdec.cli.bench multi-turn``: prefix caching on synthetic full-size conversations."""
    from specdec.bench import multi_turn_synthetic as mts

    parser = argparse.ArgumentParser(prog="python -m specdec.cli.bench multi-turn", description=mts.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser, EngineArgs, only=set(ENGINE_FLAGS), defaults=ENGINE_FLAGS)
    add_flags(parser, mts.MultiTurnSyntheticSettings)
    args = parser.parse_args(argv)
    try:
        settings = settings_from(mts.MultiTurnSyntheticSettings, args)
        engine_args = EngineArgs(**{name: getattr(args, name) for name in ENGINE_FLAGS})
    except ValueError as e:
        parser.error(str(e))
    mts.write_report(mts.run(settings, engine_args), settings)


TOOLS = {"acceptance": acceptance_main, "bench": bench_main, "bench-serving": bench_serving_main,
         "multi-turn": multi_turn_main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        raise SystemExit(f"usage: python -m specdec.cli.bench {{{','.join(TOOLS)}}} [flags]")
    TOOLS[sys.argv[1]](sys.argv[2:])
