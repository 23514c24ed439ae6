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

from specdec.engine.args import EngineArgs
from specdec.server.async_engine import AsyncEngine, EngineUnavailable, InvalidRequest
from specdec.server.protocol import (
    FALLBACK_CHAT_TEMPLATE,
    Generation,
    HTTPError,
    Stops,
    abort_on_disconnect,
    each_update,
    error_body,
    error_handler,
    json_body,
    native_prompts,
    openai_prompts,
    parse_stops,
    render_chat,
    sse,
    with_stop_ids,
)
from specdec.server.settings import ServerSettings

logger = logging.getLogger(__name__)
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
    app.add_exception_handler(HTTPError, error_handler(lambda e: (e.status, e.message)))
    app.add_exception_handler(InvalidRequest, error_handler(lambda e: (400, str(e))))
    app.add_exception_handler(EngineUnavailable, error_handler(lambda e: (503, str(e))))
    app.add_exception_handler(StarletteHTTPException, error_handler(lambda e: (e.status_code, str(e.detail))))
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
                    stream = await self.eng.submit(**prompt, sampling_params=with_stop_ids(p, s))
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
        async with abort_on_disconnect(request, gens):
            async for _ in each_update(gens):
                pass
        failed = next((g for g in gens if g.error), None)
        if failed is not None:
            raise HTTPError(failed.error_status, failed.error)

    @staticmethod
    def _sse_response(request: Request, gens: list[Generation], chunks) -> StreamingResponse:
        """``chunks(i)``: the payloads after an update of generation i; ``chunks(None)``: the last ones."""

        async def body() -> AsyncIterator[str]:
            async with abort_on_disconnect(request, gens):
                async for i in each_update(gens):
                    if gens[i].error is not None:
                        yield sse(error_body(gens[i].error_status, gens[i].error))
                        break
                    for payload in chunks(i):
                        yield sse(payload)
                for payload in chunks(None):
                    yield sse(payload)
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
        body = await json_body(request)
        prompts, single = native_prompts(body)
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
            prompts = openai_prompts(body.get("prompt"))
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) if chat else body.get("max_tokens")
        params = {"max_new_tokens": max_tokens if max_tokens is not None else (128 if chat else 16),
                  **{k: body.get(k) for k in ("temperature", "top_p", "top_k", "min_p", "ignore_eos",
                                              "stop_token_ids")}}
        return prompts, params, parse_stops(body.get("stop"), self.tok)

    async def _openai(self, request: Request, *, chat: bool):
        body = await json_body(request)
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
                "chat_template": "tokenizer" if getattr(self.tok, "chat_template", None) else FALLBACK_CHAT_TEMPLATE,
                **self.eng.memory_info}

    async def models(self):
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "specdec",
                                            "max_model_len": self.eng.context_length}]}


def _usage(gens: list[Generation]) -> dict:
    prompt = sum(g.stream.prompt_tokens for g in gens)
    completion = sum(len(g.ids) for g in gens)
    # prompt tokens the prefix cache supplied (known once a request finished)
    cached = sum((g.meta_info or {}).get("cached_tokens", 0) for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


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


def serve(settings: ServerSettings, engine_args: EngineArgs) -> None:
    """Build the engine and serve it until a shutdown signal."""
    from specdec.engine.engine import Engine

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    async_engine = AsyncEngine(Engine(args=engine_args))
    app = create_app(async_engine, model_name=settings.served_model_name or engine_args.model_path,
                     model_path=engine_args.model_path)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            timeout_keep_alive=5, timeout_graceful_shutdown=5)
    GracefulServer(config, async_engine, drain_timeout=settings.shutdown_timeout).run()
