"""Command line: ``specdec serve``, ``specdec bench`` (throughput benchmark), ``specdec bench-serving``,
``specdec generate``, ``specdec train-draft``. The only place of the package that parses flags: each
command turns them into typed settings (``EngineArgs`` and its own) and hands those over."""

from __future__ import annotations

import argparse
import json
import sys

COMMANDS = {
    "serve": "HTTP server (SGLang-compatible API)",
    "bench": "throughput benchmark, with and without speculation",
    "bench-serving": "online benchmark of a running server: throughput, TTFT/TPOT/ITL, acceptance",
    "generate": "one prompt",
    "train-draft": "train an EAGLE / EAGLE-3 draft head for a target",
}


def generate_main(argv: list[str]) -> None:
    from specdec.cli.flags import add_engine_args, engine_args_from
    from specdec.engine.embedded import DEFAULT_MODEL
    from specdec.engine.engine import Engine

    parser = argparse.ArgumentParser(prog="specdec generate", description="Generate text for one prompt.")
    add_engine_args(parser, default_model=DEFAULT_MODEL)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    engine = Engine(args=engine_args_from(args))
    out = engine.generate(args.prompt, {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature})
    print(out.get("text", out["output_ids"]))
    print(json.dumps(out["meta_info"]), file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: specdec {{{','.join(COMMANDS)}}} [flags]   (specdec COMMAND --help for flags)")
        for name, what in COMMANDS.items():
            print(f"  {name:<14} {what}")
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from specdec.cli.serve import main as serve_main

        serve_main(rest)
    elif command == "bench":
        from specdec.cli.bench import bench_main

        bench_main(rest)
    elif command == "bench-serving":
        from specdec.cli.bench import bench_serving_main

        bench_serving_main(rest)
    elif command == "train-draft":
        from specdec.cli.train import train_draft_main

        train_draft_main(rest)
    else:
        generate_main(rest)
