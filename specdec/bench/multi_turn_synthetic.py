"""Multi-turn prefix caching at full size without published weights, in process:
``python -m specdec.cli.bench multi-turn --synthetic llama-3.1-8b``.

The synthetic target and EAGLE-3 head of ``specdec.bench.synthetic`` (random weights, acceptance
drawn from the shipped acceptance model), one speculative shape, and random-token conversations:
turn 1 is ``--first-turn-len`` tokens, every later turn is the conversation so far (prompts and
the engine's answers) plus ``--turn-len`` new tokens. ``--concurrency`` conversations run at once;
a conversation sends its next turn when the last one ends. The same workload runs with the prefix
cache on and off (``--disable-radix-cache``), each on a fresh engine drawing the same random weights.

Per turn: TTFT (submission to the first output token visible on the host; the engine steps in this
thread, so queueing behind other requests' steps counts) and the prompt tokens the cache supplied.
Reported per setting: prefill tokens computed and saved, TTFT p50 / p99 (all turns, and per turn
index), output throughput, and the KV bytes per token of target and draft.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import gc
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from specdec.bench.report import latency_stats_ms
from specdec.engine.args import EngineArgs, flag

MT = "multi-turn synthetic benchmark"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MultiTurnSyntheticSettings:
    synthetic: str = dataclasses.field(default="llama-3.1-8b", metadata=flag(
        "target shape (random weights; see specdec bench --synthetic)", group=MT))
    config: str = dataclasses.field(default="5,4,8", metadata=flag(
        "speculative (steps, topk, draft tokens), or 'none' for plain decoding", group=MT))
    num_conversations: int = dataclasses.field(default=32, metadata=flag("conversations", group=MT))
    turns: int = dataclasses.field(default=2, metadata=flag("turns per conversation", group=MT))
    first_turn_len: int = dataclasses.field(default=1024, metadata=flag("prompt tokens of turn 1", group=MT))
    turn_len: int = dataclasses.field(default=128, metadata=flag("new prompt tokens of each later turn", group=MT))
    max_new_tokens: int = dataclasses.field(default=128, metadata=flag("output tokens per turn", group=MT))
    concurrency: int = dataclasses.field(default=8, metadata=flag("conversations at once", group=MT))
    seed: int = dataclasses.field(default=0, metadata=flag("weights and conversations", group=MT))
    output: str = dataclasses.field(default="bench_multi_turn.json", metadata=flag("JSON results file", group=MT))


def conversations(settings: MultiTurnSyntheticSettings, vocab: int) -> list[list[list[int]]]:
    """Each conversation's user turns as random token ids: [turns][tokens]."""
    rng = np.random.default_rng(settings.seed)
    lens = [settings.first_turn_len] + [settings.turn_len] * (settings.turns - 1)
    return [[rng.integers(3, vocab, n).tolist() for n in lens] for _ in range(settings.num_conversations)]


def run_workload(engine, convs: list[list[list[int]]], *, max_new_tokens: int, concurrency: int) -> dict:
    """Every conversation turn by turn, ``concurrency`` at once; returns the summary."""
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    waiting = collections.deque(range(len(convs)))
    history: list[list[int]] = [[] for _ in convs]
    active: dict[int, list] = {}  # conversation -> [turn, request, submitted at, ttft]
    turns = []

    def submit(c: int, turn: int) -> None:
        history[c] = history[c] + convs[c][turn]
        req = engine.make_request(input_ids=history[c], sampling_params=params)
        engine.add_request(req)
        active[c] = [turn, req, time.perf_counter(), None]

    start = time.perf_counter()
    while waiting or active:
        while waiting and len(active) < concurrency:
            submit(waiting.popleft(), 0)
        engine.step()
        now = time.perf_counter()
        for c, entry in list(active.items()):
            turn, req, sent, ttft = entry
            if ttft is None and req.output_ids:
                entry[3] = ttft = now - sent
            if req.finished:
                turns.append({"conversation": c, "turn": turn, "prompt_tokens": len(req.prompt_ids),
                              "cached_tokens": req.cached_tokens, "output_tokens": len(req.output_ids),
                              "ttft": ttft, "latency": now - sent})
                history[c] = history[c] + req.output_ids
                del active[c]
                if turn + 1 < len(convs[c]):
                    submit(c, turn + 1)
    seconds = time.perf_counter() - start
    engine.scheduler.drain()
    return summarize(turns, seconds)


