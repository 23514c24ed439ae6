"""The online benchmark's client: one streamed request read chunk by chunk, a workload of them
(Poisson arrivals, bounded concurrency, a progress count) and the numbers they add up to.

Two APIs (``--backend``): ``sglang``, SGLang's native ``/generate`` (cumulative ``output_ids`` and
``meta_info`` with the accept lengths; specdec and SGLang serve it), and ``openai``,
``/v1/completions`` with ``stream_options.include_usage`` (any OpenAI-compatible server, e.g. ``vllm
serve``: token counts from the final usage, no acceptance figures).

Per request, on this client's clock from the moment it is sent:
    TTFT     time to the first streamed chunk that carries tokens
    ITL      gaps between consecutive chunks that carry tokens. NOTE: a speculative step delivers
             its k + 1 committed tokens in one chunk, so an ITL is a time per step, not per token
    TPOT     (latency - TTFT) / (output tokens - 1): time per output token after the first
    latency  time to the end of the stream
Acceptance length: mean tokens committed (accepted + bonus = k + 1) per verify step, over every
verify step of every successful request (``meta_info.spec_accept_lengths`` holds the k's).

A failed request (HTTP 4xx/5xx, an error chunk, a timeout, a broken connection) comes back as a
``RequestResult`` naming its reason; it never raises, and only successful requests enter the numbers.

The client is aiohttp (as vLLM's ``vllm bench serve``): against a server that streams one-token chunks as
fast as it can, 128 streams on a 2-core CPU, this client on httpx read 27,000 tok/s, on aiohttp 33,000-35,000
(a bare aiohttp reader 42,000): on httpx the client, not the server, set a fast server's figure.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import math
import random
import time

import aiohttp

from specdec.bench.report import latency_stats_ms, progress_bar


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One request of the workload: text or token ids (exactly one), and its output length."""

    text: str | None = None
    input_ids: tuple[int, ...] | None = None  # [prompt_len]
    max_new_tokens: int = 64

    def body(self, *, temperature: float, max_new_tokens: int | None = None) -> dict:
        """SGLang's ``/generate`` request."""
        prompt = {"text": self.text} if self.text is not None else {"input_ids": list(self.input_ids)}
        params = {"max_new_tokens": max_new_tokens or self.max_new_tokens, "temperature": temperature,
                  "ignore_eos": True}
        return {**prompt, "sampling_params": params, "stream": True}

    def openai_body(self, *, model: str, temperature: float, max_new_tokens: int | None = None) -> dict:
        """The same request as OpenAI's ``/v1/completions`` (``ignore_eos``: vLLM's and SGLang's extension)."""
        return {"model": model, "prompt": self.text if self.text is not None else list(self.input_ids),
                "max_tokens": max_new_tokens or self.max_new_tokens, "temperature": temperature,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


@dataclasses.dataclass
class RequestResult:
    """What one request did; times in seconds. ``reason`` names the failure ("HTTP 400", "timeout")."""

    sent_at: float = 0.0  # since the run began
    ok: bool = False
    reason: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float | None = None
    latency: float = 0.0
    itl: list[float] = dataclasses.field(default_factory=list)
    accept_lengths: list[int] = dataclasses.field(default_factory=list)  # accepted draft tokens per verify step

    def fail(self, reason: str, error: str) -> "RequestResult":
        self.ok, self.reason, self.error = False, reason, error[:300]
        return self


# ------------------------------------------------------------------ one request
BACKENDS = ("sglang", "openai")


# the longest SSE line a stream may send (a native chunk carries the cumulative output_ids and text)
MAX_LINE_BYTES = 1 << 24


def client_session(connections: int, timeout: float) -> aiohttp.ClientSession:
    """The benchmark's HTTP client: ``connections`` at once, ``timeout`` s the longest wait for a read."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections), read_bufsize=MAX_LINE_BYTES,
                                 timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout))


async def _http_error(response: aiohttp.ClientResponse, res: RequestResult) -> RequestResult:
    body = (await response.read()).decode(errors="replace")
    try:
        body = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    return res.fail(f"HTTP {response.status}", body)


async def sse_chunks(response: aiohttp.ClientResponse, *, require_done: bool = True):
    """The SSE stream's JSON chunks up to ``data: [DONE]``; an error chunk raises ``StreamError``,
    and so does a stream that ends without ``[DONE]`` where ``require_done``."""
    async for line in response.content:  # one line each, its b"\n" included
        if not line.startswith(b"data: "):
            continue
        data = line[len(b"data: "):].strip()
        if data == b"[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:  # the server aborted it mid-stream (shutdown, engine failure)
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            raise StreamError(f"HTTP {err.get('code', 'error')}", str(err.get("message")))
        yield chunk
    if require_done:
        raise StreamError("stream cut", "the stream ended without data: [DONE]")


class StreamError(Exception):
    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason, self.error = reason, error


def _tokens_arrived(res: RequestResult, start: float, last_chunk_at: float | None) -> float:
    """A chunk carrying new tokens arrived: TTFT or one more ITL gap; returns its time."""
    now = time.perf_counter() - start
    if last_chunk_at is None:
        res.ttft = now
    else:
        res.itl.append(now - last_chunk_at)
    return now


async def _read_openai_stream(response: aiohttp.ClientResponse, res: RequestResult, start: float) -> RequestResult:
    """Fill ``res`` from ``/v1/completions`` chunks: text deltas, then the usage chunk."""
    if response.status != 200:
        return await _http_error(response, res)
    last_chunk_at, finish, usage = None, None, None
    try:
        async for chunk in sse_chunks(response):
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                if choice.get("text"):
                    last_chunk_at = _tokens_arrived(res, start, last_chunk_at)
                finish = choice.get("finish_reason") or finish
    except StreamError as e:
        return res.fail(e.reason, e.error)
    res.latency = time.perf_counter() - start
    if finish is None or not usage:
        return res.fail("unfinished", f"no finish_reason or usage at the end of the stream: {finish}, {usage}")
    res.prompt_tokens, res.output_tokens = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    res.ok = True
    return res


async def _read_stream(response: aiohttp.ClientResponse, res: RequestResult, start: float) -> RequestResult:
    """Fill ``res`` from the SSE chunks (cumulative ``output_ids``) until ``data: [DONE]``."""
    if response.status != 200:
        return await _http_error(response, res)
    last_chunk_at, meta = None, None
    try:
        async for chunk in sse_chunks(response):
            n = len(chunk.get("output_ids", ()))
            if n > res.output_tokens:
                last_chunk_at, res.output_tokens = _tokens_arrived(res, start, last_chunk_at), n
            meta = chunk.get("meta_info") or meta
    except StreamError as e:
        return res.fail(e.reason, e.error)
    res.latency = time.perf_counter() - start
    if not meta or meta.get("finish_reason") is None:
        return res.fail("unfinished", f"the last chunk has no finish_reason: {meta}")
    res.prompt_tokens = meta.get("prompt_tokens", 0)
    res.accept_lengths = list(meta.get("spec_accept_lengths") or [])
    res.ok = True
    return res


async def send_one(client: aiohttp.ClientSession, base_url: str, prompt: Prompt, *, temperature: float,
                   timeout: float, t0: float, max_new_tokens: int | None = None, backend: str = "sglang",
                   model: str | None = None) -> RequestResult:
    """Stream one request to the server at ``base_url`` (``backend``: sglang's ``/generate`` or openai's
    ``/v1/completions`` for ``model``); every failure comes back as a RequestResult, never raised."""
    start = time.perf_counter()
    res = RequestResult(sent_at=start - t0)

    async def request() -> RequestResult:
        if backend == "openai":
            body = prompt.openai_body(model=model, temperature=temperature, max_new_tokens=max_new_tokens)
            async with client.post(f"{base_url}/v1/completions", json=body) as response:
                return await _read_openai_stream(response, res, start)
        body = prompt.body(temperature=temperature, max_new_tokens=max_new_tokens)
        async with client.post(f"{base_url}/generate", json=body) as response:
            return await _read_stream(response, res, start)

    try:
        return await asyncio.wait_for(request(), timeout)
    except asyncio.TimeoutError:
        return res.fail("timeout", f"no end of stream within --timeout {timeout} s")
    except aiohttp.ClientError as e:
        return res.fail(type(e).__name__, str(e) or type(e).__name__)
    except (ValueError, KeyError, TypeError) as e:  # a malformed chunk
        return res.fail("bad chunk", f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 — one request fails, not the benchmark
        return res.fail(type(e).__name__, str(e) or type(e).__name__)


# ------------------------------------------------------------------ the workload
def arrival_gaps(n: int, request_rate: float, seed: int) -> list[float]:
    """Seconds to wait before each request: exponential gaps (a Poisson process), 0 when rate is inf."""
    if math.isinf(request_rate):
        return [0.0] * n
    rng = random.Random(seed)
    return [rng.expovariate(request_rate) for _ in range(n)]


async def run_workload(base_url: str, prompts: list[Prompt], *, temperature: float, concurrency: int | None,
                       request_rate: float, seed: int, timeout: float, desc: str = "requests",
                       progress: bool = True, warmup: bool = True, backend: str = "sglang",
                       model: str | None = None, on_start=None) -> tuple[list[RequestResult], float]:
    """Send every prompt once (after one short warm-up request); returns the results and the seconds
    from the first send to the last finish. ``on_start()``: called after the warm-up, before the
    first send."""
    limit = concurrency or len(prompts)
    semaphore = asyncio.Semaphore(limit)
    base_url = base_url.rstrip("/")
    async with client_session(limit, timeout) as client:
        if warmup and prompts:
            first = prompts[0]
            short = Prompt(text=first.text and first.text[:200], input_ids=first.input_ids and first.input_ids[:16])
            await send_one(client, base_url, short, temperature=temperature, timeout=timeout, t0=0.0, max_new_tokens=4,
                           backend=backend, model=model)
        if on_start is not None:
            on_start()
        with progress_bar(len(prompts), desc, enabled=progress) as bar:
            t0 = time.perf_counter()

            async def one(prompt: Prompt) -> RequestResult:
                async with semaphore:
                    res = await send_one(client, base_url, prompt, temperature=temperature, timeout=timeout, t0=t0,
                                         backend=backend, model=model)
                bar.update(1)
                return res

            tasks = []
            for prompt, gap in zip(prompts, arrival_gaps(len(prompts), request_rate, seed)):
                await asyncio.sleep(gap)
                tasks.append(asyncio.ensure_future(one(prompt)))
            results = list(await asyncio.gather(*tasks))
            return results, time.perf_counter() - t0


def summarize(results: list[RequestResult], seconds: float) -> dict:
    ok = [r for r in results if r.ok]
    failures = collections.Counter(r.reason for r in results if not r.ok)
    tokens = sum(r.output_tokens for r in ok)
    committed = [k + 1 for r in ok for k in r.accept_lengths]
    return {
        "seconds": seconds,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "failures": dict(failures.most_common()),
        "first_error": next((r.error for r in results if not r.ok), None),
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "completion_tokens": tokens,
        "throughput_tok_s": tokens / seconds if seconds > 0 else 0.0,
        "request_throughput_req_s": len(ok) / seconds if seconds > 0 else 0.0,
        "verify_steps": len(committed),
        "acceptance_length": sum(committed) / len(committed) if committed else None,
        "acceptance_histogram": dict(sorted(collections.Counter(committed).items())),
        "ttft_ms": latency_stats_ms([r.ttft for r in ok if r.ttft is not None]),
        "tpot_ms": latency_stats_ms([(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok
                              if r.ttft is not None and r.output_tokens > 1]),
        "itl_ms": latency_stats_ms([gap for r in ok for gap in r.itl]),
        "latency_ms": latency_stats_ms([r.latency for r in ok]),
        "requests": [{k: v for k, v in dataclasses.asdict(r).items() if k != "itl"} for r in results],
    }
