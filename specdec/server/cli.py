"""``specdec serve``: SGLang's launch-server flags; ``specdec.server.app.serve`` does the rest.

    specdec serve --model-path M --speculative-algorithm EAGLE --speculative-draft-model-path D \\
        --host 127.0.0.1 --port 30000

Shutdown (SIGINT / SIGTERM): the first signal drains — new requests get 503, in-flight ones run to
their end for up to ``--shutdown-timeout`` seconds, then are aborted (their clients get an error
event) — and uvicorn then closes; a second SIGINT exits at once.
"""

from __future__ import annotations

import argparse
import sys

from specdec.server.args import DEFAULT_MODEL, add_engine_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec serve",
                                     description="Serve a model over HTTP (SGLang-compatible API).")
    add_engine_args(parser, default_model=DEFAULT_MODEL)
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=30000)
    g.add_argument("--served-model-name", default=None, help="model name in OpenAI responses (default: --model-path)")
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    g.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests may run after a shutdown signal before they are aborted")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    from specdec.server.app import serve

    serve(args)


if __name__ == "__main__":
    main()
