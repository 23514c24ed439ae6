"""Multi-turn conversations for ``specdec bench-serving --multi-turn``: what a prefix cache saves.

Each conversation is a list of user turns (MT-bench's two, or the human turns of ShareGPT-style
JSON). Turn t is sent to ``/v1/chat/completions`` (streamed) with the whole history: every earlier
user turn and the server's own answer to it, so turn t's prompt starts with turn t - 1's prompt and
answer, which a prefix cache holds. Conversations run concurrently (``--concurrency``, Poisson
arrivals at ``--request-rate``); the turns of one conversation run one after another.

Per turn, on this client's clock: TTFT (to the first chunk carrying tokens), ITL (gaps between
chunks carrying tokens; a speculative step delivers its k + 1 tokens at once), latency, output
tokens (the chunks' ``token_ids``) and the prompt tokens the cache supplied
(``usage.prompt_tokens_details.cached_tokens``). Reported: prefill tokens saved (cached / prompt
tokens), TTFT p50 / p99 per turn index and overall, and output throughput.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import time
from pathlib import Path

import aiohttp

from specdec.bench.report import latency_stats_ms, progress_bar
from specdec.bench.serving_client import client_session, sse_chunks
from specdec.engine.embedded import PROMPT_DIR


@dataclasses.dataclass(frozen=True)
class Conversation:
    turns: tuple[str, ...]  # the user's turns, in order


@dataclasses.dataclass
class TurnResult:
    conversation: int
    turn: int
    ok: bool = False
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ttft: float | None = None
    latency: float = 0.0
    itl: list[float] = dataclasses.field(default_factory=list)


# ------------------------------------------------------------------ conversations
def load_conversations(source: str, num: int) -> list[Conversation]:
    """``mt_bench`` (the embedded MT-bench rows: two turns each) or a ShareGPT-style JSON file
    (a list of ``{"conversations": [{"from": "human" | "gpt", "value": ...}, ...]}``: its human
    turns). Rows repeat when there are fewer than ``num``."""
    if source == "mt_bench":
        rows = [json.loads(line) for line in (PROMPT_DIR / "mt_bench.jsonl").read_text().splitlines() if line]
        convs = [Conversation(tuple(r["turns"])) for r in rows]
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"--multi-turn-dataset: {source!r} is neither mt_bench nor a ShareGPT JSON file")
        convs = []
        for row in json.loads(path.read_text()):
            human = tuple(m["value"] for m in row.get("conversations", []) if m.get("from") in ("human", "user"))
            if len(human) >= 2:
                convs.append(Conversation(human))
        if not convs:
            raise ValueError(f"{source}: no conversation with two or more human turns")
    return [convs[i % len(convs)] for i in range(num)]


# ------------------------------------------------------------------ one turn
async def _read_chat_stream(response: aiohttp.ClientResponse, res: TurnResult, start: float) -> str:
    """Fill ``res`` from the chat completion chunks; returns the answer's text."""
    if response.status != 200:
        body = (await response.read()).decode(errors="replace")
        raise RuntimeError(f"HTTP {response.status}: {body[:300]}")
    text, last = [], None
    async for chunk in sse_chunks(response, require_done=False):
        if chunk.get("usage"):
            usage = chunk["usage"]
            res.prompt_tokens = usage["prompt_tokens"]
            res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        for choice in chunk.get("choices", []):
            text.append(choice.get("delta", {}).get("content") or "")
            n = len(choice.get("token_ids") or [])
            if n:
                now = time.perf_counter() - start
                if last is None:
                    res.ttft = now
                else:
                    res.itl.append(now - last)
                last = now
                res.output_tokens += n
    res.latency = time.perf_counter() - start
    return "".join(text)


