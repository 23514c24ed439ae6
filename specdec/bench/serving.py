"""The online throughput benchmark: a workload of streamed ``/generate`` requests against a server.

    specdec bench-serving --base-url http://127.0.0.1:30000 --dataset mt_bench --num-prompts 64 \\
        --concurrency 8 [--request-rate 4] [--baseline-url http://127.0.0.1:30001]
    specdec bench-serving --multi-turn --num-prompts 32 --concurrency 4 \\
        --baseline-url http://127.0.0.1:30001     (a server started with --disable-radix-cache)

``--multi-turn``: conversations instead of single prompts (``specdec.bench.multi_turn``): MT-bench's
two turns or ShareGPT-style JSON, each turn sent with the whole history, reporting the prefill
tokens the prefix cache saved, TTFT p50 / p99 and throughput of the server and the baseline.

Prints ``Throughput: X token/s``, ``Acceptance length: Y``, ``Speedup: Z`` (with ``--baseline-url``:
the same model served without speculation, given the same workload first), request throughput and
TTFT / TPOT / ITL statistics, then writes JSON. Requests arrive as a Poisson process of
``--request-rate`` per second (inf: all at once), at most ``--concurrency`` in flight.

TTFT, ITL, TPOT, latency and acceptance length are defined, per request, in ``serving_client``
(which sends the requests). An OpenAI stream carries no verify steps: with ``--backend openai`` the
acceptance length is read from the server's Prometheus ``/metrics`` before and after the run
(``spec_counters``: vLLM's and specdec's counter names), so it counts every request the server
verified meanwhile, this benchmark's or not.

A failed request (HTTP 4xx/5xx, an error chunk, a timeout, a broken connection) is counted by
reason and reported; it never stops the benchmark, and only successful requests enter the numbers.
Every request is bounded by ``--timeout`` and every loop by the number of prompts.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import json
import math
import random
import sys
from pathlib import Path

import httpx

from specdec.bench import multi_turn
from specdec.bench.report import format_histogram, git_commit, plot_histogram
from specdec.bench.serving_client import BACKENDS, Prompt, arrival_gaps, run_workload, summarize
from specdec.engine.args import flag
from specdec.engine.embedded import DATASETS, load_prompts


# ------------------------------------------------------------------ the benchmark
SERVER, WORKLOAD, OUTPUT = "server", "workload", "output"

# Prometheus counters of verify steps (one per request per step) and of the draft tokens they
# accepted, by server: committed tokens per verify step = 1 + accepted / steps
SPEC_COUNTERS = (
    ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens"),
    ("specdec:spec_verify_steps", "specdec:spec_accepted_tokens"),  # summed over the draft depths
)
# an engine step slower than this is counted apart (a bucket bound of specdec's step-time histogram)
SLOW_STEP_S = 0.05


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServingSettings:
    """``specdec bench-serving``'s settings: the server(s), the workload, the output."""

    base_url: str | None = dataclasses.field(default=None, metadata=flag(
        "the server to measure (default: http://HOST:PORT)", group=SERVER))
    host: str = dataclasses.field(default="127.0.0.1", metadata=flag("server host", group=SERVER))
    port: int = dataclasses.field(default=30000, metadata=flag("server port", group=SERVER))
    backend: str = dataclasses.field(default="sglang", metadata=flag(
        "the API: sglang (/generate, acceptance lengths included; specdec and SGLang serve it) or openai "
        "(/v1/completions, any OpenAI-compatible server such as vllm serve)", group=SERVER, choices=list(BACKENDS)))
    baseline_url: str | None = dataclasses.field(default=None, metadata=flag(
        "the same model served without speculation: given the same workload first, for Speedup", group=SERVER))
    timeout: float = dataclasses.field(default=600.0, metadata=flag(
        "seconds per request (default: 600)", group=SERVER))
    dataset: str | None = dataclasses.field(default=None, metadata=flag(
        f"prompt set: {', '.join(DATASETS)}, or random (token ids from the server's vocabulary; needs no "
        "tokenizer). Default: random when the server has no tokenizer, tinystories for the embedded model, "
        "mt_bench otherwise", group=WORKLOAD))
    num_prompts: int = dataclasses.field(default=16, metadata=flag(
        "requests (a prompt set repeats when shorter)", group=WORKLOAD))
    max_new_tokens: int = dataclasses.field(default=64, metadata=flag("new tokens per request", group=WORKLOAD))
    temperature: float = dataclasses.field(default=0.0, metadata=flag("sampling temperature", group=WORKLOAD))
    random_input_len: int = dataclasses.field(default=128, metadata=flag(
        "--dataset random: prompt tokens", group=WORKLOAD))
    random_output_len: int | None = dataclasses.field(default=None, metadata=flag(
        "--dataset random: new tokens per request (default: --max-new-tokens)", group=WORKLOAD))
    random_range_ratio: float = dataclasses.field(default=1.0, metadata=flag(
        "--dataset random: lengths are drawn uniformly from [ratio * len, len]", group=WORKLOAD))
    concurrency: int | None = dataclasses.field(default=None, metadata=flag(
        "most requests in flight (default: no limit)", group=WORKLOAD))
    request_rate: float = dataclasses.field(default=math.inf, metadata=flag(
        "requests per second, Poisson arrivals (default: inf, all at once)", group=WORKLOAD))
    seed: int = dataclasses.field(default=0, metadata=flag("random prompts and arrival times", group=WORKLOAD))
    multi_turn: bool = dataclasses.field(default=False, metadata=flag(
        "send conversations turn by turn with their history (--num-prompts conversations; compare a prefix-cache "
        "server with a --disable-radix-cache one given as --baseline-url)", group=WORKLOAD))
    multi_turn_dataset: str = dataclasses.field(default="mt_bench", metadata=flag(
        "--multi-turn: mt_bench (two turns each) or a ShareGPT-style JSON file", group=WORKLOAD))
    output: str = dataclasses.field(default="bench_serving.json", metadata=flag("JSON results file", group=OUTPUT))
    plot: str | None = dataclasses.field(default=None, metadata=flag(
        "also write the acceptance histogram as a PNG (needs matplotlib)", group=OUTPUT, metavar="PATH"))
    disable_tqdm: bool = dataclasses.field(default=False, metadata=flag("no progress bar", group=OUTPUT))
    profile: bool = dataclasses.field(default=False, metadata=flag(
        "profile the server's steps over the timed run: /start_profile after the warm-up request, /stop_profile "
        "after the last (SGLang's and vLLM's routes; the server writes the files)", group=OUTPUT))
    profile_activities: str | None = dataclasses.field(default=None, metadata=flag(
        "--profile: comma-separated, of CPU, GPU, MEM and (specdec) HOST: the engine loop's Python functions. "
        "Default: the server's (CPU and GPU)", group=OUTPUT))
    profile_dir: str | None = dataclasses.field(default=None, metadata=flag(
        "--profile: the folder, on the server's machine (default: the server's)", group=OUTPUT))


