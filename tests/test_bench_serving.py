"""``specdec bench-serving`` over real HTTP: a speculative and a plain server on tiny models.

Tiny models have no tokenizer, so the workload is ``--dataset random`` (token ids from the vocabulary
/get_model_info reports). Checked: every request succeeds with exactly max_new_tokens tokens, the
report lines and the JSON, TTFT <= latency, Speedup with --baseline-url; failures (400, timeouts, a
server that is not there) are counted or named, never a crash.
"""

import asyncio
import copy
import json
import socket

import pytest

from specdec.bench.serving import Prompt, run_workload, summarize
from specdec.cli.bench import bench_serving_main as main

from .e2e.helpers import engine, make_pair
from .server.live import LiveServer

SHAPE = (3, 2, 4)  # (num_steps, topk, num_draft_tokens)


@pytest.fixture(scope="module")
def servers():
    target, draft = make_pair("EAGLE", "mixed", seed=3)
    plain_target = copy.deepcopy(target)  # NOTE: one model object per engine thread
    with LiveServer(engine(target, draft, algorithm="EAGLE", shape=SHAPE)) as spec, \
            LiveServer(engine(plain_target)) as plain:
        yield spec, plain


def _bench(tmp_path, url: str, *flags: str) -> dict:
    output = tmp_path / "serving.json"
    main(["--base-url", url, "--dataset", "random", "--output", str(output), *flags])
    return json.loads(output.read_text())


def test_online_bench_with_baseline(servers, tmp_path, capsys):
    spec, plain = servers
    n, new = 8, 16
    res = _bench(tmp_path, spec.url, "--baseline-url", plain.url, "--num-prompts", str(n), "--max-new-tokens",
                 str(new), "--random-input-len", "12", "--concurrency", "4",
                 "--plot", str(tmp_path / "hist.png"))
    captured = capsys.readouterr()
    for line in ["Throughput:", "Baseline throughput:", "Acceptance length:", "Speedup:", "Request throughput:",
                 "| TTFT |", "| TPOT |", "| ITL |", "Successful requests: 8/8", "Acceptance histogram"]:
        assert line in captured.out, line
    assert "needs --baseline-url" not in captured.out
    assert "8/8" in captured.err  # the progress bar
    for run in (res["speculative"], res["baseline"]):
        assert run["completed"] == n and run["failed"] == 0
        assert run["completion_tokens"] == n * new
        assert all(r["ok"] and r["output_tokens"] == new for r in run["requests"])
        assert all(0 < r["ttft"] <= r["latency"] for r in run["requests"])
        assert run["ttft_ms"]["median"] <= run["latency_ms"]["median"]
    spec_run = res["speculative"]
    assert spec_run["acceptance_length"] >= 1
    assert spec_run["verify_steps"] == sum(spec_run["acceptance_histogram"].values())
    assert res["baseline"]["acceptance_length"] is None  # the plain server never verifies
    assert res["speedup"] == pytest.approx(spec_run["throughput_tok_s"] / res["baseline"]["throughput_tok_s"])
    assert res["server"]["speculative_algorithm"] == "EAGLE" and res["baseline_server"]["speculative_algorithm"] is None
    assert res["date"] and res["commit"]
    assert res["input_lens"] == [12] * n
    assert (tmp_path / "hist.png").exists() or "matplotlib is not installed" in captured.err


def test_profile_covers_the_timed_run_and_names_its_files(servers, tmp_path, capsys):
    """--profile: the server profiles the run's steps (/start_profile after the warm-up, /stop_profile
    after the last request) into --profile-dir; the result and the printout name the files."""
    spec, _ = servers
    res = _bench(tmp_path, spec.url, "--num-prompts", "3", "--max-new-tokens", "8", "--random-input-len", "8",
                 "--disable-tqdm", "--profile", "--profile-activities", "HOST", "--profile-dir", str(tmp_path / "p"))
    (host,) = (tmp_path / "p").glob("*-TP-0.host.txt")
    assert res["speculative"]["profile"] == f"Stop profiling. Written:\n{host}"
    assert f"Profile: Stop profiling. Written:\n{host}" in capsys.readouterr().out
    assert "eagle/worker.py" in host.read_text()  # the speculative steps it profiled
    with pytest.raises(ValueError, match="--profile-activities and --profile-dir need --profile"):
        _bench(tmp_path, spec.url, "--profile-dir", str(tmp_path))
    with pytest.raises(SystemExit, match="/start_profile answered 400: .*activities: GPU needs an engine on CUDA"):
        _bench(tmp_path, spec.url, "--num-prompts", "1", "--disable-tqdm", "--profile", "--profile-activities", "GPU")


