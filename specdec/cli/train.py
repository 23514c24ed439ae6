"""``specdec train-draft`` (train a draft head), and the training tools behind it:

    specdec train-draft --algorithm EAGLE3 --output-dir heads/e3          (``specdec.train.pipeline``)
    python -m specdec.cli.train evaluate --model-path M --heads H1,H2      (``specdec.train.evaluate``)
    python -m specdec.cli.train prompts OUT.jsonl SOURCE[:LIMIT] ...       (``specdec.train.data``)
"""

from __future__ import annotations

import argparse
import shlex
import sys

from specdec.cli.flags import add_flags, settings_from


def build_parser() -> argparse.ArgumentParser:
    """``specdec train-draft``'s flags."""
    from specdec.train import pipeline

    parser = argparse.ArgumentParser(prog="specdec train-draft", description=pipeline.__doc__.splitlines()[0])
    add_flags(parser, pipeline.TrainDraftSettings)
    return parser


def train_draft_main(argv: list[str] | None = None) -> None:
    from specdec.train import pipeline

    argv = list(sys.argv[1:] if argv is None else argv)
    settings = settings_from(pipeline.TrainDraftSettings, build_parser().parse_args(argv))
    pipeline.train_draft(settings, command="specdec train-draft " + shlex.join(argv))


def evaluate_main(argv: list[str] | None = None) -> None:
    from specdec.train import evaluate

    parser = argparse.ArgumentParser(prog="python -m specdec.cli.train evaluate",
                                     description=evaluate.__doc__.splitlines()[0])
    add_flags(parser, evaluate.EvaluateSettings)
    args = parser.parse_args(argv)
    try:
        settings = settings_from(evaluate.EvaluateSettings, args)
    except ValueError as e:
        parser.error(str(e))
    evaluate.evaluate(settings)


def prompts_main(argv: list[str] | None = None) -> None:
    from specdec.train.data import SOURCES, write_prompt_file

    p = argparse.ArgumentParser(prog="python -m specdec.cli.train prompts", description="write a training prompt file")
    p.add_argument("output")
    p.add_argument("sources", nargs="+", help=f"SOURCE or SOURCE:LIMIT, SOURCE one of {', '.join(SOURCES)}")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    names = [s.partition(":")[0] for s in args.sources]
    limits = {s.partition(":")[0]: int(s.partition(":")[2]) for s in args.sources if ":" in s}
    out = write_prompt_file(args.output, names, limits=limits, seed=args.seed)
    counts = {n: sum(s.source == n for s in out) for n in names}
    print(f"wrote {len(out)} prompts to {args.output}: {counts}")


TOOLS = {"evaluate": evaluate_main, "prompts": prompts_main, "train-draft": train_draft_main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        raise SystemExit(f"usage: python -m specdec.cli.train {{{','.join(TOOLS)}}} [flags]")
    TOOLS[sys.argv[1]](sys.argv[2:])
