"""One engine in one configuration over the side-by-side workloads, offline: a row of JSON per cell.

    python benchmarks/peer/offline.py --engine specdec --config plain --workload chat \
        --model /tmp/smollm2-bf16 --out rows.jsonl
    python benchmarks/peer/offline.py --engine vllm --config eagle3-k3 --workload chat \
        --model /tmp/smollm2-bf16 --head specdec/data/smollm2/eagle3_head --out rows.jsonl
    python benchmarks/peer/offline.py --engine vllm --config ngram-k5 --workload lookup \
        --model /tmp/smollm2-bf16 --turn1-cache /tmp/turn1.json --out rows.jsonl
    python benchmarks/peer/offline.py --engine vllm --config plain --workload decode \
        --model /tmp/ck/llama-3.1-8b-target --out rows.jsonl

Both engines run with their defaults (specdec: ``specdec.Engine(path)``, speculation through
``speculative_algorithm="EAGLE3"``, adaptive by default; vLLM: ``vllm.LLM(path)``, EAGLE-3 through
``speculative_config``), driven the same way: a closed loop that keeps ``concurrency`` requests in
flight through each engine's own step API (``Engine.add_request`` / ``step``; vLLM's
``LLMEngine.add_request`` / ``step``), the token ids identical on both sides, answers detokenized.

Workloads:
- ``chat``: MT-bench's 80 first turns in the model's chat template, greedy, until the end of turn or
  256 tokens, at each ``--concurrency`` (one request at a time: the first 8 prompts, or
  ``--one-request-prompts``; from 8 on: at least 80 requests, the prompts repeated to twice the
  concurrency). First an untimed warm-up of each concurrency's requests (32 tokens each: a cold
  kernel cache compiles there, not in timed passes). A row: tok/s,
  TTFT and TPOT medians, acceptance length (committed tokens per verify step), and a digest of each
  answer (greedy answers compared across configurations by ``report.py``).
- ``lookup``: where n-gram drafts pay (``--datasets``: Spec-Bench's summarization, RAG and translation,
  HumanEval, and ``mt_bench_turn2``: MT-bench's second turns after the model's own greedy first
  answers, made once by the first run and shared through ``--turn1-cache``), each at every
  ``--concurrency`` (default 1 and 32), rows as ``chat``'s.
- ``decode``: ``--load-format dummy`` weights; ``bs`` requests of ``ctx`` random tokens, prefilled,
  then the ms of one decode step over ``--steps`` steps (all requests still decoding). Rows are tagged
  ``<shape>-decode``, the shape being the checkpoint directory's name less ``-target`` (as
  ``write_dummy_checkpoint`` / ``write_dummy_config`` name it): ``llama-3.1-8b-decode``,
  ``gemma-3-270m-decode``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

from specdec.bench.step_log import StepLog, choices, format_steps

PROFILE: str | None = None  # --profile: where profile_host appends
TRACE: str | None = None  # --trace: where trace_device appends
TRACED_STEPS = 8  # the decode workload's steps traced after its timed ones (--trace)
FORCES: list[str] = ["auto"]  # --force: each cell once per choice (specdec eagle3 / ngram)
REPEATS = 1  # --repeats: each cell's passes (the choices of --force interleaved)
WAITING: list[str] = []  # --waiting: each cell once per admission setting RATIO:STEPS (specdec)
SYNC_DEBUG = False  # --sync-debug: the largest concurrency's timed pass under torch's sync debug mode
ANSWERS: str | None = None  # --answers: where a plain run appends each timed cell's prompts and greedy answers
ONE_REQUEST_PROMPTS = 8  # --one-request-prompts: a one-request cell's prompts, the first of its set
CHAT_PROMPTS = Path(__file__).resolve().parents[2] / "specdec" / "data" / "prompts" / "mt_bench.jsonl"
MAX_TOKENS = 256


# ----------------------------------------------------------------------------- engines
class SpecdecEngine:
    """specdec's ``Engine`` with its defaults; ``config``: plain, eagle3 (adaptive, the default) or ngram."""

    name = "specdec"

    def __init__(self, model: str, *, config: str, head: str | None, dummy: bool, **flags) -> None:
        import specdec

        spec = ({} if config == "plain" else dict(speculative_algorithm="NGRAM") if config == "ngram"
                else dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=head))
        self.engine = specdec.Engine(model, load_format="dummy" if dummy else "auto", **spec, **flags)
        self.tokenizer = self.engine.tokenizer
        self.reqs: dict[str, object] = {}
        self.texts: dict[str, str] = {}
        self.step_log = StepLog(self.engine)  # engine steps by kind (prefill, or the decode step's choice)

    def add(self, rid: str, ids: list[int], max_tokens: int, *, ignore_eos: bool) -> None:
        req = self.engine.make_request(input_ids=ids, rid=rid, sampling_params={
            "temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": ignore_eos})
        self.engine.add_request(req)
        self.reqs[rid] = req

    def step(self) -> None:
        for req in self.step_log.step():
            if req.rid in self.reqs:  # the user's path: the answer detokenized as it is handed out
                self.texts[req.rid] = req.result(self.tokenizer).get("text", "")

    def progress(self, rid: str) -> tuple[list[int], bool]:
        req = self.reqs[rid]
        return req.output_ids, req.finished

    def committed_per_verify(self, rids: list[str]) -> float | None:
        steps = [k + 1 for rid in rids for k in self.reqs[rid].accept_lengths]
        return sum(steps) / len(steps) if steps else None

    def choices(self) -> dict[str, int]:
        """Decode steps by adaptive speculation's choice so far (plain or a tree shape); {} without."""
        return choices(self.engine)

    def lookup_totals(self) -> dict[str, float]:
        """NGRAM's policy: its lookup steps so far, those that found no match, and their guessed and realized
        drafted-and-accepted tokens a row, summed ({} without)."""
        policy = getattr(self.engine.worker, "policy", None)
        return dict(getattr(policy, "totals", {}))

    def explain(self, bs: int) -> str:
        """Adaptive speculation's figures per candidate at ``bs`` and the last step's context (NGRAM's: its
        learned step times; '' without adaptive speculation)."""
        from specdec.ngram.policy import NgramPolicy

        worker = self.engine.worker
        policy = getattr(worker, "policy", None)
        if isinstance(policy, NgramPolicy):  # its step times as learned, no start-up profile
            return ", ".join(f"{name} {value:.3f}" for name, value in policy.explain(bs).items())
        if policy is None or not hasattr(policy, "explain"):
            return ""
        rows = policy.explain(bs, worker.context)
        return "; ".join(f"{name} {r['tokens']:.2f} tok / {r['profile_ms']:.2f} ms x {r['served_ratio']:.2f}"
                         for name, r in rows.items())

    def set_waiting(self, setting: str) -> None:
        """Diagnostics: the scheduler's admission wait, RATIO:STEPS (``--waiting-served-ratio``, ``--max-waiting-tokens``)."""
        ratio, steps = setting.split(":")
        self.engine.scheduler.waiting_served_ratio, self.engine.scheduler.max_waiting_tokens = float(ratio), int(steps)

    def force(self, choice: str) -> None:
        """Diagnostics: every decode step takes ``choice`` (auto: the policy's; plain; or, EAGLE-3, SxKxN)."""
        from specdec.eagle.adaptive import AUTO
        from specdec.eagle.policy import SpecShape
        from specdec.ngram.worker import LOOK_UP_EVERY_STEP, NgramWorker

        worker = self.engine.worker
        if isinstance(worker, NgramWorker) and choice in ("auto", "plain", "lookup"):
            worker.force = {"auto": None, "plain": 0, "lookup": LOOK_UP_EVERY_STEP}[choice]  # NOTE: 0, every step plain
        elif isinstance(worker, NgramWorker) or not hasattr(worker, "force"):
            raise SystemExit("--force: auto, plain or lookup with --config ngram; "
                             "auto, plain or SxKxN with eagle3")
        else:
            worker.force = AUTO if choice == "auto" else None if choice == "plain" else SpecShape.parse(choice)
        self.step_log.forced = None if choice == "auto" else choice

    def abort(self, rids: list[str]) -> None:
        for rid in rids:
            self.engine.abort(rid)
        self.engine.scheduler.drain()

    def forget(self, rids: list[str]) -> None:
        for rid in rids:
            self.reqs.pop(rid, None)

    def flush_prefix_cache(self) -> None:
        self.engine.flush_cache()