def test_poisson_arrivals_and_random_lengths_without_baseline(servers, tmp_path, capsys):
    spec, _ = servers
    res = _bench(tmp_path, spec.url, "--num-prompts", "4", "--max-new-tokens", "12", "--random-input-len", "8",
                 "--random-range-ratio", "0.5", "--request-rate", "50", "--disable-tqdm")
    out = capsys.readouterr().out
    assert "Speedup needs --baseline-url" in out and "Throughput:" in out
    assert res["speedup"] is None and res["baseline"] is None
    sent = [r["sent_at"] for r in res["speculative"]["requests"]]
    assert sent == sorted(sent) and sent[-1] > 0  # spread over time, not all at once
    assert all(6 <= k <= 12 for k in res["max_new_tokens"]) and all(4 <= k <= 8 for k in res["input_lens"])
    assert res["speculative"]["completion_tokens"] == sum(res["max_new_tokens"])


def test_a_4xx_is_counted_not_fatal(servers, tmp_path, capsys):
    spec, _ = servers
    too_long = Prompt(input_ids=tuple([5] * 600), max_new_tokens=8)  # > the 512-token context
    prompts = [Prompt(input_ids=(3, 4, 5), max_new_tokens=8), too_long, Prompt(input_ids=(6, 7), max_new_tokens=8)]
    results, seconds = asyncio.run(run_workload(spec.url, prompts, temperature=0.0, concurrency=2,
                                                request_rate=float("inf"), seed=0, timeout=60, progress=False))
    summary = summarize(results, seconds)
    assert summary["completed"] == 2 and summary["failures"] == {"HTTP 400": 1}
    assert "context length" in summary["first_error"]
    assert summary["completion_tokens"] == 16

    res = _bench(tmp_path, spec.url, "--num-prompts", "3", "--random-input-len", "600", "--disable-tqdm")
    out = capsys.readouterr().out
    assert res["speculative"]["failures"] == {"HTTP 400": 3}
    assert "Server failed requests: 3/3 (HTTP 400: 3)" in out and "Throughput: 0.0 token/s" in out
    spec.wait_idle()


def test_timeouts_are_counted(servers, tmp_path):
    spec, _ = servers
    res = _bench(tmp_path, spec.url, "--num-prompts", "2", "--max-new-tokens", "480", "--random-input-len", "8",
                 "--timeout", "0.03", "--disable-tqdm")
    assert res["speculative"]["failures"] == {"timeout": 2}
    spec.wait_idle()  # the client hung up: the server aborted both


def test_no_server_is_a_clear_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SystemExit, match="get_model_info"):
        main(["--port", str(port), "--output", str(tmp_path / "x.json")])


def test_multi_turn_reports_prefill_saved_against_a_cacheless_baseline(tmp_path, capsys):
    """ShareGPT-style conversations against a prefix-cache server and a --disable-radix-cache one:
    later turns reuse their history on the first only; every turn succeeds on both."""
    from .server.live import CharTokenizer

    convs = [{"conversations": [{"from": "human", "value": f"Question {i} about cats."},
                                {"from": "gpt", "value": "ignored: the server answers"},
                                {"from": "human", "value": "And dogs?"},
                                {"from": "human", "value": "Thanks!"}]} for i in range(3)]
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(convs))
    target, draft = make_pair("EAGLE", "mixed", seed=3)
    other = copy.deepcopy(target), copy.deepcopy(draft)  # NOTE: one model object per engine thread
    with LiveServer(engine(target, draft, algorithm="EAGLE", shape=SHAPE, tokenizer=CharTokenizer())) as on, \
            LiveServer(engine(*other, algorithm="EAGLE", shape=SHAPE, tokenizer=CharTokenizer(),
                              disable_radix_cache=True)) as off:
        output = tmp_path / "multi.json"
        main(["--multi-turn", "--multi-turn-dataset", str(data), "--base-url", on.url, "--baseline-url", off.url,
              "--num-prompts", "3", "--max-new-tokens", "6", "--concurrency", "2", "--output", str(output)])
    res = json.loads(output.read_text())
    out = capsys.readouterr().out
    assert "Prefill tokens saved:" in out and "prefix cache on" in out and "prefix cache off" in out
    server, baseline = res["server"], res["baseline"]
    for run in (server, baseline):
        assert run["turns_completed"] == 9 and run["turns_failed"] == 0
        assert run["completion_tokens"] == 9 * 6
    assert baseline["cached_tokens"] == 0 and baseline["info"]["disable_radix_cache"]
    assert server["per_turn"]["0"]["cached_tokens"] < server["per_turn"]["1"]["cached_tokens"]
    assert 0 < server["prefill_saved_fraction"] < 1
    assert server["prompt_tokens"] == baseline["prompt_tokens"]
    assert server["info"]["kv_bytes_per_token"]["total"] > server["info"]["kv_bytes_per_token"]["target"]


