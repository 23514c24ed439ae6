"""HTTP server: SGLang's native ``/generate`` and OpenAI-compatible endpoints over one AsyncEngine.

    POST /generate              {"text" | "input_ids" (one or a batch), "sampling_params" (one or per
                                prompt; SGLang keys plus "stop"), "stream"} → {"text", "output_ids",
                                "meta_info"} (a list for a batch)
    POST /v1/completions        OpenAI: model, prompt (str, [str], [int], [[int]]), max_tokens (16),
                                temperature, top_p, top_k / min_p / ignore_eos / stop_token_ids
                                (extensions), stop, stream, stream_options.include_usage
    POST /v1/chat/completions   the same with messages; max_tokens / max_completion_tokens (128)
    GET  /health  /metrics  /get_model_info  /v1/models

Streaming is Server-Sent Events: ``data: {json}\\n\\n`` per engine step that committed tokens (a
speculative step's k + 1 tokens arrive together), ending ``data: [DONE]\\n\\n``. Native chunks carry
the cumulative ``text`` / ``output_ids`` and ``meta_info`` (``index`` for a batch); OpenAI chunks
carry deltas. A request the server aborts (shutdown) ends with ``data: {"error": {...}}``.

Stops: integers are token ids. A string that is exactly one token (encode/decode round trip) becomes
a stop token id; any other string is matched on the decoded text, which is cut before it (the request
is then aborted in the engine; ``output_ids`` keep the tokens generated up to the match). Streams hold
back text that could be the start of a stop string. Strings need a tokenizer.

OpenAI choices (and stream chunks) also carry ``token_ids`` (an extension); ``model`` is echoed as
the served model name whatever the request says; unknown fields are ignored, as SGLang does.

Chat template: the tokenizer's Jinja ``chat_template`` when it has one (rendered with jinja2),
otherwise the fallback ``"<role>: <content>\\n"`` per message followed by ``"assistant:"``.

Errors: every 4xx/5xx body is ``{"error": {"message", "type", "code"}}``. A client that disconnects
has its requests aborted (their KV freed) at once, streaming or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.server.async_engine import AsyncEngine, EngineUnavailable, InvalidRequest, RequestStream

logger = logging.getLogger(__name__)
FALLBACK_CHAT_TEMPLATE = "<role>: <content>\\n per message, then assistant:"
_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
                413: "invalid_request_error", 503: "service_unavailable", 500: "internal_error"}


class HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "error"), "code": status}}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


def _handler(status_and_message):
    """An async exception handler (a sync one would run in Starlette's thread pool)."""

    async def handle(_: Request, e: Exception) -> JSONResponse:
        return _error(*status_and_message(e))

    return handle


def _sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HTTPError(400, f"malformed JSON body: {e}") from None
    if not isinstance(body, dict):
        raise HTTPError(400, f"the JSON body must be an object, got {type(body).__name__}")
    return body


# ------------------------------------------------------------------ stops and chat template
@dataclasses.dataclass(frozen=True)
class Stops:
    token_ids: tuple[int, ...] = ()  # from integers
    string_ids: tuple[int, ...] = ()  # from one-token strings: trimmed from the text like a string stop
    strings: tuple[str, ...] = ()  # matched on the decoded text


def parse_stops(stop: Any, tokenizer: Any, field: str = "stop") -> Stops:
    if stop is None:
        return Stops()
    items = [stop] if isinstance(stop, (str, int)) else stop
    if not isinstance(items, list):
        raise HTTPError(400, f"{field} must be a string, a token id or a list of them")
    ids, string_ids, strings = [], [], []
    for s in items:
        if isinstance(s, int) and not isinstance(s, bool) and s >= 0:
            ids.append(s)
        elif isinstance(s, str) and s:
            if tokenizer is None:
                raise HTTPError(400, f"{field}: string stops need a tokenizer; this model has none (use token ids)")
            one = tokenizer.encode(s, add_bos=False)
            if len(one) == 1 and tokenizer.decode(one) == s:
                string_ids.append(one[0])
            else:
                strings.append(s)
        else:
            raise HTTPError(400, f"{field}: entries must be non-empty strings or token ids >= 0, got {s!r}")
    return Stops(tuple(ids), tuple(string_ids), tuple(strings))


def _with_stop_ids(params: Any, stops: Stops) -> Any:
    """sampling_params with the stop token ids added (left alone when malformed: the engine says why)."""
    extra = [*stops.token_ids, *stops.string_ids]
    if not extra or not isinstance(params, dict):
        return params
    own = params.get("stop_token_ids") or []
    return {**params, "stop_token_ids": [*own, *extra]} if isinstance(own, (list, tuple)) else params


def render_chat(messages: Any, tokenizer: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise HTTPError(400, "messages must be a non-empty list of {role, content} objects")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise HTTPError(400, f"messages[{i}] must be an object with a string role")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise HTTPError(400, f"messages[{i}].content: only text parts are supported")
            content = "".join(p["text"] for p in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise HTTPError(400, f"messages[{i}].content must be a string or a list of text parts")
        clean.append({"role": m["role"], "content": content})
    template = getattr(tokenizer, "chat_template", None)
    if template:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise HTTPError(400, f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(template).render(
            messages=clean, add_generation_prompt=True,
            bos_token=getattr(tokenizer, "bos_token", "") or "", eos_token=getattr(tokenizer, "eos_token", "") or "")
    return "".join(f"{m['role']}: {m['content']}\n" for m in clean) + "assistant:"


# ------------------------------------------------------------------ one request's visible output
class Generation:
    """What the client sees of one request: ids, text cut at stop strings, and stream deltas."""

    def __init__(self, stream: RequestStream, tokenizer: Any, stops: Stops) -> None:
        self.stream = stream
        self.tokenizer = tokenizer
        self.stops = stops
        self.ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.meta_info: dict | None = None
        self.error: str | None = None
        self.error_status = 200
        self.sent_chars = 0
        self.sent_ids = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    async def advance(self) -> None:
        event = await self.stream.next_event()
        self.ids.extend(event.token_ids)
        if event.error is not None:
            self.error, self.error_status = event.error, event.status
            return
        cut = False
        if self.tokenizer is not None:
            ids = self.ids
            if event.finished and event.meta_info["finish_reason"] == "stop" and ids \
                    and ids[-1] in self.stops.string_ids:
                ids = ids[:-1]  # a one-token stop string is not part of the text
            text = self.tokenizer.decode(ids)
            hits = [i for i in (text.find(s) for s in self.stops.strings) if i >= 0]
            cut = bool(hits)
            self.text = text[: min(hits)] if hits else text
        if cut and not event.finished:
            self.stream.close(finish_reason="stop")  # the engine would keep generating past it
            self.meta_info = self.partial_meta("stop")
        elif event.finished:
            self.meta_info = {**event.meta_info, **({"finish_reason": "stop"} if cut else {})}
        if self.meta_info is not None:
            self.finish_reason = self.meta_info["finish_reason"]

    def partial_meta(self, finish_reason: str | None = None) -> dict:
        return {"id": self.stream.rid, "prompt_tokens": self.stream.prompt_tokens,
                "completion_tokens": len(self.ids), "finish_reason": finish_reason}

    def visible_text(self) -> str:
        """The text safe to show now: a tail that may still become a stop string, or an incomplete
        UTF-8 character (U+FFFD), is held back until the request finishes."""
        if self.finished:
            return self.text
        end = len(self.text)
        while end and self.text[end - 1] == "\ufffd":
            end -= 1
        hold = 0
        for s in self.stops.strings:
            hold = max(hold, next((k for k in range(min(len(s) - 1, end), 0, -1)
                                   if self.text[:end].endswith(s[:k])), 0))
        return self.text[: end - hold]

    def take_delta(self) -> tuple[str, list[int]]:
        """Text and ids not streamed yet (OpenAI chunks)."""
        text = self.visible_text()
        delta, self.sent_chars = text[self.sent_chars:], max(self.sent_chars, len(text))
        ids, self.sent_ids = self.ids[self.sent_ids:], len(self.ids)
        return delta, ids


async def _each_update(gens: list[Generation]) -> AsyncIterator[int]:
    """Yield the index of a generation after each of its Events, until all have finished."""
    pending = {asyncio.ensure_future(g.advance()): i for i, g in enumerate(gens) if not g.finished}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                task.result()
                yield i
                if not gens[i].finished:
                    pending[asyncio.ensure_future(gens[i].advance())] = i
    finally:
        for task in pending:
            task.cancel()


@contextlib.asynccontextmanager
async def _abort_on_disconnect(request: Request, gens: list[Generation]):
    """Abort the requests when the client goes away; abort unfinished ones on any exit."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for g in gens:
            g.stream.cancel("client disconnected")

    watcher = asyncio.ensure_future(watch())
    try:
        yield
    finally:
        watcher.cancel()
        for g in gens:
            g.stream.close()


# ------------------------------------------------------------------ the app
def create_app(async_engine: AsyncEngine, *, model_name: str = "specdec", model_path: str | None = None,
               manage_lifecycle: bool = True) -> FastAPI:
    """``manage_lifecycle``: start the engine thread at app startup and stop it at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        if manage_lifecycle:
            async_engine.start()
        yield
        if manage_lifecycle:
            await asyncio.to_thread(async_engine.stop)

    app = FastAPI(title="specdec", lifespan=lifespan)
    app.add_exception_handler(HTTPError, _handler(lambda e: (e.status, e.message)))
    app.add_exception_handler(InvalidRequest, _handler(lambda e: (400, str(e))))
    app.add_exception_handler(EngineUnavailable, _handler(lambda e: (503, str(e))))
    app.add_exception_handler(StarletteHTTPException, _handler(lambda e: (e.status_code, str(e.detail))))
    ep = Endpoints(async_engine, model_name=model_name, model_path=model_path)
    app.post("/generate")(ep.generate)
    app.post("/v1/completions")(ep.completions)
    app.post("/v1/chat/completions")(ep.chat_completions)
    app.get("/health")(ep.health)
    app.get("/metrics")(ep.metrics)
    app.get("/get_model_info")(ep.model_info)
    app.get("/v1/models")(ep.models)
    return app


class Endpoints:
    """The request handlers of one app (``create_app`` routes to them)."""

    def __init__(self, async_engine: AsyncEngine, *, model_name: str, model_path: str | None) -> None:
        self.eng = async_engine
        self.tok = async_engine.tokenizer
        self.model_name = model_name
        self.model_path = model_path

    # ---------------------------------------------------------------- shared
    async def _start(self, prompts: list[dict], params: list[Any], stops: list[Stops]) -> list[Generation]:
        gens: list[Generation] = []
        try:
            for i, (prompt, p, s) in enumerate(zip(prompts, params, stops)):
                try:
                    stream = await self.eng.submit(**prompt, sampling_params=_with_stop_ids(p, s))
                except InvalidRequest as e:
                    raise InvalidRequest(f"prompt {i}: {e}" if len(prompts) > 1 else str(e)) from None
                gens.append(Generation(stream, self.tok, s))
        except BaseException:
            for g in gens:
                g.stream.close()
            raise
        return gens

    @staticmethod
    async def _run_to_end(request: Request, gens: list[Generation]) -> None:
        async with _abort_on_disconnect(request, gens):
            async for _ in _each_update(gens):
                pass
        failed = next((g for g in gens if g.error), None)
        if failed is not None:
            raise HTTPError(failed.error_status, failed.error)

    @staticmethod
    def _sse_response(request: Request, gens: list[Generation], chunks) -> StreamingResponse:
        """``chunks(i)``: the payloads after an update of generation i; ``chunks(None)``: the last ones."""

        async def body() -> AsyncIterator[str]:
            async with _abort_on_disconnect(request, gens):
                async for i in _each_update(gens):
                    if gens[i].error is not None:
                        yield _sse(error_body(gens[i].error_status, gens[i].error))
                        break
                    for payload in chunks(i):
                        yield _sse(payload)
                for payload in chunks(None):
                    yield _sse(payload)
                yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # ---------------------------------------------------------------- native
    def _native_out(self, g: Generation, *, streaming: bool = False) -> dict:
        out = {"output_ids": list(g.ids), "meta_info": g.meta_info if g.finished else g.partial_meta()}
        if self.tok is not None:
            out["text"] = g.visible_text() if streaming else g.text
        return out

    async def generate(self, request: Request):
        body = await _json_body(request)
        prompts, single = _native_prompts(body)
        params = body.get("sampling_params")
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise HTTPError(400, f"got {len(params)} sampling_params for {len(prompts)} prompts")
        stops = [parse_stops(p.get("stop"), self.tok, "sampling_params.stop") if isinstance(p, dict) else Stops()
                 for p in params]
        params = [{k: v for k, v in p.items() if k != "stop"} if isinstance(p, dict) else p for p in params]
        gens = await self._start(prompts, params, stops)
        if not body.get("stream"):
            await self._run_to_end(request, gens)
            outs = [self._native_out(g) for g in gens]
            return outs[0] if single else outs

        def chunks(i: int | None) -> list[dict]:
            if i is None:
                return []
            out = self._native_out(gens[i], streaming=True)
            return [out if single else {**out, "index": i}]

        return self._sse_response(request, gens, chunks)

    # ---------------------------------------------------------------- OpenAI
    async def completions(self, request: Request):
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: Request):
        return await self._openai(request, chat=True)

    def _openai_request(self, body: dict, *, chat: bool) -> tuple[list[dict], dict, Stops]:
        if body.get("n", 1) != 1:
            raise HTTPError(400, "n: only n = 1 is supported")
        if body.get("echo") or body.get("logprobs") not in (None, False, 0):
            raise HTTPError(400, "echo and logprobs are not supported")
        if chat:
            if self.tok is None:
                raise HTTPError(400, "this model has no tokenizer: /v1/chat/completions needs one "
                                     "(use /v1/completions with token-id prompts)")
            prompts = [{"text": render_chat(body.get("messages"), self.tok)}]
        else:
            prompts = _openai_prompts(body.get("prompt"))
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) if chat else body.get("max_tokens")
        params = {"max_new_tokens": max_tokens if max_tokens is not None else (128 if chat else 16),
                  **{k: body.get(k) for k in ("temperature", "top_p", "top_k", "min_p", "ignore_eos",
                                              "stop_token_ids")}}
        return prompts, params, parse_stops(body.get("stop"), self.tok)

    async def _openai(self, request: Request, *, chat: bool):
        body = await _json_body(request)
        prompts, params, stops = self._openai_request(body, chat=chat)
        gens = await self._start(prompts, [params] * len(prompts), [stops] * len(prompts))
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": ("chatcmpl-" if chat else "cmpl-") + gens[0].stream.rid, "object": kind,
                "created": int(time.time()), "model": self.model_name}
        if not body.get("stream"):
            await self._run_to_end(request, gens)
            choices = [{"index": i, "message": {"role": "assistant", "content": g.text}} if chat
                       else {"index": i, "text": g.text, "logprobs": None} for i, g in enumerate(gens)]
            for c, g in zip(choices, gens):
                c.update(finish_reason=g.finish_reason, token_ids=list(g.ids))
            return {**head, "choices": choices, "usage": _usage(gens)}
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return self._sse_response(request, gens, _openai_chunker(
            gens, {**head, "object": kind + ".chunk" if chat else kind}, chat=chat, include_usage=include_usage))

    # ---------------------------------------------------------------- status
    async def health(self):
        if not (self.eng.accepting and self.eng.alive):
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return {"status": "ok"}

    async def metrics(self):
        return Response(self.eng.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def model_info(self):
        return {"model_path": self.model_path, "served_model_name": self.model_name, "is_generation": True,
                "context_length": self.eng.context_length, "vocab_size": self.eng.vocab_size,
                "has_tokenizer": self.tok is not None, "speculative_algorithm": self.eng.speculative_algorithm,
                "chat_template": "tokenizer" if getattr(self.tok, "chat_template", None) else FALLBACK_CHAT_TEMPLATE}

    async def models(self):
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "specdec",
                                            "max_model_len": self.eng.context_length}]}


