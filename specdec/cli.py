"""Command line: ``specdec serve``, ``specdec bench`` (throughput benchmark), ``specdec generate``."""

from __future__ import annotations

import argparse
import json
import sys

from specdec.server.args import DEFAULT_MODEL, add_engine_args, engine_kwargs


def _generate(argv: list[str]) -> None:
    from specdec.engine.engine import Engine

    parser = argparse.ArgumentParser(prog="specdec generate", description="Generate text for one prompt.")
    add_engine_args(parser, default_model=DEFAULT_MODEL)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    engine = Engine(**engine_kwargs(args))
    out = engine.generate(args.prompt, {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature})
    print(out.get("text", out["output_ids"]))
    print(json.dumps(out["meta_info"]), file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "serve": "HTTP server (SGLang-compatible API)",
        "bench": "throughput benchmark, with and without speculation",
        "bench-serving": "online benchmark of a running server: throughput, TTFT/TPOT/ITL, acceptance",
        "generate": "one prompt",
        "train-draft": "train an EAGLE / EAGLE-3 draft head for a target",
    }
    if not argv or argv[0] not in commands:
        print(f"usage: specdec {{{','.join(commands)}}} [flags]   (specdec COMMAND --help for flags)")
        for name, what in commands.items():
            print(f"  {name:<14} {what}")
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    if argv[0] == "serve":
        from specdec.server.cli import main as serve_main

        serve_main(argv[1:])
    elif argv[0] == "bench-serving":
        from specdec.bench_serving import main as bench_serving_main

        bench_serving_main(argv[1:])
    elif argv[0] == "train-draft":
        from specdec.train.cli import main as train_main

        train_main(argv[1:])
    elif argv[0] == "bench":
        from specdec.benchmark import main as bench_main

        bench_main(argv[1:])
    else:
        _generate(argv[1:])


if __name__ == "__main__":
    main()
