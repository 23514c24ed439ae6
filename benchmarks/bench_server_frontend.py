"""The HTTP process's own ceiling: `specdec serve`'s server in front of an engine that costs nothing.

`specdec serve` runs the engine in a process of its own; the server's process parses, tokenizes,
detokenizes and streams. What it can stream is the ceiling of any engine behind it. Here the engine's
process runs the real ``EngineLoop`` over ``InstantEngine``, which every ``--step-ms`` commits one
token to every running request (as a plain decode step would) and computes nothing; the server is the
real app (``ProcessEngine``, routes, detokenization, stop checks, uvicorn), and ``specdec
bench-serving --backend openai`` measures it from a third process. A server that keeps up streams
``concurrency / step`` tokens a second; what it streams below that is its ceiling on this host.

    python benchmarks/bench_server_frontend.py --concurrency 32 128 --step-ms 1.5
    python benchmarks/bench_server_frontend.py --concurrency 128 --profile /tmp/server.prof  # cProfile

A CPU diagnostic: the figure depends on the host's cores and clock (it is not the GPU's).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specdec.engine.args import EngineArgs  # noqa: E402
from specdec.engine.embedded import DEFAULT_MODEL  # noqa: E402
from specdec.engine.request import Request  # noqa: E402
from specdec.engine.sampling import SamplingParams  # noqa: E402
from specdec.models.tokenizer import load_tokenizer  # noqa: E402


class InstantEngine:
    """What ``EngineLoop`` calls of an Engine: a step sleeps ``step_s`` and gives each running request one token."""

    def __init__(self, args: EngineArgs, *, step_s: float) -> None:
        self.args = args
        self.step_s = step_s
        self.tokenizer = load_tokenizer(DEFAULT_MODEL)
        self.context_length = 1 << 16
        self.vocab = self.tokenizer.vocab_size
        self.target_model = SimpleNamespace(config=SimpleNamespace(vocab_size=self.vocab))
        self.spec_config = None
        self.memory = SimpleNamespace(page_size=1, capacity=1 << 20)
        self.kv_bytes_per_token = 0
        self.scheduler = SimpleNamespace(running=[], waiting=[], spec_shape_steps={}, has_work=False, prefill_tokens=0,
                                         prefill_steps=0)
        self._steps = 0

    def watch_workers(self, listener) -> None:
        pass

    def bind_thread(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def flush_cache(self) -> int:
        return 0

    def cache_stats(self) -> dict:
        return {"cache_hit_rate": 0.0, "cached_prompt_tokens": 0, "prefill_tokens": 0, "num_retracted_reqs": 0,
                "num_pages": 1, "free_pages": 1, "evictable_pages": 0}

    def make_request(self, text, input_ids, sampling_params, rid, clamp_max_new_tokens=False) -> Request:
        if input_ids is None:
            input_ids = self.tokenizer.encode(text)
        return Request(rid=rid, prompt_ids=list(input_ids), params=SamplingParams.from_dict(sampling_params),
                       stop_ids=frozenset())

    def add_request(self, req: Request) -> None:
        self.scheduler.running.append(req)
        self.scheduler.has_work = True

    def abort(self, rid: str) -> None:
        self.scheduler.running = [r for r in self.scheduler.running if r.rid != rid]
        self.scheduler.has_work = bool(self.scheduler.running)

    def step(self) -> None:
        time.sleep(self.step_s)
        self._steps += 1
        for i, req in enumerate(self.scheduler.running):
            req.append([3 + (self._steps + 7 * i) % (self.vocab - 3)])
        self.scheduler.running = [r for r in self.scheduler.running if not r.finished]
        self.scheduler.has_work = bool(self.scheduler.running)


def serve(port: int, step_ms: float, profile: str | None) -> None:
    import uvicorn

    from specdec.server.app import GracefulServer, create_app
    from specdec.server.engine_process import ProcessEngine

    engine = ProcessEngine(EngineArgs(model_path="instant"), log_level="warning",
                           engine_factory=functools.partial(InstantEngine, step_s=step_ms / 1e3))
    config = uvicorn.Config(create_app(engine, model_name="instant"), host="127.0.0.1", port=port, log_level="warning")
    server = GracefulServer(config, engine, drain_timeout=1.0)
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    try:
        server.run()
    finally:
        if profiler:
            profiler.disable()
            profiler.dump_stats(profile)
        engine.stop()


def wait_healthy(server: subprocess.Popen, url: str, timeout: float = 120.0) -> None:
    """Until ``url``/health answers 200; raises if the server exits or the time runs out first."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if server.poll() is not None:
            raise SystemExit(f"the server exited (status {server.returncode}) before it served")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the server at {url} did not come up in {timeout:.0f} s")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--step-ms", type=float, default=1.5, help="the fake engine's step (default 1.5 ms)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--port", type=int, default=31700)
    parser.add_argument("--profile", help="cProfile the server's process into this file")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server's process
    args = parser.parse_args()
    if args.serve:
        serve(args.port, args.step_ms, args.profile)
        return
    cmd = [sys.executable, __file__, "--serve", "--port", str(args.port), "--step-ms", str(args.step_ms)]
    server = subprocess.Popen(cmd + (["--profile", args.profile] if args.profile else []))
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_healthy(server, url)
        for c in args.concurrency:
            out = subprocess.run([sys.executable, "-m", "specdec.cli.bench", "bench-serving", "--backend", "openai",
                                  "--base-url", url, "--dataset", "tinystories", "--num-prompts", str(2 * c),
                                  "--max-new-tokens", str(args.max_new_tokens), "--concurrency", str(c),
                                  "--disable-tqdm", "--output", "/dev/null"],
                                 cwd=REPO, capture_output=True, text=True, check=True).stdout
            line = next(x for x in out.splitlines() if x.startswith("Throughput"))
            offered = c / (args.step_ms / 1e3)
            print(f"concurrency {c}: {line.split(':', 1)[1].strip()} (the engine offers {offered:,.0f} tok/s)")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


if __name__ == "__main__":
    main()