async def send_turn(client: aiohttp.ClientSession, base_url: str, messages: list[dict], res: TurnResult, *,
                    max_new_tokens: int, temperature: float, timeout: float) -> str | None:
    """One streamed chat turn to the server at ``base_url``; returns the answer (None on failure, recorded
    in ``res``)."""
    body = {"messages": messages, "max_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()

    async def request() -> str:
        async with client.post(f"{base_url}/v1/chat/completions", json=body) as response:
            return await _read_chat_stream(response, res, start)

    try:
        answer = await asyncio.wait_for(request(), timeout)
    except Exception as e:  # noqa: BLE001 — one failed turn ends its conversation, not the benchmark
        res.error = f"{type(e).__name__}: {e}"[:300]
        return None
    res.ok = True
    return answer


# ------------------------------------------------------------------ the workload
async def run_conversations(base_url: str, convs: list[Conversation], *, max_new_tokens: int, temperature: float,
                            concurrency: int | None, gaps: list[float], timeout: float, desc: str,
                            progress: bool = True) -> tuple[list[TurnResult], float]:
    """Every conversation, turn after turn; returns each turn's result and the run's seconds."""
    limit = concurrency or len(convs)
    semaphore = asyncio.Semaphore(limit)
    results: list[TurnResult] = []
    base_url = base_url.rstrip("/")
    async with client_session(limit, timeout) as client:
        with progress_bar(sum(len(c.turns) for c in convs), desc, enabled=progress) as bar:
            t0 = time.perf_counter()

            async def converse(index: int, conv: Conversation) -> None:
                async with semaphore:
                    messages: list[dict] = []
                    for turn, question in enumerate(conv.turns):
                        messages.append({"role": "user", "content": question})
                        res = TurnResult(index, turn)
                        results.append(res)
                        answer = await send_turn(client, base_url, messages, res, max_new_tokens=max_new_tokens,
                                                 temperature=temperature, timeout=timeout)
                        bar.update(1)
                        if answer is None:
                            return
                        messages.append({"role": "assistant", "content": answer})

            tasks = []
            for index, (conv, gap) in enumerate(zip(convs, gaps)):
                await asyncio.sleep(gap)
                tasks.append(asyncio.ensure_future(converse(index, conv)))
            await asyncio.gather(*tasks)
            return results, time.perf_counter() - t0


def summarize_turns(results: list[TurnResult], seconds: float) -> dict:
    ok = [r for r in results if r.ok]
    by_turn = collections.defaultdict(list)
    for r in ok:
        by_turn[r.turn].append(r)
    prompt, cached = sum(r.prompt_tokens for r in ok), sum(r.cached_tokens for r in ok)
    tokens = sum(r.output_tokens for r in ok)
    return {
        "seconds": seconds,
        "turns_completed": len(ok),
        "turns_failed": len(results) - len(ok),
        "first_error": next((r.error for r in results if not r.ok), None),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefill_tokens": prompt - cached,
        "prefill_saved_fraction": cached / prompt if prompt else 0.0,
        "completion_tokens": tokens,
        "throughput_tok_s": tokens / seconds if seconds > 0 else 0.0,
        "ttft_ms": latency_stats_ms([r.ttft for r in ok if r.ttft is not None]),
        "itl_ms": latency_stats_ms([g for r in ok for g in r.itl]),
        "latency_ms": latency_stats_ms([r.latency for r in ok]),
        "per_turn": {
            str(t): {"turns": len(rs), "prompt_tokens": sum(r.prompt_tokens for r in rs),
                     "cached_tokens": sum(r.cached_tokens for r in rs),
                     "ttft_ms": latency_stats_ms([r.ttft for r in rs if r.ttft is not None])}
            for t, rs in sorted(by_turn.items())
        },
        "turns": [{k: v for k, v in dataclasses.asdict(r).items() if k != "itl"} for r in results],
    }


def format_summary(name: str, s: dict) -> list[str]:
    """Report lines of one server's multi-turn run."""
    ttft = s["ttft_ms"] or {"p50": float("nan"), "p99": float("nan")}
    lines = [f"{name}: {s['turns_completed']} turns ({s['turns_failed']} failed) in {s['seconds']:.1f} s",
             f"  Prefill tokens saved: {s['cached_tokens']}/{s['prompt_tokens']} "
             f"({100 * s['prefill_saved_fraction']:.1f}%)",
             f"  TTFT p50 {ttft['p50']:.1f} ms, p99 {ttft['p99']:.1f} ms",
             f"  Throughput: {s['throughput_tok_s']:.1f} token/s"]
    for turn, t in s["per_turn"].items():
        tt = t["ttft_ms"] or {"p50": float("nan"), "p99": float("nan")}
        lines.append(f"  turn {int(turn) + 1}: cached {t['cached_tokens']}/{t['prompt_tokens']} prompt tokens, "
                     f"TTFT p50 {tt['p50']:.1f} ms, p99 {tt['p99']:.1f} ms")
    if s["first_error"]:
        lines.append(f"  first error: {s['first_error']}")
    return lines