def summarize(turns: list[dict], seconds: float) -> dict:
    prompt, cached = sum(t["prompt_tokens"] for t in turns), sum(t["cached_tokens"] for t in turns)
    by_turn = collections.defaultdict(list)
    for t in turns:
        by_turn[t["turn"]].append(t)
    out_tokens = sum(t["output_tokens"] for t in turns)
    return {
        "seconds": seconds, "turns": len(turns), "prompt_tokens": prompt, "cached_tokens": cached,
        "prefill_tokens": prompt - cached, "prefill_saved_fraction": cached / prompt if prompt else 0.0,
        "completion_tokens": out_tokens, "throughput_tok_s": out_tokens / seconds if seconds else 0.0,
        "ttft_ms": latency_stats_ms([t["ttft"] for t in turns if t["ttft"] is not None]),
        "per_turn": {str(k): {"prompt_tokens": sum(t["prompt_tokens"] for t in v),
                              "cached_tokens": sum(t["cached_tokens"] for t in v),
                              "ttft_ms": latency_stats_ms([t["ttft"] for t in v if t["ttft"] is not None])}
                     for k, v in sorted(by_turn.items())},
    }


def run(settings: MultiTurnSyntheticSettings, engine_args: EngineArgs) -> dict:
    from specdec.bench import synthetic
    from specdec.bench.report import git_commit
    from specdec.cuda_graph import default_batch_sizes
    from specdec.engine.engine import Engine

    convs = conversations(settings, synthetic.SHAPES[settings.synthetic]["vocab_size"])
    context = settings.first_turn_len + (settings.turns - 1) * settings.turn_len + \
        settings.turns * settings.max_new_tokens + 64
    spec = settings.config != "none"
    sweep = synthetic.SyntheticSettings(synthetic=settings.synthetic, configs=settings.config if spec else "3,1,4",
                                        skip_adaptive=True, seed=settings.seed)
    config = synthetic.parse_configs(settings.config)[0] if spec else None
    batch_sizes = default_batch_sizes(settings.concurrency)
    out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": git_commit(),
           "settings": dataclasses.asdict(settings), "device": engine_args.device,
           "attention_backend": engine_args.attention_backend}
    with tempfile.TemporaryDirectory(prefix="specdec-multi-turn-") as tmp:
        checkpoint = synthetic.write_dummy_checkpoint(settings.synthetic, Path(tmp))
        base = synthetic._engine_args(sweep, engine_args, config, batch_sizes, context, checkpoint)
        for name, disable in (("cache_off", True), ("cache_on", False)):
            # NOTE: both engines draw the same weights (the same seed)
            engine = Engine(args=dataclasses.replace(base, disable_radix_cache=disable))
            try:
                run_workload(engine, convs[:1], max_new_tokens=4, concurrency=1)  # warm-up
                engine.flush_cache()
                out["kv_bytes_per_token"] = engine.kv_bytes_per_token
                out[name] = run_workload(engine, convs, max_new_tokens=settings.max_new_tokens,
                                         concurrency=settings.concurrency)
            finally:
                engine.shutdown()
            print(format_line(name, out[name]), flush=True)
            del engine
            gc.collect()  # NOTE: free the first engine's weights and KV cache before the second draws its own
    return out


def format_line(name: str, s: dict) -> str:
    ttft = s["ttft_ms"] or {"p50": float("nan"), "p99": float("nan")}
    return (f"{name}: prefill {s['prefill_tokens']} tokens, saved {s['cached_tokens']}/{s['prompt_tokens']} "
            f"({100 * s['prefill_saved_fraction']:.1f}%), TTFT p50 {ttft['p50']:.1f} ms p99 {ttft['p99']:.1f} ms, "
            f"{s['throughput_tok_s']:.1f} token/s")


def write_report(res: dict, settings: MultiTurnSyntheticSettings) -> None:
    kv = res["kv_bytes_per_token"]
    print(f"KV bytes per token: target {kv['target']}, draft {kv['draft']}, total {kv['total']}")
    Path(settings.output).write_text(json.dumps(res, indent=2))
    print(f"Wrote {settings.output}")
