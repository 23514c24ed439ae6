"""Full-size decode cost without published weights: ``specdec bench --synthetic llama-3.1-8b``.

A target of a real model's shape with random bf16 weights (``--load-format dummy`` over a written
``config.json``; with ``--tp-size N`` each rank draws its own shard), an EAGLE-3-shaped head (one
layer, 32000-token draft vocabulary), and a simulated acceptance: every decode step drafts, builds the
tree and verifies it in full, then commits the path an acceptance model picks. By default that
model is a real head's recorded behaviour (``--acceptance-model replay``: the SmolLM2 EAGLE-3 head's
draft trees and its target's path through them at every verify step on MT-bench, shipped in
``specdec/data/acceptance``; ``specdec.eagle.replay``): each step's tree follows a recorded row's
draft probabilities, deep where the draft was sure and wide where it was not, and accepts along
that row's path, so that chains and trees compare as they would with real weights. ``hazards``
draws from that head's static hazards by depth, parent rank and rank instead
(``specdec.eagle.simulate``). Either way the draws are common random numbers: every policy sees
the same draw at the same request row and token position.
``--acceptance-model none`` commits 1 + Binomial(S, (TAU - 1) / S) tokens along the first path
instead (``--speculative-simulate-accept-length``).

For each batch size, for plain decoding, each fixed (steps, topk, draft tokens) and adaptive
speculation (a shape per step, bounded by the largest configured one): admit ``bs`` requests of
``--context-len`` random tokens (one prefill), warm up, then time the decode steps that commit
``--decode-steps`` tokens per request: plain decoding's ``--decode-steps`` steps, a speculative
policy's fewer, so that every policy is timed over the same contexts (timed over the same number
of steps, a speculative policy would attend over longer ones: 3x2x4 at bs 64 grows each context
2.4 tokens a step). Per-phase GPU times come from CUDA events, no syncs in between. The report
gives tok/s, ms per step and per phase (draft, verify, commit, draft extend, other = host time and
gaps), rank 0's host time a speculative step (its wait for the step's read, and the rest: its own
work; a host that hardly waits bounds the step, and the device idles as "other"), the speedup over
plain decoding at the same batch size, the shapes adaptive speculation chose, and the plain step's
share of the weight-bandwidth floor (one rank's weight bytes / measured device copy bandwidth).
``--profile-device`` adds, at the smallest and largest batch size, the kernels by GPU time and the
share of a step spent in collectives (NCCL's kernels and the one-shot all-reduce's).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import gc
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from specdec.bench.synthetic_report import ADAPTIVE, acceptance_record, add_ratios, shapes_run, sweep_rows
from specdec.bench.synthetic_settings import (  # re-exported: the cli and scripts import these from here
    ENGINE_FLAGS,
    SHAPES,
    SyntheticSettings,
    parse_configs,
    write_dummy_checkpoint,
)
from specdec.engine.args import EngineArgs

PREFILL_TOKENS = 32768
# kernel names that count as collectives in --profile-device: NCCL's, and torch's one-shot all-reduce
# over symmetric memory (one_shot_all_reduce_kernel), the custom all-reduce's
COLLECTIVE_KERNELS = ("nccl", "all_reduce")


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ----------------------------------------------------------------------------- one point
def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def window_tokens(settings: SyntheticSettings, per_step: int) -> int:
    """A bound on the tokens one request commits in a point's timed steps: they stop once the batch
    has committed ``decode_steps`` tokens a request, and a request commits twice that only far in
    the tail of its acceptance (it would then finish, and the batch shrink, before the end)."""
    return 2 * settings.decode_steps + per_step


def measure(engine, bs: int, settings: SyntheticSettings, vocab: int, *, around_timed=contextlib.nullcontext) -> dict:
    """Prefill ``bs`` requests, then time decode steps; returns the point's figures.
    ``around_timed()``: a context manager entered around the timed steps only (a profiler)."""
    import torch

    from specdec.eagle.timing import PhaseTimer
    from specdec.engine.admission import decode_steps_during_prefill
    from specdec.engine.gc_heap import GCPauses
    from specdec.engine.sampling import SamplingParams
    from specdec.kernels.jit_watch import JitWatch

    gen = torch.Generator().manual_seed(settings.seed + bs)
    spec = engine.worker is not None
    per_step = (engine.spec_config.num_steps + 1) if spec else 1
    group = max(1, PREFILL_TOKENS // settings.context_len)  # prefill activations of at most this many tokens
    # the first groups decode while the later ones prefill: a step per later group more, and
    # NOTE: requests prefilled first also decode between the chunks of the others' prompts
    interleaved = decode_steps_during_prefill(bs * settings.context_len, engine.args.prefill_chunk_tokens)
    before_window = (settings.warmup_steps + 2 + math.ceil(bs / group) + interleaved) * per_step
    max_new = before_window + window_tokens(settings, per_step)
    params = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True})
    reqs = []
    for i in range(bs):
        prompt = torch.randint(3, vocab, (settings.context_len,), generator=gen).tolist()
        req = engine.make_request(input_ids=prompt, sampling_params=params, rid=f"b{bs}-{i}")
        engine.add_request(req)
        reqs.append(req)
        if len(reqs) % group == 0 or len(reqs) == bs:
            while any(not r.output_ids for r in reqs):  # prefill this group (its first decode steps are untimed)
                engine.step()
    for _ in range(settings.warmup_steps):
        engine.step()
    device = engine.args.device
    timer = PhaseTimer(device)
    if spec:
        engine.worker.timer = timer
    before = sum(len(r.output_ids) for r in reqs)
    target = bs * settings.decode_steps  # tokens the timed steps commit, whatever the policy
    shapes_before = collections.Counter(engine.scheduler.spec_shape_steps) if spec else None
    steps = 0
    ends = []  # host clock as each timed step returns
    read_shapes = []  # the shape of the step each timed step read (speculative engines)
    with around_timed(), GCPauses() as gc_pauses, JitWatch() as built:
        _sync(device)
        t0 = time.perf_counter()
        # NOTE: each engine.step() reads one step; even speculation commits a token a step
        while steps < settings.decode_steps and sum(len(r.output_ids) for r in reqs) - before < target:
            engine.step()
            ends.append(time.perf_counter())
            if spec:
                read_shapes.append(engine.scheduler.decoder.last_shape)
            steps += 1
        _sync(device)
        elapsed = time.perf_counter() - t0
    produced = sum(len(r.output_ids) for r in reqs) - before
    phases = {k: v / steps for k, v in timer.summary().items()}
    read_wait = timer.host_summary().get("read_wait", 0.0) / steps
    shapes = dict(engine.scheduler.spec_shape_steps - shapes_before) if spec else None
    if spec:
        engine.worker.timer = None
    for r in reqs:
        engine.abort(r.rid)
    engine.scheduler.drain()  # the step launched past the aborts still holds their KV
    step_ms = elapsed * 1e3 / steps
    if phases:
        phases["other"] = step_ms - sum(phases.values())
    spread = step_spread(np.diff([t0] + ends) * 1e3, read_shapes or None)  # its rate without the pauses: report.add_steady
    point = {"batch_size": bs, "tokens_per_s": produced / elapsed, "step_ms": step_ms, "decode_steps": steps,
             "committed_per_request_step": produced / (bs * steps), "phases_ms": phases,
             "step_ms_spread": spread, "gc": gc_pauses.to_json(),
             "kernels_built": [{"kernel": name, "s": round(seconds, 4)} for name, seconds in built.builds]}
    if shapes is not None:
        point["shapes"] = shapes
    if spec:  # rank 0's host: its wait for each step's read, and the rest of the step (its own work)
        point["host_ms"] = {"read_wait": read_wait, "busy": step_ms - read_wait}
    return point


def _built_note(builds: list[dict]) -> str:
    """The Triton kernels a timed window built or loaded (a warm-up that missed them: each stalls its step)."""
    if not builds:
        return ""
    names = ", ".join(b["kernel"].split("(")[0].rsplit(".", 1)[-1] for b in builds[:4])
    return f"  BUILT {len(builds)} kernel(s) while timed, {sum(b['s'] for b in builds):.2f} s: {names}"


def step_spread(step_ms: np.ndarray, shapes: list[str | None] | None = None) -> dict:
    """How the host saw a point's steps ([steps] ms between consecutive step returns): quantiles, and
    the time steps took beyond twice the median (a stall spread over every step and one long pause
    look alike in the mean). On the H100's shared host, steps of 10-40 ms came at random in every
    engine, plain included, 0-5 a point (2026-11-27): one such step adds 0.1-0.4 ms to the mean of a
    point's ~100 steps. ``shapes`` (each step's read shape): the slow steps are listed with theirs
    (at tp 2 an adaptive point had 4 steps of ~175 ms more, once, 2026-11-29)."""
    median = float(np.median(step_ms))
    slow = np.flatnonzero(step_ms > 2 * median)
    over = step_ms[slow] - median
    out = {"p50": median, "p90": float(np.quantile(step_ms, 0.9)), "max": float(step_ms.max()),
           "slow_steps": int(over.size), "slow_excess_ms": float(over.sum())}
    if shapes is not None:
        out["slow"] = [{"step": int(i), "ms": round(float(step_ms[i]), 2), "shape": shapes[i]} for i in slow[:16]]
    return out


def profile_host(engine, bs: int, settings: SyntheticSettings, vocab: int, title: str) -> None:
    """Append the host's top functions (cumulative time) over one point's timed steps to --profile-host."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    original = engine.step

    def profiled_step():
        profiler.enable()
        try:
            return original()
        finally:
            profiler.disable()

    engine.step = profiled_step
    try:
        measure(engine, bs, settings, vocab)
    finally:
        engine.step = original
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    with open(settings.profile_host, "a") as f:
        f.write(f"==== {title} (every step of the point, prefill and warm-up included)\n{text.getvalue()}\n")