class VLLMEngine:
    """vLLM's ``LLM`` with its defaults; ``config``: plain or eagle3-kN (EAGLE-3, N speculative tokens)."""

    name = "vllm"

    def __init__(self, model: str, *, config: str, head: str | None, dummy: bool, **flags) -> None:
        from vllm import LLM

        # NOTE: stats on (vLLM's LLM turns them off): the acceptance length is read from its metrics
        kw = {"disable_log_stats": False, **flags}
        if config != "plain":
            kw["speculative_config"] = self.speculative_config(config, head)
        if dummy:
            kw.update(load_format="dummy", skip_tokenizer_init=True)
        self.llm = LLM(model=model, **kw)
        self.engine = self.llm.llm_engine
        self.detokenize = not dummy
        self.outputs: dict[str, tuple[list[int], bool]] = {}

    @staticmethod
    def speculative_config(config: str, head: str | None) -> dict:
        """eagle3-kN: EAGLE-3 with our head; ngram-kN: vLLM's prompt lookup (needs numba);
        specdec-ngram-kN: ours inside vLLM (``specdec.ngram.vllm_proposer``); N tokens a step."""
        method, _, k = config.rpartition("-k")
        spec = {"num_speculative_tokens": int(k)}
        if method == "eagle3":
            return {**spec, "method": "eagle3", "model": head}
        if method == "ngram":
            return {**spec, "method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4}
        if method == "specdec-ngram":
            return {**spec, "method": "custom_class", "model": "specdec.ngram.vllm_proposer.NgramProposer"}
        raise ValueError(f"--config {config!r}: plain, eagle3-kN, ngram-kN or specdec-ngram-kN")

    def add(self, rid: str, ids: list[int], max_tokens: int, *, ignore_eos: bool) -> None:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos,
                                detokenize=self.detokenize)
        self.engine.add_request(rid, {"prompt_token_ids": ids}, params)
        self.outputs[rid] = ([], False)

    def step(self) -> None:
        for out in self.engine.step():
            if out.request_id in self.outputs:
                self.outputs[out.request_id] = (list(out.outputs[0].token_ids), out.finished)

    def progress(self, rid: str) -> tuple[list[int], bool]:
        return self.outputs[rid]

    def spec_counters(self) -> tuple[float, float]:
        """(drafts, accepted draft tokens) so far, from vLLM's metrics."""
        values = collections.Counter()
        for metric in self.llm.get_metrics():
            if metric.name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens"):
                values[metric.name] += getattr(metric, "value", 0)
        return values["vllm:spec_decode_num_drafts"], values["vllm:spec_decode_num_accepted_tokens"]

    def abort(self, rids: list[str]) -> None:
        self.engine.abort_request(rids)
        while self.engine.has_unfinished_requests():
            self.engine.step()

    def forget(self, rids: list[str]) -> None:
        for rid in rids:
            self.outputs.pop(rid, None)

    def flush_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()


