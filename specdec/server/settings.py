"""``ServerSettings``: what ``specdec serve`` adds to the engine's settings (``EngineArgs``)."""

from __future__ import annotations

import dataclasses

from specdec.engine.args import flag

SERVER = "server"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerSettings:
    host: str = dataclasses.field(default="127.0.0.1", metadata=flag("address to listen on", group=SERVER))
    port: int = dataclasses.field(default=30000, metadata=flag("port to listen on", group=SERVER))
    served_model_name: str | None = dataclasses.field(default=None, metadata=flag(
        "model name in OpenAI responses (default: --model-path)", group=SERVER))
    log_level: str = dataclasses.field(default="info", metadata=flag(
        "uvicorn and engine log level", group=SERVER, choices=["critical", "error", "warning", "info", "debug"]))
    shutdown_timeout: float = dataclasses.field(default=30.0, metadata=flag(
        "seconds in-flight requests may run after a shutdown signal before they are aborted", group=SERVER))

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"--port={self.port}: expected 1..65535")
        if self.shutdown_timeout < 0:
            raise ValueError(f"--shutdown-timeout={self.shutdown_timeout}: expected >= 0")
