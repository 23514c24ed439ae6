"""The host's own work per decode step at a large batch, on CPU with the tiny dummy model.

On a GPU the decode step's device work is ~1.5 ms at 128 requests of SmolLM2-135M (2026-11-28, H200),
so the host's Python decides the step time. This script makes the host the whole story on CPU: the
``tiny`` dummy shape (4 layers of width 64), 128 requests of random token ids decoded together, and
reports per decode step

    wall     the whole step (prefill steps included, so per decode step of the pass)
    host     wall less the target's and draft's forwards and the ``specdec.kernels`` ops (on a GPU:
             CUDA graphs and Triton kernels), i.e. the engine's own bookkeeping and its torch calls
    calls    (``--top N``) a cProfile pass: calls and own milliseconds per decode step of the
             engine's functions, to see which ones grow with the batch

    python benchmarks/host_step_profile.py [--eagle3] [--bs 128] [--max-new-tokens 128] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from specdec.bench.synthetic_settings import write_dummy_checkpoint
from specdec.engine.decode import DecodeLauncher
from specdec.engine.engine import Engine

class Clock:
    """Seconds spent inside wrapped callables (not nested: an inner call inside an outer one is not
    counted twice, which the kernels inside a model forward would be)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0
        # a cProfile.Profile switched off inside the wrapped callables: it sees the host's work only
        self.profile: cProfile.Profile | None = None

    def wrap(self, fn):
        def timed(*args, **kw):
            self._depth += 1
            if self._depth == 1 and self.profile is not None:
                self.profile.disable()
            start = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - start
                    if self.profile is not None:
                        self.profile.enable()
        return timed


def instrument(engine: Engine, clock: Clock) -> dict:
    """Time the device's share of a step (on a GPU: graphs and kernels): the model forwards, the
    attention backends' planning, and every ``specdec.kernels`` / ``specdec.models.ops`` op where
    the engine and the worker call it. Count decode launches."""
    for model in (engine.target_model, engine.draft_model):
        if model is not None:
            model.forward = clock.wrap(model.forward)
    for cls in {type(engine.runner.attn_backend)} | set(_draft_backends(engine)):
        cls.init_forward_metadata = clock.wrap(cls.init_forward_metadata)
    device_modules = ("specdec.kernels", "specdec.models.ops")
    for name, module in list(sys.modules.items()):
        if not name.startswith("specdec.") or name.startswith(device_modules):
            continue
        for attr, value in list(vars(module).items()):
            if inspect.isfunction(value) and value.__module__.startswith(device_modules):
                setattr(module, attr, clock.wrap(value))
    counter = {"steps": 0}
    launch = DecodeLauncher.launch

    def counting(self, *args, **kw):
        counter["steps"] += 1
        return launch(self, *args, **kw)

    DecodeLauncher.launch = counting
    return counter


def _draft_backends(engine: Engine) -> list[type]:
    worker = engine.worker
    workers = getattr(worker, "workers", {None: worker}).values() if worker is not None else []
    return [type(w.draft.attn_backend) for w in workers]


def one_pass(engine: Engine, bs: int, max_new_tokens: int, rng: random.Random) -> None:
    prompts = [[rng.randrange(1, 500) for _ in range(rng.randrange(16, 64))] for _ in range(bs)]
    # varied lengths, so requests leave the batch one by one as in a server
    params = [{"max_new_tokens": rng.randrange(max_new_tokens // 2, max_new_tokens + 1), "ignore_eos": True,
               "temperature": 0.0} for _ in range(bs)]
    engine.generate(input_ids=prompts, sampling_params=params)
    engine.flush_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eagle3", action="store_true", help="EAGLE-3 speculation (default: plain decoding)")
    parser.add_argument("--bs", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--passes", type=int, default=3, help="timed passes (the median is reported)")
    parser.add_argument("--top", type=int, default=0, help="print the N engine functions of most own time")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    target, head = write_dummy_checkpoint("tiny", Path(tempfile.mkdtemp()))
    spec = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=head) if args.eagle3 else {}
    engine = Engine(target, load_format="dummy", device="cpu", max_running_requests=args.bs,
                    overlap_schedule=True, **spec)
    rng = random.Random(0)
    one_pass(engine, args.bs, 16, rng)  # warm-up
    clock = Clock()
    counter = instrument(engine, clock)
    walls, hosts = [], []
    for _ in range(args.passes):
        counter["steps"], clock.seconds = 0, 0.0
        start = time.perf_counter()
        one_pass(engine, args.bs, args.max_new_tokens, rng)
        wall = time.perf_counter() - start
        walls.append(wall / counter["steps"] * 1e3)
        hosts.append((wall - clock.seconds) / counter["steps"] * 1e3)
    name = "EAGLE-3" if args.eagle3 else "plain"
    print(f"{name}, bs {args.bs}: {counter['steps']} decode steps a pass; per decode step "
          f"wall {sorted(walls)[len(walls) // 2]:.2f} ms, host {sorted(hosts)[len(hosts) // 2]:.2f} ms "
          f"(passes: {', '.join(f'{h:.2f}' for h in hosts)})")
    if args.top:
        print_top(engine, args, rng, counter, clock)


def print_top(engine: Engine, args, rng: random.Random, counter: dict, clock: Clock) -> None:
    """A cProfile of one more pass, off inside the device's share (``instrument``): the host's own
    functions, torch's calls among them, by own time."""
    counter["steps"] = 0
    clock.profile = prof = cProfile.Profile()
    prof.enable()
    one_pass(engine, args.bs, args.max_new_tokens, rng)
    prof.disable()
    clock.profile = None
    steps = counter["steps"]
    rows = []
    for (file, line, fn), (_, calls, own, cum, _) in pstats.Stats(prof).stats.items():
        where = f"{file.split('specdec/', 1)[1]}:{line}({fn})" if "specdec/" in file else f"{file}:{line}({fn})"
        rows.append((own, calls, cum, where))
    print(f"cProfile of the host, {steps} decode steps: calls / own ms / cumulative ms per decode step")
    for own, calls, cum, where in sorted(rows, reverse=True)[: args.top]:
        print(f"{calls / steps:9.1f} {own / steps * 1e3:8.3f} {cum / steps * 1e3:8.3f}  {where}")

if __name__ == "__main__":
    main()
