"""HTTP server: SGLang's native ``/generate`` and OpenAI-compatible endpoints over one EngineClient.

    POST /generate              {"text" | "input_ids" (one or a batch), "sampling_params" (one or per
                                prompt; SGLang keys plus "stop"), "stream"} → {"text", "output_ids",
                                "meta_info"} (a list for a batch)
    POST /v1/completions        OpenAI: model, prompt (str, [str], [int], [[int]]), max_tokens (16),
                                temperature, top_p, top_k / min_p / ignore_eos / stop_token_ids
                                (extensions), stop, stream, stream_options.include_usage
    POST /v1/chat/completions   the same with messages; max_tokens / max_completion_tokens (128)
    GET  /health  /metrics  /get_model_info  /v1/models

Streaming is Server-Sent Events: ``data: {json}\\n\\n`` per engine step that committed tokens (a
speculative step's k + 1 tokens arrive together; the steps since the last chunk together, when the
server streams slower than the engine steps), ending ``data: [DONE]\\n\\n``. Native chunks carry
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
from types import FrameType

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.engine.args import EngineArgs
from specdec.engine.gc_heap import frozen_heap
from specdec.server import openapi
from specdec.server.async_engine import EngineClient, EngineUnavailable, InvalidRequest
from specdec.server.engine_process import EngineStartError, ProcessEngine
from specdec.server.generation_routes import GenerationRoutes
from specdec.server.openai_api import UnsupportedRequest
from specdec.server.protocol import HTTPError, error_body, error_handler
from specdec.server.service_routes import ServiceRoutes
from specdec.server.settings import ServerSettings

logger = logging.getLogger(__name__)


def create_app(async_engine: EngineClient, *, model_name: str = "specdec", model_path: str | None = None,
               manage_lifecycle: bool = True) -> FastAPI:
    """``manage_lifecycle``: start the engine client at app startup and stop it at shutdown."""

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
    ep = GenerationRoutes(async_engine, model_name=model_name, model_path=model_path)
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
    # NOTE: SGLang's /flush_cache and profile routes take GET and POST: one route each, so a 405 lists
    # both (openapi gives each method its own operationId)
    for path, handler in (("/flush_cache", sv.flush_cache), ("/start_profile", sv.start_profile),
                          ("/stop_profile", sv.stop_profile)):
        app.api_route(path, methods=["GET", "POST"], response_model=None, **docs[path])(handler)
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
    """Start the engine's process, then serve it until a shutdown signal."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        async_engine = ProcessEngine(engine_args, stream_interval=settings.stream_interval,
                                     log_level=settings.log_level)
    except EngineStartError as e:
        raise SystemExit(f"specdec serve: the engine did not start: {e}") from None
    try:
        app = create_app(async_engine, model_name=settings.served_model_name or engine_args.model_path,
                         model_path=engine_args.model_path)
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                                timeout_keep_alive=5, timeout_graceful_shutdown=5)
        server = GracefulServer(config, async_engine, drain_timeout=settings.shutdown_timeout)
        # a failed tensor-parallel rank (or node), or the engine's process gone, stops the server, with the cause
        async_engine.on_failure = lambda _: setattr(server, "should_exit", True)
        with frozen_heap():  # the app kept out of the collector's passes
            server.run()
        if async_engine.failure is not None:
            raise SystemExit(f"specdec serve: stopped: {async_engine.failure}")
    finally:
        async_engine.stop()  # NOTE: the app's lifespan has stopped it unless uvicorn never started