ENGINES = {"specdec": SpecdecEngine, "vllm": VLLMEngine}


# ----------------------------------------------------------------------------- closed loop
def closed_loop(engine, prompts: list[list[int]], concurrency: int, *, tag: str, max_tokens: int = MAX_TOKENS,
                ignore_eos: bool = False, answers: list | None = None) -> dict:
    """Every prompt once, ``concurrency`` in flight: tok/s, TTFT / TPOT medians, answers' digests
    (and the answers' token ids appended to ``answers``, in prompt order, where given)."""
    queue = collections.deque(enumerate(prompts))
    chosen_before = engine.choices() if isinstance(engine, SpecdecEngine) else {}
    lookups_before = engine.lookup_totals() if isinstance(engine, SpecdecEngine) else {}
    if isinstance(engine, SpecdecEngine):
        engine.step_log.clear()
    inflight: dict[str, float] = {}  # rid -> sent at
    first, done, tokens, digests, finished_ids = {}, {}, {}, {}, {}
    t0 = time.perf_counter()
    while queue or inflight:
        while queue and len(inflight) < concurrency:
            i, ids = queue.popleft()
            rid = f"{tag}-{i}"
            engine.add(rid, ids, max_tokens, ignore_eos=ignore_eos)
            inflight[rid] = time.perf_counter()
        engine.step()
        now = time.perf_counter()
        for rid in list(inflight):
            out, finished = engine.progress(rid)
            if out and rid not in first:
                first[rid] = now - inflight[rid]
            if finished:
                done[rid], tokens[rid] = now - inflight[rid], len(out)
                digests[rid] = hashlib.sha1(json.dumps(list(out)).encode()).hexdigest()[:12]
                if answers is not None:
                    finished_ids[rid] = list(out)
                del inflight[rid]
    wall = time.perf_counter() - t0
    rids = list(done)
    tpot = [(done[r] - first[r]) / (tokens[r] - 1) for r in rids if tokens[r] > 1]
    row = {"requests": len(rids), "completion_tokens": sum(tokens.values()), "seconds": wall,
           "tok_s": sum(tokens.values()) / wall, "ttft_ms": 1e3 * statistics.median(first.values()),
           "tpot_ms": 1e3 * statistics.median(tpot) if tpot else None,
           "digests": [digests[f"{tag}-{i}"] for i in range(len(prompts))]}
    if isinstance(engine, SpecdecEngine):
        row["steps"] = engine.step_log.take()
        print(f"  steps, {tag}: {format_steps(row['steps'])}", file=sys.stderr, flush=True)
        row["tau"] = engine.committed_per_verify(rids)
        chosen = {k: n - chosen_before.get(k, 0) for k, n in engine.choices().items()}
        if any(chosen.values()):  # adaptive speculation's decode steps by choice in this cell
            row["choices"] = {k: n for k, n in chosen.items() if n}
        lookups = {k: v - lookups_before.get(k, 0) for k, v in engine.lookup_totals().items()}
        if lookups.get("lookups"):  # NGRAM: its policy's guesses against what its lookups committed
            row["lookups"] = lookups
    if answers is not None:
        answers.extend(finished_ids[f"{tag}-{i}"] for i in range(len(prompts)))
    engine.forget(rids)
    return row


