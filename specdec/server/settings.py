"""``ServerSettings``: what ``specdec serve`` adds to the engine's settings (``EngineArgs``)."""

from __future__ import annotations

import dataclasses

from specdec.engine.args import flag

SERVER = "server"
REPLICAS = "data-parallel replicas (sglang-router)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerSettings:
    host: str = dataclasses.field(default="127.0.0.1", metadata=flag("address to listen on", group=SERVER))
    port: int = dataclasses.field(default=30000, metadata=flag("port to listen on", group=SERVER))
    served_model_name: str | None = dataclasses.field(default=None, metadata=flag(
        "model name in OpenAI responses (default: --model-path)", group=SERVER))
    log_level: str = dataclasses.field(default="info", metadata=flag(
        "uvicorn and engine log level", group=SERVER, choices=["critical", "error", "warning", "info", "debug"]))
    stream_interval: int = dataclasses.field(default=1, metadata=flag(
        "a streamed request's chunk waits for this many new tokens (its first token and its end go at once); "
        "larger: fewer chunks, more throughput at many requests (SGLang's flag)", group=SERVER))
    shutdown_timeout: float = dataclasses.field(default=30.0, metadata=flag(
        "seconds in-flight requests may run after a shutdown signal before they are aborted", group=SERVER))
    dp_size: int = dataclasses.field(default=1, metadata=flag(
        "data-parallel replicas: N engine servers (replica i on cuda:i*tp-size; on CPU all on cpu), each on its "
        "own local port, behind sglang-router at --host/--port (pip install 'specdec[router]')", group=REPLICAS))
    router_policy: str = dataclasses.field(default="cache_aware", metadata=flag(
        "sglang-router's --policy over the replicas", group=REPLICAS,
        choices=["cache_aware", "round_robin", "random", "power_of_two"]))
    router_prometheus_port: int = dataclasses.field(default=29000, metadata=flag(
        "sglang-router's Prometheus metrics port (worker health, requests per route)", group=REPLICAS))
    router_health_check_interval_secs: int = dataclasses.field(default=5, metadata=flag(
        "seconds between sglang-router's health checks of each replica (3 failed in a row take it out of "
        "rotation)", group=REPLICAS))

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"--port={self.port}: expected 1..65535")
        if self.dp_size < 1 or self.router_health_check_interval_secs < 1:
            raise ValueError("--dp-size and --router-health-check-interval-secs: expected >= 1")
        if self.stream_interval < 1:
            raise ValueError(f"--stream-interval={self.stream_interval}: expected >= 1")
        if self.shutdown_timeout < 0:
            raise ValueError(f"--shutdown-timeout={self.shutdown_timeout}: expected >= 0")
