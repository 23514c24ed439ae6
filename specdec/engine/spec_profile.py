"""Start-up step-cost profile for adaptive speculation, cached per device and model.

The policy (``specdec.eagle.policy``) needs milliseconds per decode step for plain decoding and for
every candidate tree shape, at every batch size it may see. They are measured here on the engine
itself — its graphs, its host overhead, its attention backend — by decoding dummy requests:

    for bs in the captured batch sizes, for plain and each shape captured there (``max_batch``):
        bs requests of BASE_CTX random tokens, prefilled (once for all the choices: the prefix
        cache keeps the same prompts between them), a few warm-up steps, then BLOCKS blocks of
        STEPS_PER_BLOCK timed steps: the median block's ms a step (a host stall, a GC pause,
        spoils one block);
        the same at LONG_CTX tokens (or as many as the KV cache holds for bs requests), for the
        slope: (ms at LONG_CTX - ms at BASE_CTX) / (bs * (LONG_CTX - BASE_CTX)), then each shape's
        slopes median-filtered over neighbouring batch sizes (one noisy pair of points made a
        slope 3-10x its neighbours', and at a 4 k context the policy then chose a 1-step chain at
        bs 64: 1.55x plain where the 3-step chain gives 1.91x, H100, 2026-11-26);
        where the KV cache and the context length hold FAR_CTX tokens a request, the same again
        at FAR_CTX for the slope past LONG_CTX (extrapolated from 1 k, the step of 6x8x32 at bs 8
        and 4 k came out 6 % short, and the policy chose it over 5x4x8, which was 9 % faster)

The result is written as JSON (``--speculative-adaptive-profile``, else a cache file keyed by the
device, the model shapes, the dtype, the backend, the page size, the shapes and the batch sizes),
and read instead of measured when the file exists.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from specdec.eagle.acceptance import AcceptanceModel
from specdec.eagle.adaptive import AUTO
from specdec.eagle.policy import PLAIN, AdaptivePolicy, SpecShape, StepCosts
from specdec.engine.admission import decode_steps_during_prefill

logger = logging.getLogger(__name__)

# bump when StepCosts' JSON, the measurement or our kernels' step times change: old cache files are then not read
# (4: median of timed blocks, median-filtered slopes; FP8 draft GEMMs, the tree verify's new split;
# 5: a shape measured only up to its largest captured batch size, verify GEMMs of 33-64 rows;
# 6: the slope past LONG_CTX, the draft's bookkeeping kernels, the merge of split partials;
# 7: the draft step's shared-prefix attention, streaming decode tiles, narrow new-token tiles,
#    8 steps a timed block; 8: past 64 requests only powers of two and each shape's last size measured;
# 9: a plain step's draft extend over its one token a request, not S + 1)
PROFILE_FORMAT = 9
BASE_CTX = 64
LONG_CTX = 1024
FAR_CTX = 4096
BLOCKS = 3
# timed steps a block: a block also pays one step's host launch and the last step's read, not
# overlapped (about 1.5 ms on the H100's host), which weighs most on the cheap shapes. With 3 steps
# a block it added about 0.5 ms to every step time (plain at bs 1: 6.37 ms against 5.91 in the
# sweep after it), with 8 about 0.2 (6.21 against 5.99; benchmarks/results/2026-11-26-h100-adaptive)
STEPS_PER_BLOCK = 8
# the acceptance prior before a head's own statistics: the SmolLM2-135M-Instruct EAGLE-3 head on
# MT-bench, measured on CPU (benchmarks/results/2026-11-24-h100-adaptive/acceptance_model.json)
PRIOR = Path(__file__).resolve().parents[1] / "data" / "acceptance" / "smollm2_eagle3_mt_bench.json"
# the same head's recorded trees and target paths (specdec.eagle.replay): the synthetic benchmark's replay
TRACE = PRIOR.with_name("smollm2_eagle3_mt_bench_trace.npz")


def start_adaptive_policy(engine, batch_sizes: list[int], *, profile_path: str | None = None) -> AdaptivePolicy:
    """Give ``engine``'s adaptive worker its policy: step costs read from the profile file when it
    exists, measured (and written) otherwise."""
    worker = engine.worker
    path = Path(profile_path or engine.args.speculative_adaptive_profile or _cache_path(engine, batch_sizes))
    # NOTE: under tensor parallelism every rank must pick the same shape each step, or their
    # collectives diverge: all ranks use rank 0's costs (its file, or its measurement), and learn
    # nothing from their own clocks; once serving, rank 0 chooses alone and learns (the engine's
    # relay_speculation_choices)
    tp = engine.target_model.tp
    saved = tp.broadcast_object(path.read_text() if tp.rank == 0 and path.is_file() else None)
    if saved is not None:
        costs = StepCosts.from_json(json.loads(saved))
        logger.info("adaptive speculation: step costs from %s", path)
    else:  # every rank takes part: the steps are collective
        measured = measure_step_costs(engine, profiled_batch_sizes(batch_sizes, worker.max_batch))
        costs = StepCosts.from_json(tp.broadcast_object(measured.to_json()))
        if tp.rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(costs.to_json(), indent=1))
            logger.info("adaptive speculation: step costs measured, written to %s", path)
    prior = _fit(_prior(), worker.config.num_steps, worker.config.topk)
    worker.policy = AdaptivePolicy(worker.shapes, costs, prior, max_batch=worker.max_batch,
                                   prior_calibration=prior_calibration(worker.shapes, prior),
                                   learn_step_times=tp.size == 1)
    return worker.policy


def profiled_batch_sizes(batch_sizes: list[int], max_batch: dict[str, int]) -> list[int]:
    """The batch sizes measured: every one up to 64, past it the powers of two and the largest, and
    each shape's largest (``max_batch``), so that no shape's cost is extrapolated inside its range.
    Between them ``StepCosts`` interpolates: past 64 a step's cost grows almost linearly with the
    batch, while each measured point prefills its batch at three contexts (256 requests of 4 k
    tokens are a million tokens)."""
    sizes = sorted(batch_sizes)
    keep = {bs for bs in sizes if bs <= 64 or bs & (bs - 1) == 0} | {sizes[-1]}
    keep |= {bs for bs in max_batch.values() if bs in batch_sizes}
    return sorted(keep)


def prior_calibration(shapes: list[SpecShape], prior: AcceptanceModel) -> dict[str, float]:
    """Each shape's committed tokens replayed from the shipped trace of the prior's head
    (``specdec.eagle.replay``) over the prior's static estimate: how much more the draft's own
    ranking commits (none for shapes past the trace's depth or width, or without the trace)."""
    out = {}
    for shape in shapes:
        replayed = _replayed_committed(shape)
        if replayed is not None:
            out[shape.name] = replayed / prior.expected_committed(shape.num_steps, shape.topk, shape.num_draft_tokens)
    return out


@functools.lru_cache(maxsize=64)
def _replayed_committed(shape: SpecShape) -> float | None:
    trace = _shipped_trace()
    if trace is None or shape.num_steps > trace.num_steps or shape.topk > trace.topk:
        return None
    return trace.expected_committed(shape.num_steps, shape.topk, shape.num_draft_tokens)


@functools.lru_cache(maxsize=1)
def _shipped_trace():
    """The shipped draft trace, or None (logged) where it is missing or unreadable: the policy then
    starts every shape at its static estimate."""
    from specdec.eagle.replay import DraftTrace

    try:
        return DraftTrace.load(TRACE)
    except (OSError, ValueError, KeyError) as e:
        logger.warning("adaptive speculation: no draft trace for the prior's calibration (%s): %s", TRACE, e)
        return None


def _prior() -> AcceptanceModel:
    """The shipped acceptance prior; a flat 0.5 hazard where the package data is missing."""
    if PRIOR.is_file():
        return AcceptanceModel.load(PRIOR)
    logger.warning("adaptive speculation: no acceptance prior at %s, starting from a flat 0.5", PRIOR)
    return AcceptanceModel.uniform(0.5, max_depth=8, max_topk=8)


def _fit(model: AcceptanceModel, depth: int, topk: int) -> AcceptanceModel:
    """The model cut or extended (repeating its last depth / rank) to [depth, parent ranks, topk]
    (a pooled model stays pooled)."""
    rows = np.minimum(np.arange(depth), model.max_depth - 1)
    parents = np.arange(min(topk, model.parent_ranks))
    cols = np.minimum(np.arange(topk), model.max_topk - 1)
    return AcceptanceModel(model.hazards[np.ix_(rows, parents, cols)])


def measure_step_costs(engine, batch_sizes: list[int], *, steps: int = STEPS_PER_BLOCK, warmup: int = 2,
                       base_ctx: int = BASE_CTX, long_ctx: int = LONG_CTX, far_ctx: int = FAR_CTX) -> StepCosts:
    """Milliseconds per decode step of every choice (plain and each shape) at each batch size, at
    ``base_ctx`` tokens of context, at ``long_ctx`` (or as many as the KV cache holds) and, where
    they fit, at ``far_ctx``; ``steps`` timed steps a block (fewer where the context length has no
    room for them beside ``base_ctx`` tokens of prompt), BLOCKS blocks a point."""
    worker = engine.worker
    choices = [(PLAIN, None)] + [(s.name, s) for s in worker.shapes]
    per_step = worker.config.num_steps + 1
    steps = timed_steps_that_fit(engine.context_length, per_step, steps=steps, warmup=warmup, prompt=base_ctx)
    if steps < 1:
        raise ValueError(f"adaptive speculation: context length {engine.context_length} leaves no room to profile "
                         f"step costs ({(warmup + BLOCKS + 2) * per_step} tokens of decoding at least); "
                         "raise --context-length")
    new_tokens = (warmup + BLOCKS * steps + 2) * per_step  # a choice's requests never finish
    room = engine.context_length - new_tokens
    table: dict[str, dict[int, float]] = {name: {} for name, _ in choices}
    slope: dict[str, dict[int, float]] = {name: {} for name, _ in choices}
    slope_far: dict[str, dict[int, float]] = {name: {} for name, _ in choices}
    base_ctx = min(base_ctx, room)
    try:
        for bs in sorted(batch_sizes):
            # KV positions each of bs requests can have (its tree and a page of rounding each side aside)
            fits = engine.memory.capacity // bs - new_tokens - engine.scheduler.tree_tokens - 2 * engine.memory.page_size
            if fits < base_ctx and table[PLAIN]:
                # NOTE: such a batch would run with requests waiting or retracted, not as bs at once, and
                # time something else; larger batches extrapolate from the ones measured (StepCosts)
                logger.info("adaptive speculation: profile stops at %d requests (the KV cache holds %d tokens)",
                            max(table[PLAIN]), engine.memory.capacity)
                break
            live = [(name, shape) for name, shape in choices if bs <= worker.max_batch.get(name, bs)]
            point = functools.partial(_time_choices, engine, live, bs, new_tokens=new_tokens, steps=steps,
                                      warmup=warmup)
            base = point(base_ctx)
            for name, ms in base.items():
                table[name][bs] = ms
            ctx = min(long_ctx, room, fits)
            if ctx < 2 * base_ctx:
                continue
            long = point(ctx)
            for name, ms in long.items():
                slope[name][bs] = max(ms - base[name], 0.0) / (bs * (ctx - base_ctx))
            if ctx == long_ctx and min(far_ctx, room, fits) == far_ctx > long_ctx:
                for name, ms in point(far_ctx).items():
                    slope_far[name][bs] = max(ms - long[name], 0.0) / (bs * (far_ctx - long_ctx))
    finally:
        worker.force = AUTO
        # NOTE: the dummy prompts are no use to anyone. Left cached (64 x 4 k tokens after the last
        # point), the first requests served evict them page by page: the H100 sweep's first point
        # (bs 1, ctx 4 k) had 0.39 ms a step of host time where the fixed shapes had 0.06
        engine.scheduler.flush_cache()
    smooth = {name: median_filter(by_bs) for name, by_bs in slope.items()}
    smooth_far = {name: median_filter(by_bs) for name, by_bs in slope_far.items() if by_bs}
    return StepCosts(table=table, slope=smooth, base_ctx=base_ctx, slope_far=smooth_far, long_ctx=long_ctx)


def timed_steps_that_fit(context_length: int, per_step: int, *, steps: int, warmup: int, prompt: int) -> int:
    """Timed steps a block, at most ``steps``, such that a request decoding ``per_step`` tokens a step
    through the warm-up, BLOCKS blocks and 2 more steps still fits the context length after a
    ``prompt``-token prompt, or failing that after 8 tokens (0: not even one step fits)."""
    def fit(prompt_tokens: int) -> int:
        return ((context_length - prompt_tokens) // per_step - warmup - 2) // BLOCKS

    beside_prompt = fit(prompt)
    return max(0, min(steps, beside_prompt if beside_prompt >= 1 else fit(8)))


def median_filter(by_bs: dict[int, float]) -> dict[int, float]:
    """Each value replaced by the median of itself and its neighbours in batch-size order (the
    first and last by the median of the three at their end); fewer than three values stay."""
    sizes = sorted(by_bs)
    if len(sizes) < 3:
        return dict(by_bs)
    out = {}
    for i, bs in enumerate(sizes):
        lo = min(max(i - 1, 0), len(sizes) - 3)
        out[bs] = float(np.median([by_bs[b] for b in sizes[lo:lo + 3]]))
    return out


def _time_choices(engine, choices: list, bs: int, ctx: int, *, new_tokens: int, steps: int,
                  warmup: int) -> dict[str, float]:
    """ms per decode step of each (name, shape) of ``choices`` at ``bs`` requests of ``ctx`` tokens.

    NOTE: every choice decodes the same prompts (seeded by bs and ctx), one choice after another, so
    the prefix cache keeps them and only the first choice prefills them (at 64 x 4 k tokens a point,
    prefill was most of the profile's time).
    """
    worker, out = engine.worker, {}
    for name, shape in choices:
        worker.force = shape
        out[name] = _time_steps(engine, bs, ctx, new_tokens, steps, warmup)
    return out


def _time_steps(engine, bs: int, ctx: int, new_tokens: int, steps: int, warmup: int) -> float:
    """ms per decode step for ``bs`` dummy requests of ``ctx`` random tokens (the worker's current
    ``force``): the median of BLOCKS blocks of ``steps`` timed steps."""
    device = engine.memory.req_to_token.device
    gen = torch.Generator().manual_seed(bs * 7919 + ctx)
    vocab = engine.target_model.config.vocab_size
    # NOTE: requests prefilled first decode between the chunks of the others' prompts
    interleaved = decode_steps_during_prefill(bs * ctx, engine.args.prefill_chunk_tokens)
    slack = interleaved * (engine.worker.config.num_steps + 1)
    params = {"max_new_tokens": min(new_tokens + slack, engine.context_length - ctx), "ignore_eos": True,
              "temperature": 0}
    reqs = []
    for i in range(bs):
        prompt = torch.randint(3, vocab, (ctx,), generator=gen).tolist()
        reqs.append(engine.make_request(input_ids=prompt, sampling_params=params, rid=f"profile-{bs}-{ctx}-{i}"))
        engine.add_request(reqs[-1])
    try:
        with engine.scheduler.admitting_at_once():
            while any(not r.output_ids for r in reqs):  # prefill
                engine.step()
        for _ in range(warmup):
            engine.step()
        blocks = []
        for _ in range(BLOCKS):
            _sync(device)
            start = time.perf_counter()
            for _ in range(steps):
                engine.step()
            _sync(device)
            blocks.append((time.perf_counter() - start) * 1e3 / steps)
        return float(np.median(blocks))
    finally:
        for r in reqs:
            engine.abort(r.rid)
        engine.scheduler.drain()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cache_path(engine, batch_sizes: list[int]) -> Path:
    worker = engine.worker
    target, draft = engine.target_model.config, engine.draft_model.config
    device = engine.memory.req_to_token.device
    key = json.dumps({
        "format": PROFILE_FORMAT,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "target": [target.hidden_size, target.num_hidden_layers, target.num_attention_heads,
                   target.num_key_value_heads, target.vocab_size, str(next(engine.target_model.parameters()).dtype)],
        "draft": [draft.hidden_size, draft.num_hidden_layers, engine.args.speculative_draft_model_quantization,
                  engine.args.speculative_draft_kv_cache_dtype],
        "backend": engine.args.attention, "page_size": engine.memory.page_size, "tp": engine.target_model.tp.size,
        "graphs": not engine.args.disable_cuda_graph, "overlap": engine.scheduler.overlap,
        "shapes": [s.name for s in worker.shapes], "batch_sizes": batch_sizes, "max_batch": worker.max_batch,
    }, sort_keys=True)
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "specdec" / "step_costs" / f"{digest}.json"