def _check(args: ServingSettings) -> None:
    for name in ("num_prompts", "max_new_tokens", "random_input_len", "random_output_len", "concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not 0 < args.random_range_ratio <= 1:
        raise ValueError(f"--random-range-ratio must be in (0, 1], got {args.random_range_ratio}")
    if not args.request_rate > 0 or not args.timeout > 0:
        raise ValueError("--request-rate and --timeout must be > 0")
    if args.backend == "openai" and (args.multi_turn or args.dataset == "random"):
        raise ValueError("--backend openai: --multi-turn and --dataset random need /generate and /get_model_info "
                         "(--backend sglang)")
    if (args.profile_activities or args.profile_dir) and not args.profile:
        raise ValueError("--profile-activities and --profile-dir need --profile")
    if args.profile and args.multi_turn:
        raise ValueError("--profile: not with --multi-turn")
    if args.dataset not in (None, "random", *DATASETS):
        raise ValueError(f"--dataset: unknown dataset {args.dataset!r}; choose random or one of {', '.join(DATASETS)}")


def model_info(base_url: str, timeout: float, backend: str = "sglang") -> dict:
    """SGLang's ``/get_model_info``; from an OpenAI server, the first model ``/v1/models`` lists."""
    route = "/v1/models" if backend == "openai" else "/get_model_info"
    try:
        r = httpx.get(f"{base_url}{route}", timeout=min(timeout, 30.0))
        r.raise_for_status()
        info = r.json()
    except (httpx.HTTPError, ValueError) as e:
        raise SystemExit(f"cannot read {base_url}{route} (is the server up?): {e}") from None
    if backend != "openai":
        return info
    models = info.get("data") or []
    if not models:
        raise SystemExit(f"{base_url}/v1/models lists no model")
    return {"model_path": models[0]["id"], "served_model": models[0]["id"], "has_tokenizer": True}


def read_metrics(base_url: str, timeout: float) -> dict[str, float] | None:
    """The server's ``/metrics``, each sample summed over its labels, and kept apart too by a histogram
    bucket's ``le`` (``name{le=0.05}``, never summed) and by a speculative shape (``name{shape=3x1x4}``);
    None without ``/metrics`` (or without prometheus_client, the serve extra's)."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return None
    try:
        response = httpx.get(f"{base_url}/metrics", timeout=timeout)
        response.raise_for_status()
        families = list(text_string_to_metric_families(response.text))
    except (httpx.HTTPError, ValueError):
        return None
    totals: collections.Counter[str] = collections.Counter()
    for sample in (s for family in families for s in family.samples):
        le, shape = sample.labels.get("le"), sample.labels.get("shape")
        totals[sample.name if le is None else f"{sample.name}{{le={float(le):g}}}"] += sample.value
        if shape is not None:
            totals[f"{sample.name}{{shape={shape}}}"] += sample.value
    return dict(totals)


def spec_counters(metrics: dict[str, float] | None) -> tuple[float, float] | None:
    """(verify steps, accepted draft tokens) in a ``read_metrics`` reading; None where the server
    exposes neither vLLM's nor specdec's counters."""
    for steps, accepted in SPEC_COUNTERS:
        if metrics and f"{steps}_total" in metrics:
            return metrics[f"{steps}_total"], metrics.get(f"{accepted}_total", 0.0)
    return None


def _acceptance_from_metrics(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    """Committed tokens per verify step between two ``spec_counters`` readings (None: none verified)."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return 1.0 + (after[1] - before[1]) / (after[0] - before[0])


def engine_steps(before: dict[str, float] | None, after: dict[str, float] | None) -> dict | None:
    """A specdec server's engine steps between two ``read_metrics`` readings: how many, their mean wall
    time, the prefill steps among them (and the prompt tokens they computed) and the mean of each kind,
    how many took longer than SLOW_STEP_S, the Triton kernels built meanwhile (each stalled its step;
    ``specdec.kernels.jit_watch``), and a speculative server's decode steps by shape (adaptive
    speculation's choices; "plain": no draft tree). None for other servers."""
    name = "specdec:step_time_seconds"
    if not before or not after or f"{name}_count" not in after:
        return None

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    steps, prefills = delta(f"{name}_count"), delta("specdec:prefill_steps_total")
    decode_seconds = delta(f"{name}_sum") - delta("specdec:prefill_step_seconds_total")
    return {"steps": int(steps), "mean_ms": 1e3 * delta(f"{name}_sum") / steps if steps else None,
            "prefill_steps": int(prefills),
            "prefill_mean_ms": 1e3 * delta("specdec:prefill_step_seconds_total") / prefills if prefills else None,
            "prefill_tokens": int(delta("specdec:prefill_tokens_total")),
            "decode_mean_ms": 1e3 * decode_seconds / (steps - prefills) if steps > prefills else None,
            "slow_steps": int(steps - delta(f"{name}_bucket{{le={SLOW_STEP_S:g}}}")),
            "kernel_builds": int(delta("specdec:kernel_builds_total")),
            "kernel_build_ms": 1e3 * delta("specdec:kernel_build_seconds_total"),
            "shapes": _shape_steps(before, after)}


def _shape_steps(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Decode steps by speculative shape between two readings, most first (those that ran)."""
    prefix = "specdec:spec_shape_steps_total{shape="
    steps = {key[len(prefix):-1]: int(after[key] - before.get(key, 0.0)) for key in after if key.startswith(prefix)}
    return dict(sorted(((shape, n) for shape, n in steps.items() if n), key=lambda kv: -kv[1]))


def _profile_call(url: str, route: str, body: dict | None, timeout: float) -> str:
    """POST the server's /start_profile or /stop_profile; its answer's text (SystemExit: refused)."""
    try:
        r = httpx.post(f"{url}{route}", json=body, timeout=timeout)
    except httpx.HTTPError as e:
        raise SystemExit(f"--profile: {url}{route}: {e}") from None
    if r.status_code != 200:
        raise SystemExit(f"--profile: {url}{route} answered {r.status_code}: {r.text.strip()}")
    return r.text


def _measure(url: str, prompts: list[Prompt], *, desc: str, model: str | None, profile: dict | None = None,
             **run) -> dict:
    """One workload against one server: ``summarize``'s figures; from the server's ``/metrics``, the
    engine's steps and, over the OpenAI API, the acceptance length. ``profile``: /start_profile's body,
    sent after the warm-up request (the answer of /stop_profile, after the run, is ``res["profile"]``)."""
    before = []  # read after the warm-up request

    def read_before() -> None:
        before.append(read_metrics(url, run["timeout"]))
        if profile is not None:
            _profile_call(url, "/start_profile", profile, run["timeout"])

    res = summarize(*asyncio.run(run_workload(url, prompts, desc=desc, model=model, on_start=read_before, **run)))
    if profile is not None:
        res["profile"] = _profile_call(url, "/stop_profile", None, run["timeout"]).strip()
    after = read_metrics(url, run["timeout"])
    if run["backend"] == "openai":
        res["acceptance_length"] = _acceptance_from_metrics(spec_counters(before[0]), spec_counters(after))
        res["acceptance_source"] = "/metrics" if res["acceptance_length"] is not None else None
    res["engine_steps"] = engine_steps(before[0], after)
    return res


def build_prompts(args: ServingSettings, info: dict) -> tuple[str, list[Prompt]]:
    """The dataset's name and its prompts; ``random`` draws token ids from the server's vocabulary."""
    dataset = args.dataset
    if dataset is None:
        embedded = str(info.get("model_path") or "").endswith("stories260K.bin")
        dataset = "random" if not info.get("has_tokenizer", True) else "tinystories" if embedded else "mt_bench"
    if dataset == "random":
        if not isinstance(info.get("vocab_size"), int):
            raise ValueError("--dataset random needs the vocab_size that /get_model_info reports")
        rng = random.Random(args.seed)
        out_len = args.random_output_len or args.max_new_tokens

        def draw(n: int) -> int:
            return rng.randint(max(1, int(n * args.random_range_ratio)), n)

        return dataset, [Prompt(input_ids=tuple(rng.randrange(info["vocab_size"])
                                                for _ in range(draw(args.random_input_len))),
                                max_new_tokens=draw(out_len)) for _ in range(args.num_prompts)]
    if not info.get("has_tokenizer", True):
        raise ValueError(f"--dataset {dataset} sends text, but the server has no tokenizer: use --dataset random")
    texts = load_prompts(dataset, args.num_prompts)
    return dataset, [Prompt(text=texts[i % len(texts)], max_new_tokens=args.max_new_tokens)
                     for i in range(args.num_prompts)]


def run_multi_turn(args: ServingSettings) -> dict:
    """``--multi-turn``: the baseline server first (if any), then the server, on the same conversations."""
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    convs = multi_turn.load_conversations(args.multi_turn_dataset, args.num_prompts)
    gaps = arrival_gaps(len(convs), args.request_rate, args.seed)
    run = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, concurrency=args.concurrency,
               gaps=gaps, timeout=args.timeout, progress=not args.disable_tqdm)
    servers = {"baseline": args.baseline_url.rstrip("/")} if args.baseline_url else {}
    servers["server"] = base_url
    out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": git_commit(),
           "mode": "multi-turn", "dataset": args.multi_turn_dataset, "num_conversations": len(convs),
           "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
           "concurrency": args.concurrency,
           "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf", "seed": args.seed}
    for name, url in servers.items():
        info = model_info(url, args.timeout)
        results, seconds = asyncio.run(multi_turn.run_conversations(url, convs, desc=name, **run))
        out[name] = {"url": url, "info": info, **multi_turn.summarize_turns(results, seconds)}
    return out


def print_multi_turn(res: dict) -> None:
    print(f"Workload: {res['dataset']} multi-turn, {res['num_conversations']} conversations, "
          f"{res['max_new_tokens']} new tokens per turn, concurrency {res['concurrency'] or 'unlimited'}")
    for name in ("baseline", "server"):
        if name in res:
            cache = "off" if res[name]["info"].get("disable_radix_cache") else "on"
            for line in multi_turn.format_summary(f"{name} ({res[name]['url']}, prefix cache {cache})", res[name]):
                print(line)
    if "baseline" in res and res["baseline"]["throughput_tok_s"] > 0:
        print(f"Throughput ratio (server / baseline): "
              f"{res['server']['throughput_tok_s'] / res['baseline']['throughput_tok_s']:.2f}")


def run_benchmark(args: ServingSettings) -> dict:
    _check(args)
    if args.multi_turn:
        return run_multi_turn(args)
    base_url = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    baseline_url = args.baseline_url.rstrip("/") if args.baseline_url else None
    info = model_info(base_url, args.timeout, args.backend)
    dataset, prompts = build_prompts(args, info)
    run = dict(temperature=args.temperature, concurrency=args.concurrency, request_rate=args.request_rate,
               seed=args.seed, timeout=args.timeout, progress=not args.disable_tqdm, backend=args.backend)
    baseline = baseline_info = None
    if baseline_url:
        baseline_info = model_info(baseline_url, args.timeout, args.backend)
        if baseline_info.get("speculative_algorithm"):
            print(f"Warning: the baseline server speculates too ({baseline_info['speculative_algorithm']})",
                  file=sys.stderr)
        if baseline_info.get("vocab_size") != info.get("vocab_size"):
            print("Warning: the baseline server's vocabulary differs from the server's", file=sys.stderr)
        baseline = _measure(baseline_url, prompts, desc="baseline", model=baseline_info.get("served_model"), **run)
    profile = None
    if args.profile:
        profile = {"output_dir": args.profile_dir} if args.profile_dir else {}
        if args.profile_activities:
            profile["activities"] = [a.strip() for a in args.profile_activities.split(",") if a.strip()]
    spec = _measure(base_url, prompts, desc="server", model=info.get("served_model"), profile=profile, **run)
    speedup = None
    if baseline and baseline["throughput_tok_s"] > 0:
        speedup = spec["throughput_tok_s"] / baseline["throughput_tok_s"]
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "base_url": base_url,
        "backend": args.backend,
        "baseline_url": baseline_url,
        "server": info,
        "baseline_server": baseline_info,
        "dataset": dataset,
        "num_prompts": len(prompts),
        "max_new_tokens": [p.max_new_tokens for p in prompts] if dataset == "random" else args.max_new_tokens,
        "input_lens": [len(p.input_ids) for p in prompts] if dataset == "random" else None,
        "temperature": args.temperature,
        "concurrency": args.concurrency,
        "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
        "seed": args.seed,
        "timeout_s": args.timeout,
        "baseline": baseline,
        "speculative": spec,
        "speedup": speedup,
    }


def _table(rows: dict[str, dict | None]) -> list[str]:
    lines = ["| ms | mean | median | p90 | p99 |", "|---|---:|---:|---:|---:|"]
    for name, s in rows.items():
        cells = [f"{s[k]:.2f}" for k in ("mean", "median", "p90", "p99")] if s else ["n/a"] * 4
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return lines


def _span(values: int | list[int]) -> str:
    if isinstance(values, int):
        return str(values)
    return str(min(values)) if min(values) == max(values) else f"{min(values)}-{max(values)}"


def print_report(res: dict) -> None:
    info, spec, base = res["server"], res["speculative"], res["baseline"]
    print(f"Server: {res['base_url']} ({info.get('served_model_name')}, speculative: "
          f"{info.get('speculative_algorithm') or 'none'})" + (f"  baseline: {res['baseline_url']}" if base else ""))
    shape = f"input {_span(res['input_lens'])} tokens, " if res["input_lens"] else ""
    rate = "inf (all at once)" if res["request_rate"] == "inf" else f"{res['request_rate']}/s (Poisson)"
    print(f"Workload: {res['dataset']} ({res['num_prompts']} prompts, {shape}{_span(res['max_new_tokens'])} new "
          f"tokens, temperature {res['temperature']}), concurrency {res['concurrency'] or 'unlimited'}, "
          f"request rate {rate}")
    for name, r in (("Baseline", base), ("Server", spec)):
        if r and r["failed"]:
            failures = ", ".join(f"{k}: {v}" for k, v in r["failures"].items())
            print(f"{name} failed requests: {r['failed']}/{res['num_prompts']} ({failures}); first: {r['first_error']}")
    print(f"Successful requests: {spec['completed']}/{res['num_prompts']}")
    print(f"Benchmark duration: {spec['seconds']:.2f} s")
    if base:
        print(f"Baseline throughput: {base['throughput_tok_s']:.1f} token/s")
    print(f"Throughput: {spec['throughput_tok_s']:.1f} token/s")
    print(f"Request throughput: {spec['request_throughput_req_s']:.2f} req/s")
    accept = spec["acceptance_length"]
    source = " (the server's /metrics over the run)" if spec.get("acceptance_source") else ""
    print(f"Acceptance length: {accept:.2f}{source}" if accept is not None else
          "Acceptance length: n/a (no verify steps: the server does not speculate, or nothing succeeded)")
    steps = spec.get("engine_steps")
    if steps and steps["steps"]:
        kinds = ", ".join(f"{n} {kind} x {ms:.2f} ms{extra}" for kind, n, ms, extra in (
            ("prefill", steps["prefill_steps"], steps["prefill_mean_ms"], f" ({steps['prefill_tokens']} prompt tokens)"),
            ("decode", steps["steps"] - steps["prefill_steps"], steps["decode_mean_ms"],
             f" ({', '.join(f'{shape} {n}' for shape, n in steps['shapes'].items())})" if steps["shapes"] else ""))
            if n)
        print(f"Engine steps: {steps['steps']} ({kinds}; {steps['slow_steps']} over {1e3 * SLOW_STEP_S:.0f} ms); "
              f"Triton kernels built while serving: {steps['kernel_builds']}"
              + (f" ({steps['kernel_build_ms']:.0f} ms)" if steps["kernel_builds"] else ""))
    if spec.get("profile"):
        print(f"Profile: {spec['profile']}")
    if res["speedup"] is not None:
        print(f"Speedup: {res['speedup']:.2f}")
    else:
        print("Speedup needs --baseline-url (the same model served without speculation)" if not base else
              "Speedup: n/a (no baseline request succeeded)")
    rows = {"TTFT": spec["ttft_ms"], "TPOT": spec["tpot_ms"], "ITL": spec["itl_ms"], "Latency": spec["latency_ms"]}
    if base:
        rows.update({"TTFT (baseline)": base["ttft_ms"], "TPOT (baseline)": base["tpot_ms"],
                     "ITL (baseline)": base["itl_ms"]})
    for line in _table(rows):
        print(line)
    if spec["acceptance_histogram"]:
        print("Acceptance histogram (tokens committed per verify step):")
        for row in format_histogram(spec["acceptance_histogram"]):
            print(row)


def write_report(res: dict, settings: ServingSettings) -> None:
    """Print the report, write the JSON (and, with ``--plot``, the histogram PNG)."""
    if res.get("mode") == "multi-turn":
        print_multi_turn(res)
        Path(settings.output).write_text(json.dumps(res, indent=2))
        print(f"Wrote {settings.output}")
        return
    print_report(res)
    Path(settings.output).write_text(json.dumps(res, indent=2))
    print(f"Wrote {settings.output}")
    if settings.plot:
        info = res["server"]
        plot_histogram(res["speculative"]["acceptance_histogram"], settings.plot,
                       title=f"{Path(str(info.get('served_model_name'))).name} ({info.get('speculative_algorithm')}), "
                             f"{res['dataset']}, concurrency {res['concurrency'] or 'unlimited'}")