def chat_prompts(tokenizer_dir: str) -> list[list[int]]:
    """MT-bench's first turns in the model's chat template, as token ids (specdec's tokenizer)."""
    from specdec.engine.chat import render_user_prompt
    from specdec.models.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    rows = [json.loads(line) for line in CHAT_PROMPTS.read_text().splitlines() if line.strip()]
    return [tok.encode(render_user_prompt(tok, r["turns"][0])) for r in rows]


def dataset_prompts(engine, model: str, dataset: str, *, num_prompts: int, max_tokens: int,
                    turn1_cache: Path) -> list[list[int]]:
    """A prompt set's first turns in the chat template, as token ids; ``mt_bench_turn2``: the second
    turns after the first answers in ``turn1_cache`` (greedy answers of this engine, written there
    by the first run that finds none, so every engine and configuration continues the same chats)."""
    from specdec.engine.chat import render_messages, render_user_prompt
    from specdec.engine.embedded import load_rows
    from specdec.models.tokenizer import load_tokenizer

    tok = load_tokenizer(model)
    if dataset != "mt_bench_turn2":
        return [tok.encode(render_user_prompt(tok, r["turns"][0])) for r in load_rows(dataset)[:num_prompts]]
    rows = load_rows("mt_bench")[:num_prompts]
    if not getattr(tok, "chat_template", None):
        raise SystemExit(f"{model}: mt_bench_turn2 needs a chat template (a base model has none)")
    if not turn1_cache.exists():
        firsts = [tok.encode(render_user_prompt(tok, r["turns"][0])) for r in rows]
        ids: list[list[int]] = []
        closed_loop(engine, firsts, len(firsts), tag="turn1", max_tokens=max_tokens, answers=ids)
        # NOTE: the engines that read the file prefill the first turns; this one must too, not reuse the KV
        # its decode steps wrote (other bits: its greedy answers would part from theirs for the harness's sake)
        engine.flush_prefix_cache()
        turn1_cache.write_text(json.dumps([tok.decode(a[:-1] if a and a[-1] == tok.eos_token_id else a)
                                           for a in ids]))
    answers = json.loads(turn1_cache.read_text())
    return [tok.encode(render_messages(tok, [{"role": "user", "content": r["turns"][0]},
                                             {"role": "assistant", "content": a},
                                             {"role": "user", "content": r["turns"][1]}]))
            for r, a in zip(rows, answers)]


