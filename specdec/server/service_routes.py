"""The server's routes around generation: probes, model and server facts, the tokenizer, the
prefix cache and aborts (SGLang's native routes and OpenAI's /v1/models). ``app.create_app``
registers them beside the generation routes (``generation_routes.GenerationRoutes``); like those,
they reach the engine only through the ``EngineClient``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata

from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from specdec.server.async_engine import EngineClient, EngineUnavailable, InvalidRequest
from specdec.server.profiler import ProfileConflict, ProfileOptions
from specdec.server.protocol import FALLBACK_CHAT_TEMPLATE, HTTPError
from specdec.server.schemas import AbortRequest, DetokenizeRequest, ProfileRequest, TokenizeRequest, set_fields

HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's /health_generate waits about this long


def _version() -> str:
    """The installed specdec's version (the package root is above the server's imports)."""
    try:
        return importlib.metadata.version("specdec")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree (PYTHONPATH)
        return "unknown"


class ServiceRoutes:
    """The handlers of the routes around generation (``app.create_app`` routes to them)."""

    def __init__(self, async_engine: EngineClient, *, model_name: str, model_path: str | None) -> None:
        self.eng = async_engine
        self.tok = async_engine.tokenizer
        self.model_name = model_name
        self.model_path = model_path

    async def health(self):
        if not (self.eng.accepting and self.eng.alive):
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return {"status": "ok"}

    async def tokenize(self, body: TokenizeRequest):
        """SGLang's / vLLM's /tokenize: ``tokens``, ``count`` and ``max_model_len`` (lists of
        them for a list of prompts)."""
        tok = self._tokenizer("prompt")
        add_bos = body.add_special_tokens is not False
        try:
            if isinstance(body.prompt, str):
                ids = tok.encode(body.prompt, add_bos=add_bos)
                return {"tokens": ids, "count": len(ids), "max_model_len": self.eng.context_length}
            ids = [tok.encode(p, add_bos=add_bos) for p in body.prompt]
        except (ValueError, TypeError) as e:  # text this tokenizer cannot encode
            raise HTTPError(400, f"prompt: {e}") from None
        return {"tokens": ids, "count": [len(x) for x in ids], "max_model_len": self.eng.context_length}

    async def detokenize(self, body: DetokenizeRequest):
        """SGLang's /detokenize: ``text`` (a list of texts for a list of id lists)."""
        tok = self._tokenizer("tokens")
        nested = bool(body.tokens) and isinstance(body.tokens[0], list)
        for ids in body.tokens if nested else [body.tokens]:
            if any(t >= self.eng.vocab_size for t in ids):
                raise HTTPError(400, f"tokens: ids must be below the vocab size {self.eng.vocab_size}")
        if nested:
            return {"text": [tok.decode(ids) for ids in body.tokens]}
        return {"text": tok.decode(body.tokens)}

    def _tokenizer(self, field: str):
        if self.tok is None:
            raise HTTPError(400, f"{field}: this model has no tokenizer")
        return self.tok

    async def health_generate(self):
        """SGLang's /health_generate: 200 once a one-token request went through the engine; 503 if
        the server is not serving or the request did not finish within HEALTH_GENERATE_TIMEOUT_S."""
        async def one_token() -> bool:
            stream = await self.eng.submit(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0})
            try:
                while not stream.finished:
                    if (await stream.next_event()).error is not None:
                        return False
                return True
            finally:
                stream.close()

        try:
            serving = self.eng.accepting and self.eng.alive
            ok = serving and await asyncio.wait_for(one_token(), HEALTH_GENERATE_TIMEOUT_S)
        except (EngineUnavailable, InvalidRequest, asyncio.TimeoutError):
            ok = False
        return {"status": "ok"} if ok else JSONResponse({"status": "unavailable"}, status_code=503)

    async def server_info(self):
        """SGLang's /get_server_info: the engine's arguments (SGLang's flag names), the KV pool as
        built (``max_total_tokens`` is its size) and the version."""
        return {**self.eng.engine_args, **self.eng.memory_info, "served_model_name": self.model_name,
                "version": _version()}

    async def metrics(self):
        return Response(await self.eng.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    async def model_info(self):
        return {"model_path": self.model_path, "served_model_name": self.model_name, "is_generation": True,
                "context_length": self.eng.context_length, "vocab_size": self.eng.vocab_size,
                "has_tokenizer": self.tok is not None, "speculative_algorithm": self.eng.speculative_algorithm,
                "chat_template": "tokenizer" if getattr(self.tok, "chat_template", None) else FALLBACK_CHAT_TEMPLATE,
                **self.eng.memory_info}

    async def abort_request(self, body: AbortRequest):
        """SGLang's /abort_request: the request's stream ends now with its tokens so far and
        ``finish_reason`` "abort"; a finished or unknown rid is left alone (200 either way)."""
        if not body.abort_all and body.rid is None:
            raise HTTPError(400, "give rid (a request's meta_info.id) or abort_all: true")
        self.eng.abort_request(None if body.abort_all else body.rid)
        return {}

    async def flush_cache(self):
        """SGLang's /flush_cache: drop every cached KV page no request uses. Unlike SGLang, it does
        not refuse while requests run: theirs stay (they are locked), the rest goes."""
        pages = await self.eng.flush_cache()
        return PlainTextResponse(f"Cache flushed: {pages} page(s) freed.\n")

    async def start_profile(self, body: ProfileRequest | None = None):
        """SGLang's /start_profile: profile the engine's next steps into files
        (``specdec.server.profiler``); 400 naming a field it cannot honor, 409 while one runs."""
        fields = set_fields(body) if body is not None else {}
        fields.pop("merge_profiles", None), fields.pop("profile_by_stage", None)  # at their no-op value
        try:
            return PlainTextResponse(await self.eng.start_profile(ProfileOptions(**fields)))
        except ProfileConflict as e:
            raise HTTPError(409, str(e)) from None
        except ValueError as e:
            raise HTTPError(400, str(e)) from None

    async def stop_profile(self):
        """SGLang's /stop_profile: end the profile and write it; the files, one a line (409: none runs)."""
        try:
            files = await self.eng.stop_profile()
        except ProfileConflict as e:
            raise HTTPError(409, str(e)) from None
        return PlainTextResponse("Stop profiling. Written:\n" + "".join(f"{f}\n" for f in files)
                                 if files else "Stop profiling: it had not begun (start_step), nothing written.\n")

    async def models(self):
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "specdec",
                                            "max_model_len": self.eng.context_length}]}
