"""``specdec serve --dp-size N``: N replicas of the engine behind sglang-router (the SGLang project's
Rust router, an optional extra: ``pip install 'specdec[router]'``), not a router of our own.

    specdec serve --model-path M --dp-size 2 --port 30000
      replica i   specdec serve <the same flags> --host 127.0.0.1 --port <free port> --device cuda:{i*tp}
                  (on CPU every replica on cpu)
      router      python -m sglang_router.launch_router --worker-urls <the replicas> --policy cache_aware
                  --host <--host> --port <--port> --prometheus-port <--router-prometheus-port>

The router starts once every replica answers /health. Through it: /generate, /v1/completions,
/v1/chat/completions (streaming too), /health, /health_generate, /v1/models, /get_model_info and
/flush_cache (every replica); its Prometheus metrics (each replica's health, requests by route) at
--router-prometheus-port, each replica's own /metrics at its port (printed at start). A client that
disconnects has its request aborted on its replica (the router drops the upstream connection);
sglang-router 0.3.2 does not route SGLang's /abort_request: send that to the replica. A replica that
dies fails the router's health checks and leaves the rotation; the others keep serving.
SIGINT / SIGTERM stop the router, then drain every replica (--shutdown-timeout); the router dying,
or every replica, stops the rest.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

from specdec.cli.flags import settings_argv
from specdec.engine.args import EngineArgs
from specdec.engine.tp_control import rank_device
from specdec.server.settings import ServerSettings

_POLL_S = 0.5
_ROUTER_LOG_LEVEL = {"critical": "error", "error": "error", "warning": "warn", "info": "info", "debug": "debug"}


def require_router(dp_size: int) -> None:
    if importlib.util.find_spec("sglang_router") is None:
        raise SystemExit(f"specdec serve --dp-size {dp_size} runs its replicas behind sglang-router, which is not "
                         "installed: pip install 'specdec[router]'")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """A child's SIGTERM when the launcher dies, however it dies (Linux; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def replica_command(settings: ServerSettings, engine_args: EngineArgs, index: int, port: int) -> list[str]:
    """Replica ``index``: the same flags on its own local port and device, one replica."""
    device = rank_device(engine_args.device, index * engine_args.tp_size)
    args = dataclasses.replace(engine_args, device=device)
    server = dataclasses.replace(settings, host="127.0.0.1", port=port, dp_size=1)
    return [sys.executable, "-m", "specdec.cli", "serve", *settings_argv(args), *settings_argv(server)]


def router_command(settings: ServerSettings, urls: list[str]) -> list[str]:
    return [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *urls,
            "--policy", settings.router_policy, "--host", settings.host, "--port", str(settings.port),
            "--prometheus-port", str(settings.router_prometheus_port), "--prometheus-host", settings.host,
            "--health-check-interval-secs", str(settings.router_health_check_interval_secs),
            "--shutdown-grace-period-secs", str(int(settings.shutdown_timeout)),
            "--log-level", _ROUTER_LOG_LEVEL[settings.log_level]]


def serve_replicas(settings: ServerSettings, engine_args: EngineArgs) -> None:
    """Start the replicas and the router; return when stopped by a signal, else raise SystemExit."""
    require_router(settings.dp_size)
    if engine_args.nnodes > 1:
        raise SystemExit("specdec serve: --dp-size with --nnodes is not supported")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    ports = [_free_port() for _ in range(settings.dp_size)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    replicas = [subprocess.Popen(replica_command(settings, engine_args, i, p), preexec_fn=_die_with_parent)
                for i, p in enumerate(ports)]
    router = None
    try:
        if not _wait_healthy(replicas, urls, stop):
            return
        router = subprocess.Popen(router_command(settings, urls), preexec_fn=_die_with_parent)
        print(f"specdec serve: {len(urls)} replicas ({', '.join(urls)}; /metrics each) behind sglang-router at "
              f"http://{settings.host}:{settings.port}", flush=True)
        _supervise(router, replicas, stop)
    finally:
        _stop_all(router, replicas, settings.shutdown_timeout)


def _wait_healthy(replicas: list[subprocess.Popen], urls: list[str], stop: threading.Event) -> bool:
    """Until every replica answers /health (False: stopped by a signal first)."""
    waiting = dict(enumerate(urls))
    while waiting:
        if stop.wait(_POLL_S):
            return False
        for i, url in list(waiting.items()):
            if replicas[i].poll() is not None:
                raise SystemExit(f"specdec serve: replica {i} exited (status {replicas[i].returncode}) before it "
                                 "served")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    del waiting[i]
            except httpx.TransportError:
                pass
    return True


def _supervise(router: subprocess.Popen, replicas: list[subprocess.Popen], stop: threading.Event) -> None:
    """Until a signal (return), the router's end or every replica's (SystemExit); a replica that
    ends alone is reported and left to the router's health checks."""
    reported: set[int] = set()
    while not stop.wait(_POLL_S):
        if router.poll() is not None:
            raise SystemExit(f"specdec serve: sglang-router exited (status {router.returncode})")
        for i, proc in enumerate(replicas):
            if proc.poll() is not None and i not in reported:
                reported.add(i)
                print(f"specdec serve: replica {i} exited (status {proc.returncode}); the router's health checks "
                      "take it out of rotation", file=sys.stderr, flush=True)
        if len(reported) == len(replicas):
            raise SystemExit("specdec serve: every replica has exited")


def _stop_all(router: subprocess.Popen | None, replicas: list[subprocess.Popen], drain_s: float) -> None:
    """The router first (no new requests reach a draining replica), then every replica drains."""
    for proc in ([router] if router is not None else []) + replicas:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + drain_s + 15
    for proc in ([router] if router is not None else []) + replicas:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