def run_chat(engine, model: str, concurrencies: list[int], *, name: str, num_prompts: int, max_tokens: int,
             emit) -> None:
    prompts = chat_prompts(model)[:num_prompts]
    run_cells(engine, prompts, concurrencies, workload=f"{name}-mtbench", max_tokens=max_tokens, emit=emit)


def run_lookup(engine, model: str, datasets: list[str], concurrencies: list[int], *, name: str, num_prompts: int,
               max_tokens: int, turn1_cache: Path, emit) -> None:
    for dataset in datasets:
        prompts = dataset_prompts(engine, model, dataset, num_prompts=num_prompts, max_tokens=max_tokens,
                                  turn1_cache=turn1_cache)
        run_cells(engine, prompts, concurrencies, workload=f"{name}-{dataset}", max_tokens=max_tokens, emit=emit)


def run_cells(engine, prompts: list[list[int]], concurrencies: list[int], *, workload: str, max_tokens: int,
              emit) -> None:
    """Each cell's requests as an untimed warm-up at its concurrency (32 tokens each: the batch sizes and
    prefill groups of its timed pass, most of them, compile their kernels here), then a row per concurrency."""
    for c in concurrencies:
        closed_loop(engine, cell_work(prompts, c), c, tag=f"warm-{workload}-c{c}", max_tokens=32)
    for c in concurrencies:
        for force, waiting in [(f, w) for _ in range(REPEATS) for f in FORCES for w in WAITING or [None]]:
            if waiting is not None:
                engine.set_waiting(waiting)
            run_cell(engine, prompts, c, last=c == max(concurrencies), force=force, workload=workload,
                     max_tokens=max_tokens, emit=emit, tags={"waiting": waiting} if waiting else {})


def cell_work(prompts: list[list[int]], c: int) -> list[list[int]]:
    """The requests of a cell at concurrency ``c``: the first ONE_REQUEST_PROMPTS prompts one at a time; else
    at least every prompt, repeated to twice ``c``."""
    if c == 1:
        return prompts[:ONE_REQUEST_PROMPTS]
    return [prompts[i % len(prompts)] for i in range(max(len(prompts), 2 * c))]