def test_openai_backend_measures_an_openai_compatible_server(tmp_path, capsys):
    """``--backend openai`` streams /v1/completions (as against ``vllm serve``): text deltas for
    TTFT and ITL, the final usage chunk for token counts; the embedded stories260K has a tokenizer."""
    from specdec.engine.embedded import DEFAULT_MODEL
    from specdec.engine.engine import Engine

    with LiveServer(Engine(DEFAULT_MODEL)) as server:
        res = _bench(tmp_path, server.url, "--backend", "openai", "--dataset", "tinystories", "--num-prompts", "3",
                     "--max-new-tokens", "10", "--concurrency", "2")
    run = res["speculative"]
    assert res["backend"] == "openai" and run["completed"] == 3 and run["failed"] == 0
    assert all(r["output_tokens"] == 10 and r["prompt_tokens"] > 0 for r in run["requests"])
    assert all(0 < r["ttft"] <= r["latency"] for r in run["requests"])
    assert run["acceptance_length"] is None  # no verify steps: neither in the stream nor in /metrics


def test_openai_backend_reads_the_acceptance_length_from_the_servers_metrics(tmp_path):
    """Over /v1/completions the verify steps come from the server's Prometheus counters, read after
    the warm-up request and after the run; over a /generate run the same counters give what its
    requests' own accept lengths give."""
    from specdec.bench import serving
    from specdec.engine.embedded import DEFAULT_DRAFT, DEFAULT_MODEL
    from specdec.engine.engine import Engine

    spec = Engine(DEFAULT_MODEL, speculative_algorithm="EAGLE", speculative_draft_model_path=DEFAULT_DRAFT,
                  speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    prompts = [Prompt(text=text, max_new_tokens=12) for text in ("Once upon a time", "The cat", "Lily and Ben")]
    with LiveServer(spec) as server:
        before = []
        results, seconds = asyncio.run(run_workload(
            server.url, prompts, temperature=0.0, concurrency=2, request_rate=float("inf"), seed=0, timeout=30.0,
            progress=False, on_start=lambda: before.append(serving.spec_counters(serving.read_metrics(server.url, 5.0)))))
        after = serving.spec_counters(serving.read_metrics(server.url, 5.0))
        openai = _bench(tmp_path, server.url, "--backend", "openai", "--dataset", "tinystories", "--num-prompts", "3",
                        "--max-new-tokens", "12", "--concurrency", "2")["speculative"]
    generate = summarize(results, seconds)
    assert generate["verify_steps"] > 0 and after[0] - before[0][0] == generate["verify_steps"]
    assert serving._acceptance_from_metrics(before[0], after) == pytest.approx(generate["acceptance_length"])
    assert openai["acceptance_source"] == "/metrics" and openai["acceptance_length"] > 1.0
    steps = openai["engine_steps"]  # the run's steps, from the server's step-time histogram
    assert steps["steps"] >= 12 // 4 and steps["mean_ms"] > 0 and steps["kernel_builds"] == 0
    assert 1 <= steps["prefill_steps"] <= 3 and steps["prefill_mean_ms"] > 0  # three prompts, two at a time
    assert steps["prefill_tokens"] > 0


def test_spec_counters_read_vllms_names_and_none_elsewhere(monkeypatch):
    from specdec.bench import serving

    from prometheus_client import CollectorRegistry, Counter, generate_latest

    registry = CollectorRegistry()  # vLLM 0.26's counters, as prometheus_client writes them
    for name, value in (("vllm:spec_decode_num_drafts", 40), ("vllm:spec_decode_num_accepted_tokens", 55)):
        counter = Counter(name, "", ["engine", "model_name"], registry=registry)
        counter.labels(engine="0", model_name="m").inc(value - 5)
        counter.labels(engine="1", model_name="m").inc(5)  # summed over labels
    vllm = generate_latest(registry).decode()
    pages = {"http://vllm": vllm, "http://other": "# TYPE up gauge\nup 1.0\n"}

    class Response:
        def __init__(self, url):
            self.text = pages[url.removesuffix("/metrics")]

        def raise_for_status(self):
            pass

    monkeypatch.setattr(serving.httpx, "get", lambda url, timeout: Response(url))
    assert serving.spec_counters(serving.read_metrics("http://vllm", 1.0)) == (40.0, 55.0)
    assert serving.spec_counters(serving.read_metrics("http://other", 1.0)) is None
    assert serving.engine_steps(serving.read_metrics("http://vllm", 1.0), serving.read_metrics("http://vllm", 1.0)) \
        is None  # no specdec step histogram
    assert serving._acceptance_from_metrics((40.0, 55.0), (60.0, 85.0)) == 2.5  # 1 + 30 / 20
    assert serving._acceptance_from_metrics((40.0, 55.0), (40.0, 55.0)) is None  # nothing verified


def test_openai_backend_refuses_what_needs_generate(tmp_path):
    with pytest.raises(ValueError, match="--backend openai"):
        _bench(tmp_path, "http://127.0.0.1:9", "--backend", "openai", "--multi-turn")


def test_engine_steps_count_slow_steps_and_kernel_builds_between_two_readings(monkeypatch):
    """Between two /metrics readings of a specdec server: 10 steps (one of them 0.3 s), one Triton
    kernel built in 0.2 s while serving, and the decode steps' shapes."""
    from prometheus_client import CollectorRegistry, generate_latest

    from specdec.bench import serving
    from specdec.server.metrics import EngineMetrics

    class Response:
        def __init__(self, url, timeout):
            self.text = generate_latest(metrics.registry).decode()

        def raise_for_status(self):
            pass

    monkeypatch.setattr(serving.httpx, "get", Response)
    metrics = EngineMetrics(registry=CollectorRegistry())

    def cache_stats(prefill_tokens: int) -> dict:
        return {"cache_hit_rate": 0.5, "cached_prompt_tokens": 0, "prefill_tokens": prefill_tokens,
                "num_retracted_reqs": 0, "num_pages": 100, "free_pages": 100, "evictable_pages": 0}

    for _ in range(4):
        metrics.observe_step(0.002, num_running=1, num_queue=0)
    metrics.observe_cache(cache_stats(30))
    metrics.observe_shapes({"plain": 3, "3x1x4": 1})
    before = serving.read_metrics("http://specdec", 1.0)
    for seconds in [0.001] * 8 + [0.3, 0.05]:  # 0.05 s is not over the bound: buckets are <= le
        metrics.observe_step(seconds, num_running=1, num_queue=0, prefill=seconds >= 0.05)
    metrics.observe_cache(cache_stats(75))  # the two prefill steps computed 45 prompt tokens
    metrics.observe_kernel_build(0.2)
    metrics.observe_shapes({"plain": 4, "3x1x4": 8, "5x4x8": 0})  # eight decode steps: 3x1x4 7, plain 1
    steps = serving.engine_steps(before, serving.read_metrics("http://specdec", 1.0))
    assert steps == {"steps": 10, "mean_ms": pytest.approx(1e3 * (0.008 + 0.35) / 10), "prefill_steps": 2,
                     "prefill_mean_ms": pytest.approx(175.0), "prefill_tokens": 45,
                     "decode_mean_ms": pytest.approx(1.0), "slow_steps": 1,
                     "kernel_builds": 1, "kernel_build_ms": pytest.approx(200.0),
                     "shapes": {"3x1x4": 7, "plain": 1}}
    assert list(steps["shapes"]) == ["3x1x4", "plain"]  # most first
