"""``specdec serve``: SGLang's launch-server flags; ``specdec.server.app.serve`` does the rest.

    specdec serve --model-path M --speculative-algorithm EAGLE --speculative-draft-model-path D \\
        --host 127.0.0.1 --port 30000

Several nodes (``--nnodes``): node 0 serves HTTP; every other node runs the same command with its
``--node-rank`` and serves nothing (``tp_worker.serve_node``). ``--dp-size N``: N replicas behind
sglang-router (``specdec.cli.replicas``).

Shutdown (SIGINT / SIGTERM): the first signal drains — new requests get 503, in-flight ones run to
their end for up to ``--shutdown-timeout`` seconds, then are aborted (their clients get an error
event) — and uvicorn then closes; a second SIGINT exits at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from specdec.cli.flags import add_engine_args, add_flags, engine_args_from, settings_from
from specdec.engine.embedded import DEFAULT_MODEL
from specdec.server.settings import ServerSettings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec serve",
                                     description="Serve a model over HTTP (SGLang-compatible API).")
    add_engine_args(parser, default_model=DEFAULT_MODEL)
    add_flags(parser, ServerSettings)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings, engine_args = settings_from(ServerSettings, args), engine_args_from(args)
    except ValueError as e:
        parser.error(str(e))
    if settings.dp_size > 1:
        from specdec.cli.replicas import serve_replicas

        serve_replicas(settings, engine_args)
        return
    if engine_args.node_rank > 0:
        _follow(engine_args)
    from specdec.server.app import serve

    serve(settings, engine_args)


def _follow(engine_args) -> NoReturn:
    """Node ``--node-rank`` > 0 until node 0 stops it; the process ends here (0, or 1 with the cause)."""
    from specdec.engine.engine import Engine
    from specdec.engine.tp_worker import serve_node

    code = 0
    try:
        serve_node(engine_args, Engine)
    except SystemExit as e:
        if isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    # NOTE: end without the interpreter's teardown: torch.distributed's C++ threads (the store client's,
    # gloo's) may still be joinable there, and destroying one aborts a process that shut down cleanly
    # ("terminate called without an active exception", exit -6: seen once in four runs under load)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