def profile_device(engine, bs: int, settings: SyntheticSettings, vocab: int, title: str) -> dict:
    """Append the kernels by GPU time over one point's timed decode steps to --profile-device; returns
    ms per step: the profiled step and its collectives (NCCL's all-reduce and all-gather kernels,
    the one-shot all-reduce's), with their share of the step."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    point = measure(engine, bs, settings, vocab, around_timed=lambda: prof)
    events = prof.key_averages()
    steps = point["decode_steps"]
    table = events.table(sort_by="self_device_time_total", row_limit=40)
    with open(settings.profile_device, "a") as f:
        f.write(f"==== {title}: {steps} timed decode steps (profiled: {point['step_ms']:.2f} ms/step), totals\n"
                f"{table}\n")
    if settings.profile_trace:  # NOTE: torch gzips a trace whose path ends in .gz
        trace = Path(settings.profile_trace) / f"{title.replace(' bs=', '_bs')}.json.gz"
        trace.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace))
    # NOTE: the kernel rows only: a CPU op's row repeats the time of the kernels it launched
    nccl_us = sum(e.self_device_time_total for e in events
                  if e.device_type == DeviceType.CUDA and any(k in e.key.lower() for k in COLLECTIVE_KERNELS))
    nccl_ms = nccl_us / 1e3 / steps
    return {"batch_size": bs, "step_ms": point["step_ms"], "collective_ms": nccl_ms,
            "collective_share": nccl_ms / point["step_ms"]}


# ----------------------------------------------------------------------------- the sweep
def _engine_args(settings: SyntheticSettings, engine_args: EngineArgs, config, batch_sizes, context,
                 checkpoint: tuple[str, str]) -> EngineArgs:
    """One point's engine: plain (config None), a fixed shape, or ADAPTIVE (bounded by the largest configs),
    over ``checkpoint`` = (target, head) directories of ``write_dummy_checkpoint``."""
    max_bs = max(batch_sizes)
    target, head = checkpoint
    # NOTE: new requests admitted at the first chance (no admission wait): ``measure`` adds a point's
    # requests group by group while the earlier ones decode, and its token budget counts one decode
    # step between prefill chunks, not the steps a group would wait among 100+ decoding requests
    args = dataclasses.replace(engine_args, model_path=target, load_format="dummy", max_running_requests=max_bs,
                               context_length=settings.server_context_length or context,
                               max_total_tokens=max_bs * (context + 64),
                               cuda_graph_bs=tuple(batch_sizes), random_seed=settings.seed,
                               waiting_served_ratio=0.0, max_waiting_tokens=0)
    if config is None:
        return args
    configs = parse_configs(settings.configs)
    steps, topk, ntok = config if config != ADAPTIVE else (max(c[i] for c in configs) for i in range(3))
    acceptance = settings.acceptance_path()
    return dataclasses.replace(
        args, speculative_algorithm="EAGLE3", speculative_draft_model_path=head, speculative_num_steps=steps,
        speculative_eagle_topk=topk, speculative_num_draft_tokens=ntok,
        speculative_adaptive="on" if config == ADAPTIVE else "off", speculative_simulate_acceptance_model=acceptance,
        speculative_simulate_accept_length=None if acceptance else min(settings.speculative_simulate_accept_length,
                                                                       steps + 1))


def run(settings: SyntheticSettings, engine_args: EngineArgs) -> dict:
    from specdec.bench.device_timing import copy_bandwidth
    from specdec.engine.admission import decode_steps_during_prefill

    configs = parse_configs(settings.configs)
    batch_sizes = settings.swept_batch_sizes()
    vocab = SHAPES[settings.synthetic]["vocab_size"]
    bandwidth = copy_bandwidth(engine_args.device)
    most_steps = max([c[0] + 1 for c in configs] + [1])
    groups = math.ceil(max(batch_sizes) / max(1, PREFILL_TOKENS // settings.context_len))
    groups += decode_steps_during_prefill(max(batch_sizes) * settings.context_len, engine_args.prefill_chunk_tokens)
    context = (settings.context_len + (settings.warmup_steps + 3 + groups) * most_steps
               + window_tokens(settings, most_steps) + 64)
    if settings.server_context_length is not None and settings.server_context_length < context:
        raise ValueError(f"--server-context-length {settings.server_context_length}: this run needs at least "
                         f"{context} (--context-len and the decode steps)")
    results: dict = {"plain": [], "speculative": {}}
    weights: dict[str, int] = {}
    policies = [None] + configs + ([] if settings.skip_adaptive else [ADAPTIVE])
    with tempfile.TemporaryDirectory(prefix="specdec-synthetic-") as tmp:
        checkpoint = write_dummy_checkpoint(settings.synthetic, Path(tmp))
        for config in policies:
            name = {None: "plain", ADAPTIVE: ADAPTIVE}.get(config) or "x".join(map(str, config))
            args = _engine_args(settings, engine_args, config, batch_sizes, context, checkpoint)
            _run_policy(name, args, settings, batch_sizes, vocab, results, weights)
    add_ratios(results, weights["target"], bandwidth)
    acceptance = settings.acceptance_path()
    results["setup"] = {
        "shape": settings.synthetic, "tp_size": engine_args.tp_size,
        "target_weight_bytes_per_rank": weights["target"], "head_weight_bytes": weights.get("head"),
        "copy_bandwidth_GBps": bandwidth / 1e9, "context_len": settings.context_len,
        "engine_context_length": settings.server_context_length or context, "decode_steps": settings.decode_steps,
        "acceptance_model": acceptance_record(acceptance, shapes_run(results)),
        "simulated_accept_length": None if acceptance else settings.speculative_simulate_accept_length,
        "configs": configs, "batch_sizes": batch_sizes,
        "cuda_graphs": not engine_args.disable_cuda_graph and engine_args.device.startswith("cuda"),
        "overlap_schedule": engine_args.overlap_schedule is not False,
        "attention_backend": engine_args.attention, "device": _device_name(engine_args.device),
        "draft_quantization": engine_args.speculative_draft_model_quantization,
        "draft_kv_cache_dtype": engine_args.speculative_draft_kv_cache_dtype,
        "all_reduce": results.pop("all_reduce", None),
        "disable_custom_all_reduce": engine_args.disable_custom_all_reduce,
        "draft_tp": engine_args.speculative_draft_tp,
        "date": datetime.date.today().isoformat(),
    }
    results["sweep"] = sweep_rows(results)
    return results


def _run_policy(name: str, args: EngineArgs, settings: SyntheticSettings, batch_sizes: list[int], vocab: int,
                results: dict, weights: dict[str, int]) -> None:
    """Build one policy's engine, measure every batch size (and profile, if asked), record it in ``results``."""
    import torch

    from specdec.engine.engine import Engine
    from specdec.engine.gc_heap import frozen_heap

    t0 = time.perf_counter()
    engine = Engine(args=args)  # loads the dummy weights, captures the CUDA graphs (and profiles the adaptive policy)
    build_s = time.perf_counter() - t0
    try:
        weights.setdefault("target", weight_bytes(engine.target_model))  # this rank's shard
        results.setdefault("all_reduce", engine.target_model.tp.all_reduce_name)  # what ran, not what was asked
        if engine.draft_model is not None:
            weights.setdefault("head", weight_bytes(engine.draft_model))
        profiled = settings.profiled_batch_sizes()
        with frozen_heap():  # as a server runs: the built engine kept out of the collector's passes
            points = [measure(engine, bs, settings, vocab) for bs in batch_sizes]
            if settings.profile_host:
                for bs in profiled:
                    profile_host(engine, bs, settings, vocab, f"{name} bs={bs}")
            if settings.profile_device:
                results.setdefault("device_profile", {})[name] = [
                    profile_device(engine, bs, settings, vocab, f"{name} bs={bs}") for bs in profiled]
        print(f"{name}: engine built in {build_s:.1f} s (CUDA graphs: {engine.cuda_graph_bytes / 2**20:.0f} MiB)",
              flush=True)
        for p in points:
            shapes = f"  shapes {p['shapes']}" if "shapes" in p else ""
            if "host_ms" in p:
                shapes += f"  host busy={p['host_ms']['busy']:.2f} read_wait={p['host_ms']['read_wait']:.2f}"
            spread = p["step_ms_spread"]
            print(f"  bs={p['batch_size']:3d}  {p['tokens_per_s']:9.1f} tok/s  {p['step_ms']:7.2f} ms/step  "
                  f"{' '.join(f'{k}={v:.2f}' for k, v in p['phases_ms'].items())}{shapes}  gc {p['gc']['collections']}  "
                  f"steps p50 {spread['p50']:.2f} max {spread['max']:.2f} slow {spread['slow_steps']}"
                  + "".join(f" [{s['step']}: {s['ms']:.0f} ms {s['shape']}]" for s in spread.get("slow", []))
                  + _built_note(p.get("kernels_built", [])), flush=True)
        if name == "plain":
            results["plain"] = points
        elif name == ADAPTIVE:
            results[ADAPTIVE] = points
            results["adaptive_policy"] = _policy_record(engine.worker.policy)
        else:
            results["speculative"][name] = points
    finally:
        engine.shutdown()
    del engine
    gc.collect()  # NOTE: the engine holds reference cycles; free its KV cache before the next one
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()


def _policy_record(policy) -> dict:
    """What the adaptive engine decided from: its step costs and its acceptance estimate at the end."""
    model = policy.stats.model()
    return {"step_costs": policy.costs.to_json(), "hazards": model.to_json()["hazards"],
            "expected_committed": {s.name: round(policy.expected_committed(s), 3) for s in policy.shapes},
            "static_expected_committed": {s.name: round(model.expected_committed(s.num_steps, s.topk,
                                                                                 s.num_draft_tokens), 3)
                                          for s in policy.shapes},
            "prior_calibration": {name: round(r, 4) for name, r in policy.prior_calibration.items()}}


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"
