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
import sys

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
        from specdec.engine.engine import Engine
        from specdec.engine.tp_worker import serve_node

        serve_node(engine_args, Engine)
        return
    from specdec.server.app import serve

    serve(settings, engine_args)


if __name__ == "__main__":
    main()
