"""``specdec serve``: the flags, and the real command line serving the embedded stories260K model."""

import json
import signal

import pytest

from specdec.cli.serve import build_parser
from specdec.engine.args import EngineArgs
from specdec.server import app as server_app
from specdec.server.settings import ServerSettings

from ..serve_process import serve_process, stream_chunks



def test_flags_are_sglangs():
    help_text = build_parser().format_help()
    for flag in ["--model-path", "--host", "--port", "--device", "--dtype", "--speculative-algorithm",
                 "--speculative-draft-model-path", "--speculative-num-steps", "--speculative-eagle-topk",
                 "--speculative-num-draft-tokens", "--attention-backend", "--page-size", "--shutdown-timeout"]:
        assert flag in help_text
    args = build_parser().parse_args(["--port", "1234", "--speculative-algorithm", "EAGLE",
                                      "--speculative-num-steps", "3"])
    assert (args.host, args.port, args.speculative_num_steps) == ("127.0.0.1", 1234, 3)


@pytest.mark.parametrize("tp_size", [1, 2], ids=["tp1", "tp2"])
def test_serve_command_answers_and_drains_on_sigterm(tp_size):
    """SIGTERM mid-request: the request finishes, then the server exits 0; with --tp-size 2 (gloo
    on CPU) that includes stopping the worker and tearing down the process group."""
    with serve_process("--tp-size", str(tp_size)) as (url, proc):
        body = {"text": "Once upon a time", "sampling_params": {"temperature": 0, "max_new_tokens": 48}}
        # in flight at the signal: must still finish
        chunks = stream_chunks(url, body, after_first=lambda: proc.send_signal(signal.SIGTERM))
        assert chunks[-1] == "[DONE]"
        last = json.loads(chunks[-2])
        assert last["meta_info"]["finish_reason"] in ("length", "stop") and last["text"].strip()
        assert proc.wait(timeout=30) == 0


def test_serve_stops_the_engine_process_after_the_server_stops(monkeypatch):
    """``serve`` stops the engine's process (which releases the engine) once uvicorn returns, and
    also when it fails; an engine that cannot start ends ``serve`` with its error."""
    events = []

    class FakeProcessEngine:
        failure = None

        def __init__(self, engine_args, **_):
            if engine_args.model_path == "missing":
                raise server_app.EngineStartError("FileNotFoundError: no model at missing")
            events.append("started")

        def stop(self):
            events.append("stopped")

    class FakeServer:
        def __init__(self, config, async_engine, drain_timeout):
            pass

        def run(self):
            events.append("served")
            raise KeyboardInterrupt

    monkeypatch.setattr(server_app, "ProcessEngine", FakeProcessEngine)
    monkeypatch.setattr(server_app, "GracefulServer", FakeServer)
    monkeypatch.setattr(server_app, "create_app", lambda *a, **kw: None)
    monkeypatch.setattr(server_app.uvicorn, "Config", lambda *a, **kw: None)
    with pytest.raises(KeyboardInterrupt):
        server_app.serve(ServerSettings(), EngineArgs(model_path="unused"))
    assert events == ["started", "served", "stopped"]
    with pytest.raises(SystemExit, match="the engine did not start: FileNotFoundError: no model at missing"):
        server_app.serve(ServerSettings(), EngineArgs(model_path="missing"))
