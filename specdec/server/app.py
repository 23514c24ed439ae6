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

Stops: integers are token ids (added to ``stop_token_ids``). Strings go to the engine
(``sampling_params.stop``), which ends the request with the token that completes one in the decoded
output (``specdec.engine.stop_strings``): ``output_ids``, logprobs and ``completion_tokens`` end with
that token, ``meta_info`` is complete (accept statistics included), and the text is cut before the
stop string. Streams hold back text that could be the start of a stop string. Strings need a
tokenizer.

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
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.engine.args import EngineArgs
from specdec.engine.gc_heap import frozen_heap
from specdec.server import openapi
from specdec.server.async_engine import AsyncEngine, EngineUnavailable, InvalidRequest
from specdec.server.openai_api import (
    UnsupportedRequest,
    chat_logprobs,
    completion_logprobs,
    native_logprobs,
    sampling_params,
    seeds,
)
from specdec.server.protocol import (
    Generation,
    HTTPError,
    Stops,
    abort_on_disconnect,
    each_update,
    error_body,
    error_handler,
    native_prompts,
    openai_prompts,
    parse_stops,
    render_chat,
    sse,
    with_stops,
)
from specdec.server.schemas import ChatCompletionRequest, CompletionRequest, GenerateRequest
from specdec.server.service_routes import ServiceRoutes
from specdec.server.settings import ServerSettings

logger = logging.getLogger(__name__)


def with_rids(prompts: list[dict], rid: str | None) -> list[dict]:
    """The client's ``rid`` on each request: as it is for one, "{rid}_{i}" for request i of several
    (SGLang's names: a batch, or OpenAI's choices)."""
    if rid is None:
        return prompts
    return [{**p, "rid": rid if len(prompts) == 1 else f"{rid}_{i}"} for i, p in enumerate(prompts)]


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

    # NOTE: a body without a Content-Type is read as JSON (curl -d, older clients)
    app = FastAPI(title="specdec", lifespan=lifespan, strict_content_type=False)
    app.add_exception_handler(HTTPError, error_handler(lambda e: (e.status, e.message)))
    app.add_exception_handler(InvalidRequest, error_handler(lambda e: (400, str(e))))
    app.add_exception_handler(UnsupportedRequest, error_handler(lambda e: (400, str(e))))
    app.add_exception_handler(EngineUnavailable, error_handler(lambda e: (503, str(e))))
    app.add_exception_handler(RequestValidationError, error_handler(lambda e: (400, validation_message(e))))

    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        # NOTE: keeps Starlette's headers: a 405 answer carries Allow
        return JSONResponse(error_body(e.status_code, str(e.detail)), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    app.add_exception_handler(StarletteHTTPException, http_error)
    ep = Endpoints(async_engine, model_name=model_name, model_path=model_path)
    sv = ServiceRoutes(async_engine, model_name=model_name, model_path=model_path)
    docs = openapi.route_docs()
    for path, handler in (("/generate", ep.generate), ("/v1/completions", ep.completions),
                          ("/v1/chat/completions", ep.chat_completions), ("/abort_request", sv.abort_request),
                          ("/tokenize", sv.tokenize), ("/v1/tokenize", sv.tokenize),
                          ("/detokenize", sv.detokenize), ("/v1/detokenize", sv.detokenize)):
        app.post(path, response_model=None, **docs[path])(handler)
    for path, handler in (("/health", sv.health), ("/health_generate", sv.health_generate), ("/metrics", sv.metrics),
                          ("/get_model_info", sv.model_info), ("/get_server_info", sv.server_info),
                          ("/v1/models", sv.models)):
        app.get(path, response_model=None, **docs[path])(handler)
    # NOTE: SGLang's /flush_cache takes GET and POST: one route, so a 405 lists both (openapi gives
    # each method its own operationId)
    app.api_route("/flush_cache", methods=["GET", "POST"], response_model=None, **docs["/flush_cache"])(sv.flush_cache)
    app.openapi = lambda: openapi.document(app, vocab_size=async_engine.vocab_size,
                                           context_length=async_engine.context_length)
    return app


def validation_message(e: RequestValidationError) -> str:
    """A 400 message naming the first invalid field (``sampling_params.temperature: ...``)."""
    errors = e.errors()
    if not errors:
        return "invalid request body"
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('msg')}"
    if not loc:
        return f"the JSON body must be an object: {first.get('msg')}"
    field = ".".join(loc)
    if first.get("type") == "missing":
        return f"{field} is required"
    more = len({tuple(x.get("loc", ())[:2]) for x in errors}) - 1
    return f"{field}: {first.get('msg')}" + (f" (and {more} more problem(s))" if more > 0 else "")