def run_cell(engine, prompts: list[list[int]], c: int, *, last: bool, force: str, workload: str, max_tokens: int,
             emit, tags: dict | None = None) -> None:
    """One row: ``c`` requests in flight, every step taking ``force`` (auto: adaptive's choice)."""
    if force != "auto":
        engine.force(force)
    work = cell_work(prompts, c)
    before = engine.spec_counters() if isinstance(engine, VLLMEngine) else None
    answers: list[list[int]] | None = [] if ANSWERS else None
    with sync_debug(SYNC_DEBUG and last, f"{workload} c={c}"):
        row = closed_loop(engine, work, c, tag=f"{workload}-c{c}", max_tokens=max_tokens, answers=answers)
    if answers is not None:  # what a drafter's lookups would have had to predict (benchmarks/ngram_chain_replay.py)
        with open(ANSWERS, "a") as f:
            f.write(json.dumps({"engine": engine.name, "workload": workload, "concurrency": c, "prompts": work,
                                "answers": answers}) + "\n")
    if TRACE is not None and last:
        trace_device(lambda: closed_loop(engine, work, c, tag=f"trace-{workload}-c{c}", max_tokens=max_tokens),
                     f"{workload} c={c} force={force} {type(engine).__name__}")
    if PROFILE is not None and last:  # the host's work, in a separate untimed pass
        profile_host(lambda: closed_loop(engine, work, c, tag=f"prof-{workload}-c{c}", max_tokens=max_tokens),
                     f"{workload} c={c} {type(engine).__name__}")
    if before is not None:
        drafts, accepted = (b - a for a, b in zip(before, engine.spec_counters()))
        row["tau"] = 1 + accepted / drafts if drafts else None
    if force != "auto":
        row["force"] = force
        engine.force("auto")
    emit({"workload": workload, "concurrency": c, "ctx": None, **row, **(tags or {})})
    setting = "".join(f" {k}={v}" for k, v in (tags or {}).items())
    print(f"{workload} c={c} force={force}{setting}: {row['tok_s']:.0f} tok/s, tau {row.get('tau')}, "
          f"TTFT {row['ttft_ms']:.1f} ms, "
          f"steps by choice {row.get('choices')}", file=sys.stderr, flush=True)
    explained = engine.explain(c) if isinstance(engine, SpecdecEngine) else ""
    if explained:
        print(f"  policy at bs={c}: {explained}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def sync_debug(enabled: bool, title: str):
    """With ``enabled``: torch's sync debug mode ("warn") over the block, its warnings counted per
    call site and the top 15 printed to the log (the step's deliberate read is let through:
    ``specdec.forward.deliberate_sync``). NOTE: the timed figures of that pass include the warnings'
    own cost."""
    if not enabled:
        yield
        return
    from specdec.bench.sync_debug import SyncRecorder

    with SyncRecorder() as recorder:
        yield
    print(f"sync debug, {title}: {recorder.summary(15)}", file=sys.stderr, flush=True)


def profile_host(fn, title: str) -> None:
    """Append the host's top functions over ``fn()`` to ``--profile``: by own time (any code), then
    specdec's by cumulative time (where a step's host time goes: prefill against decode steps...)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(40)
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats("specdec/", 50)
    with open(PROFILE, "a") as f:
        f.write(f"===== {title}\n{text.getvalue()}\n")


def trace_device(fn, title: str) -> None:
    """Append to ``--trace`` how busy the GPU was over ``fn()``: its kernels' summed time against the
    wall time (the rest: the host's), and the top kernels (CUDA activity only, so the host's own
    pace is barely slowed; kernels inside CUDA graphs included)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fn()
        wall_ms = 1e3 * (time.perf_counter() - start)
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]
    busy_ms = sum(e.self_device_time_total for e in kernels) / 1e3
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:25]
    lines = [f"{e.self_device_time_total / 1e3:9.1f} ms {e.count:8d}x  {e.key[:110]}" for e in top]
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]
    with open(TRACE, "a") as f:
        f.write(f"===== {title}: wall {wall_ms:.0f} ms, kernels {busy_ms:.0f} ms ({busy_ms / wall_ms:.0%})\n"
                + "\n".join(lines) + "\n" + idle_gaps(spans) + "\n\n")
    print(f"trace, {title}: GPU busy {busy_ms / wall_ms:.0%} of {wall_ms:.0f} ms", file=sys.stderr, flush=True)


# the GPU's idle gaps between kernels, in these bounds (us): where a step waited for the host
GAP_BOUNDS_US = (5, 20, 50, 100, 200, 500, 1000)