def _usage(gens: list[Generation]) -> dict:
    prompt = sum(g.stream.prompt_tokens for g in gens)
    completion = sum(len(g.ids) for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _openai_chunker(gens: list[Generation], head: dict, *, chat: bool, include_usage: bool):
    """OpenAI stream chunks: deltas per update; chat opens each choice with the assistant role."""
    opened: set[int] = set()

    def chunks(i: int | None) -> list[dict]:
        if i is None:
            return [{**head, "choices": [], "usage": _usage(gens)}] if include_usage else []
        g = gens[i]
        text, ids = g.take_delta()
        out = []
        if chat and i not in opened:
            opened.add(i)
            out.append({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None}]})
        if text or ids or g.finished:
            choice = {"index": i, "delta": {"content": text}} if chat else {"index": i, "text": text, "logprobs": None}
            out.append({**head, "choices": [{**choice, "finish_reason": g.finish_reason, "token_ids": ids}]})
        return out

    return chunks


class GracefulServer(uvicorn.Server):
    """uvicorn.Server whose first exit signal drains the engine before uvicorn's own shutdown."""

    def __init__(self, config: uvicorn.Config, async_engine, *, drain_timeout: float) -> None:
        super().__init__(config)
        self.async_engine = async_engine
        self.drain_timeout = drain_timeout
        self.draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Future | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Thread-safe (signal handlers and tests call it from outside the event loop)."""
        if self.draining or self._loop is None or self._loop.is_closed():
            super().handle_exit(sig, frame)
            return
        self.draining = True  # NOTE: the signal is not re-raised after a drain: the exit status is 0
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            aborted = await self.async_engine.drain(self.drain_timeout)
            if aborted:
                logger.warning("shutdown: aborted %d request(s) still running after %.1f s",
                               aborted, self.drain_timeout)
        finally:
            self.should_exit = True


def serve(args) -> None:
    """Build the engine from parsed ``specdec serve`` flags and serve until a shutdown signal."""
    from specdec.engine.engine import Engine
    from specdec.server.args import engine_kwargs

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    async_engine = AsyncEngine(Engine(**engine_kwargs(args)))
    app = create_app(async_engine, model_name=args.served_model_name or args.model_path, model_path=args.model_path)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, timeout_keep_alive=5,
                            timeout_graceful_shutdown=5)
    GracefulServer(config, async_engine, drain_timeout=args.shutdown_timeout).run()


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def _native_prompts(body: dict) -> tuple[list[dict], bool]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise HTTPError(400, "give exactly one of text or input_ids")
    if isinstance(text, str):
        return [{"text": text}], True
    if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        return [{"text": t} for t in text], False
    if text is not None:
        raise HTTPError(400, "text must be a string or a non-empty list of strings")
    if _is_ids(ids) and ids:
        return [{"input_ids": ids}], True
    if isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids):
        return [{"input_ids": x} for x in ids], False
    raise HTTPError(400, "input_ids must be a non-empty list of token ids or a list of such lists")


def _openai_prompts(prompt: Any) -> list[dict]:
    if isinstance(prompt, str):
        return [{"text": prompt}]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [{"text": p} for p in prompt]
        if _is_ids(prompt):
            return [{"input_ids": prompt}]
        if all(isinstance(p, list) for p in prompt):
            return [{"input_ids": p} for p in prompt]
    raise HTTPError(400, "prompt is required: a string, a list of strings, a list of token ids, or a list of those")