class Endpoints:
    """The generation routes of one app (``create_app`` routes to them; the rest are
    ``service_routes.ServiceRoutes``)."""

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
                    stream = await self.eng.submit(**prompt, sampling_params=with_stops(p, s))
                except InvalidRequest as e:
                    raise InvalidRequest(f"prompt {i}: {e}" if len(prompts) > 1 else str(e)) from None
                # NOTE: the engine accepted p, so a min_new_tokens in it is a valid int
                min_new = p.get("min_new_tokens") if isinstance(p, dict) else None
                gens.append(Generation(stream, self.tok, s, min_new_tokens=min_new or 0))
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
    def _native_out(self, g: Generation, *, streaming: bool = False, with_text: bool = False) -> dict:
        meta = dict(g.meta_info) if g.finished else g.partial_meta()
        if g.stream.wants_logprobs:
            tops = g.top_logprobs if g.stream.top_logprobs_num else None
            meta["output_token_logprobs"], meta["output_top_logprobs"] = native_logprobs(
                self.tok, g.ids, g.logprobs, tops, with_text=with_text)
        if "input_token_logprobs" in meta and g.finished:
            prompt = g.stream.prompt_ids[len(g.stream.prompt_ids) - len(meta["input_token_logprobs"]):]
            tops = meta["input_top_logprobs"] if g.stream.top_logprobs_num else None
            meta["input_token_logprobs"], meta["input_top_logprobs"] = native_logprobs(
                self.tok, prompt, meta["input_token_logprobs"], tops, with_text=with_text)
        out = {"output_ids": list(g.ids), "meta_info": meta}
        if self.tok is not None:
            out["text"] = g.visible_text() if streaming else g.text
        return out

    async def generate(self, body: GenerateRequest, request: Request):
        prompts, single = native_prompts(body.text, body.input_ids)
        prompts = with_rids(prompts, body.rid)
        params = body.sampling_params
        params = params if isinstance(params, list) else [params] * len(prompts)
        params = params * len(prompts) if len(params) == 1 else params  # one list entry serves all
        if len(params) != len(prompts):
            raise HTTPError(400, f"got {len(params)} sampling_params for {len(prompts)} prompts")
        dicts = [p.model_dump(exclude_none=True) if p is not None else {} for p in params]
        for d in dicts:
            self._check_max_tokens("sampling_params.max_new_tokens", d.get("max_new_tokens"))
        stops = [parse_stops(d.pop("stop", None), self.tok, "sampling_params.stop") for d in dicts]
        if body.return_logprob or body.top_logprobs_num:
            logprob = {"return_logprob": True, "top_logprobs_num": body.top_logprobs_num or 0}
            if body.logprob_start_len is not None and body.logprob_start_len >= 0:
                logprob["logprob_start_len"] = body.logprob_start_len
            dicts = [{**d, **logprob} for d in dicts]
        gens = await self._start(prompts, dicts, stops)
        with_text = bool(body.return_text_in_logprobs)
        if not body.stream:
            await self._run_to_end(request, gens)
            outs = [self._native_out(g, with_text=with_text) for g in gens]
            return outs[0] if single else outs

        def chunks(i: int | None) -> list[dict]:
            if i is None:
                return []
            out = self._native_out(gens[i], streaming=True, with_text=with_text)
            return [out if single else {**out, "index": i}]

        return self._sse_response(request, gens, chunks)

    # ---------------------------------------------------------------- OpenAI
    async def completions(self, body: CompletionRequest, request: Request):
        return await self._openai(request, body, chat=False)

    async def chat_completions(self, body: ChatCompletionRequest, request: Request):
        return await self._openai(request, body, chat=True)

    def _check_max_tokens(self, field: str, value: int | None) -> None:
        """One above the context length is a 400; one past what the prompt leaves is cut to fit."""
        if value is not None and value > self.eng.context_length:
            raise HTTPError(400, f"{field} ({value}) exceeds the context length {self.eng.context_length}")

    def _openai_prompts(self, body, *, chat: bool) -> list[dict]:
        if not chat:
            return openai_prompts(body.prompt)
        if self.tok is None:
            raise HTTPError(400, "this model has no tokenizer: /v1/chat/completions needs one "
                                 "(use /v1/completions with token-id prompts)")
        return [{"text": render_chat([m.model_dump(exclude_none=True) for m in body.messages], self.tok)}]

    async def _openai(self, request: Request, body, *, chat: bool):
        self._check_max_tokens("max_tokens", body.max_tokens)
        if chat:
            self._check_max_tokens("max_completion_tokens", body.max_completion_tokens)
        prompts = self._openai_prompts(body, chat=chat)
        params, stops, n = sampling_params(body, chat=chat), parse_stops(body.stop, self.tok), body.n or 1
        per_choice = [{**params, **({"sampling_seed": s} if s is not None else {})} for s in seeds(body, n)]
        # choice index = prompt * n + sample (OpenAI's order)
        choice_prompts = with_rids([p for p in prompts for _ in range(n)], body.rid)
        gens = await self._start(choice_prompts, per_choice * len(prompts), [stops] * (n * len(prompts)))
        echo = [self._echo_text(p) if not chat and body.echo else "" for p in prompts for _ in range(n)]
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": ("chatcmpl-" if chat else "cmpl-") + gens[0].stream.rid, "object": kind,
                "created": int(time.time()), "model": self.model_name}
        fmt = _LogprobFormatter(self.tok, chat=chat, echo=not chat and bool(body.echo))
        if not body.stream:
            await self._run_to_end(request, gens)
            choices = []
            for i, (g, e) in enumerate(zip(gens, echo)):
                c = {"index": i, "message": {"role": "assistant", "content": g.text}} if chat \
                    else {"index": i, "text": e + g.text}
                c.update(logprobs=fmt.whole(g), finish_reason=g.finish_reason, token_ids=list(g.ids))
                choices.append(c)
            return {**head, "choices": choices, "usage": _usage(gens)}
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return self._sse_response(request, gens, _openai_chunker(
            gens, {**head, "object": kind + ".chunk" if chat else kind}, chat=chat, include_usage=include_usage,
            echo=echo, fmt=fmt))

    def _echo_text(self, prompt: dict) -> str:
        if "text" in prompt:
            return prompt["text"]
        return self.tok.decode(prompt["input_ids"]) if self.tok is not None else ""