def idle_gaps(spans: list[tuple[float, float]]) -> str:
    """How long the GPU sat idle between kernels (``spans``: [start, end] us of every kernel), by gap length:
    a host-bound step shows as gaps of tens to hundreds of us between its kernels or before its first."""
    if not spans:
        return "idle gaps: no kernels"
    spans.sort()
    gaps, end = [], spans[0][1]
    for start, stop in spans[1:]:
        if start > end:
            gaps.append(start - end)
        end = max(end, stop)
    edges = (0, *GAP_BOUNDS_US, float("inf"))
    parts = []
    for lo, hi in zip(edges, edges[1:]):
        inside = [g for g in gaps if lo <= g < hi]
        parts.append(f"{lo:g}-{hi:g} us: {len(inside)} gaps, {sum(inside) / 1e3:.1f} ms")
    return (f"idle gaps over {(end - spans[0][0]) / 1e3:.0f} ms of kernels' span: {sum(gaps) / 1e3:.1f} ms idle; "
            + "; ".join(parts))


def decode_workload(model: str) -> str:
    """The decode rows' workload name: the checkpoint's shape (its directory less ``-target``) + ``-decode``."""
    return Path(model).absolute().name.removesuffix("-target") + "-decode"


def run_decode(engine, points: list[tuple[int, int]], *, workload: str, steps: int, vocab: int, emit) -> None:
    """ms a decode step at each (bs, ctx): ``bs`` requests of ``ctx`` random tokens."""
    import random

    for bs, ctx in points:
        rng = random.Random(bs * 7919 + ctx)
        rids = [f"d{bs}-{ctx}-{i}" for i in range(bs)]
        # room for the decode steps the first requests take while the rest prefill: one between chunks
        # of at most 8 k tokens, up to 16 more where specdec's last admissions wait, 4 untimed, 8 spare,
        # and the traced ones (--trace)
        room = steps + 4 + -(-bs * ctx // 8192) + 16 + 8 + (TRACED_STEPS if TRACE else 0)
        for rid in rids:
            engine.add(rid, [rng.randrange(3, vocab) for _ in range(ctx)], room, ignore_eos=True)
        while any(not engine.progress(r)[0] for r in rids):  # prefill (chunked, between decode steps)
            engine.step()
        for _ in range(4):
            engine.step()
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        ms = 1e3 * (time.perf_counter() - start) / steps
        if TRACE is not None:  # the kernels of a few more steps, after the timed ones
            trace_device(lambda: [engine.step() for _ in range(TRACED_STEPS)],
                         f"{workload} {type(engine).__name__} bs={bs} ctx={ctx}, {TRACED_STEPS} decode steps")
        assert not any(engine.progress(r)[1] for r in rids), "a request finished inside the timed or traced steps"
        engine.abort(rids)
        engine.forget(rids)
        emit({"workload": workload, "concurrency": bs, "ctx": ctx, "ms_per_step": ms,
              "tok_s": 1e3 * bs / ms})
        print(f"bs={bs} ctx={ctx}: {ms:.2f} ms a step", file=sys.stderr, flush=True)


def main() -> None:
    global PROFILE, SYNC_DEBUG, TRACE, FORCES, REPEATS, WAITING, ANSWERS, ONE_REQUEST_PROMPTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=sorted(ENGINES), required=True)
    parser.add_argument("--config", default="plain",
                        help="plain, eagle3, ngram (specdec); eagle3-kN, ngram-kN, specdec-ngram-kN (vllm)")
    parser.add_argument("--workload", choices=["chat", "lookup", "decode"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--model-name", default="smollm2", help="chat, lookup: the rows' workload prefix")
    parser.add_argument("--head", help="the EAGLE-3 head directory")
    parser.add_argument("--concurrency", help="requests in flight, comma-separated (chat: 1,8,32,64,128; "
                        "lookup: 1,32)")
    parser.add_argument("--datasets", default="summarization,rag,translation,humaneval,mt_bench_turn2",
                        help="lookup: the prompt sets")
    parser.add_argument("--turn1-cache", default="/tmp/turn1.json", type=Path,
                        help="lookup: MT-bench's first answers, shared by every run")
    parser.add_argument("--points", default="1:1024,16:1024,64:1024,128:1024,256:1024,1:4096,16:4096,64:4096,128:4096",
                        help="decode: bs:ctx,...")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=80, help="chat: MT-bench prompts (smoke tests: fewer)")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="chat: longest answer")
    parser.add_argument("--out", required=True, help="JSON lines file to append rows to")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting passed to the engine (diagnostics; the record uses none), "
                             "e.g. max_running_requests=1")
    parser.add_argument("--profile", help="append a cProfile of the host over one more (untimed) pass of the "
                        "largest concurrency to this file")
    parser.add_argument("--sync-debug", action="store_true",
                        help="after the warm-up, run the timed pass of the largest concurrency under torch's sync "
                             "debug mode and log the calls that wait for the GPU, by call site (top 15)")
    parser.add_argument("--trace", help="append how busy the GPU was (kernel time against wall time) and its top "
                        "kernels over one more (untimed) pass of the largest concurrency, or (decode) 8 more steps "
                        "at each point, to this file")
    parser.add_argument("--force", default="auto", help="diagnostics, specdec eagle3 / ngram: each cell once per "
                        "choice, comma-separated (auto: adaptive's; plain; ngram also lookup: every step; "
                        "eagle3 also SxKxN); "
                        "rows carry \"force\"")
    parser.add_argument("--repeats", type=int, default=1, help="diagnostics: each cell this many times (the "
                        "choices of --force interleaved), one row each")
    parser.add_argument("--answers", help="plain runs: append each timed cell's prompts and greedy answers (token "
                        "ids, JSON lines) to this file, for benchmarks/ngram_chain_replay.py --answers")
    parser.add_argument("--one-request-prompts", type=int, default=ONE_REQUEST_PROMPTS,
                        help="chat, lookup: a one-request cell's prompts, the first of each set (8: the records' "
                             "'8/8' agreement; more resolve an A/B's few per cent: 8 SmolLM2 prompts take <1 s)")
    parser.add_argument("--waiting", default="", help="diagnostics, specdec: each cell once per admission setting "
                        "RATIO:STEPS (--waiting-served-ratio, --max-waiting-tokens), comma-separated; rows carry it")
    args = parser.parse_args()
    if args.one_request_prompts < 1:
        raise SystemExit(f"--one-request-prompts: expected a positive count, got {args.one_request_prompts}")
    ONE_REQUEST_PROMPTS = args.one_request_prompts
    PROFILE, TRACE, FORCES, REPEATS = args.profile, args.trace, args.force.split(","), args.repeats
    ANSWERS = args.answers if args.config == "plain" else None
    if TRACE:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--trace: needs a CUDA GPU (it records the GPU's kernels)")
    WAITING = [w for w in args.waiting.split(",") if w]
    SYNC_DEBUG = args.sync_debug
    flags = {k: json.loads(v) for k, v in (a.split("=", 1) for a in args.engine_arg)}
    engine = ENGINES[args.engine](args.model, config=args.config, head=args.head, dummy=args.workload == "decode",
                                  **flags)

    def emit(row: dict) -> None:  # each cell as it is measured: a run cut short keeps what it had
        with open(args.out, "a") as f:
            extra = {"flags": flags} if flags else {}
            f.write(json.dumps({"engine": args.engine, "config": args.config, **row, **extra}) + "\n")

    concurrency = args.concurrency or ("1,32" if args.workload == "lookup" else "1,8,32,64,128")
    concurrencies = [int(c) for c in concurrency.split(",")]
    if args.workload == "chat":
        run_chat(engine, args.model, concurrencies, name=args.model_name, num_prompts=args.num_prompts,
                 max_tokens=args.max_tokens, emit=emit)
    elif args.workload == "lookup":
        run_lookup(engine, args.model, args.datasets.split(","), concurrencies, name=args.model_name,
                   num_prompts=args.num_prompts, max_tokens=args.max_tokens, turn1_cache=args.turn1_cache, emit=emit)
    else:
        vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
        points = [tuple(int(x) for x in p.split(":")) for p in args.points.split(",")]
        run_decode(engine, points, workload=decode_workload(args.model), steps=args.steps, vocab=vocab, emit=emit)


if __name__ == "__main__":
    main()