class _LogprobFormatter:
    """OpenAI logprobs objects of a generation: the whole of it, or the delta just streamed."""

    def __init__(self, tok: Any, *, chat: bool, echo: bool) -> None:
        self.tok, self.chat, self.echo = tok, chat, echo

    def whole(self, g: Generation) -> dict | None:
        if not g.stream.wants_logprobs:
            return None
        return self._format(g, 0, len(g.ids), with_prompt=self.echo)

    def delta(self, g: Generation, *, first: bool) -> dict | None:
        if not g.stream.wants_logprobs:
            return None
        return self._format(g, g.delta_start, g.sent_ids, with_prompt=self.echo and first)

    def _format(self, g: Generation, start: int, end: int, *, with_prompt: bool) -> dict:
        ids, lps, tops = g.ids[start:end], g.logprobs[start:end], g.top_logprobs[start:end]
        context = g.stream.prompt_ids + g.ids[:start]
        if self.chat:
            return chat_logprobs(self.tok, ids, lps, tops, context=context)
        out = completion_logprobs(self.tok, ids, lps, tops, context=context)
        if with_prompt and g.meta_info and "input_token_logprobs" in g.meta_info:
            prompt = completion_logprobs(self.tok, g.stream.prompt_ids, g.meta_info["input_token_logprobs"],
                                         g.meta_info["input_top_logprobs"])
            shift = sum(len(t) for t in prompt["tokens"])
            out = {k: prompt[k] + (out[k] if k != "text_offset" else [o + shift for o in out[k]]) for k in out}
        return out


def _usage(gens: list[Generation]) -> dict:
    prompt = sum(g.stream.prompt_tokens for g in gens)
    completion = sum(len(g.ids) for g in gens)
    # prompt tokens the prefix cache supplied (also for a request cut at a stop string)
    cached = sum((g.meta_info or {}).get("cached_tokens", 0) for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _openai_chunker(gens: list[Generation], head: dict, *, chat: bool, include_usage: bool, echo: list[str],
                    fmt: _LogprobFormatter):
    """OpenAI stream chunks: deltas per update; chat opens each choice with the assistant role,
    completions with echo put the prompt's text in the choice's first chunk."""
    opened: set[int] = set()

    def chunks(i: int | None) -> list[dict]:
        if i is None:
            return [{**head, "choices": [], "usage": _usage(gens)}] if include_usage else []
        g = gens[i]
        text, ids = g.take_delta()
        out = []
        first = i not in opened
        if chat and first:
            out.append({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]})
        opened.add(i)
        if text or ids or g.finished:
            choice = {"index": i, "delta": {"content": text}} if chat \
                else {"index": i, "text": (echo[i] if first else "") + text}
            # NOTE: streamed echo + logprobs: the prompt's logprobs are known at the request's end
            # only, so they lead the last chunk's logprobs
            choice["logprobs"] = fmt.delta(g, first=g.finished)
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
    engine = Engine(args=engine_args)
    try:
        async_engine = AsyncEngine(engine)
        app = create_app(async_engine, model_name=settings.served_model_name or engine_args.model_path,
                         model_path=engine_args.model_path)
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                                timeout_keep_alive=5, timeout_graceful_shutdown=5)
        with frozen_heap():  # the built engine and app kept out of the collector's passes
            GracefulServer(config, async_engine, drain_timeout=settings.shutdown_timeout).run()
    finally:
        # NOTE: the app's lifespan has stopped the engine thread; this releases the CUDA graphs and
        # stops the tensor-parallel workers (their NCCL teardown needs both)
        engine.shutdown()
