"""The OpenAPI document: routes with their request / response models, errors, and model limits.

``route_docs`` gives each route its ``responses`` (200 JSON or SSE, the 400 / 500 / 503 error
body, ``/metrics``' Prometheus text). ``document`` post-processes FastAPI's output so it tells the
truth: the server answers 400 (never 422) to a body that fails validation, and the limits that
depend on the loaded model are filled in: token ids below the vocab size (also as the pattern of
``logit_bias`` keys), ``max_tokens`` at most the context length, token prompts shorter than it.
"""

from __future__ import annotations

import warnings

from typing import Any, Union

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST

from specdec.server.responses import (
    ChatCompletionResponse,
    CompletionResponse,
    ErrorResponse,
    GenerateResponse,
    Health,
    ModelInfo,
    ModelList,
)

# each event: `data: {json chunk}` per engine step, the last one `data: [DONE]`
_SSE = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"], "properties": {"data": {"type": "string"}},
    "description": "One Server-Sent Event: data is a JSON chunk (the route's result shape, with deltas "
                   "for OpenAI routes), or [DONE] last"}}}
_ERRORS = {
    400: {"model": ErrorResponse, "description": "Invalid request: the message names the field or the reason"},
    500: {"model": ErrorResponse, "description": "The engine failed while running this request"},
    503: {"model": ErrorResponse, "description": "The server is shutting down"},
}


def route_docs() -> dict[str, dict[str, Any]]:
    """Keyword arguments of ``app.post`` / ``app.get`` per path."""
    return {
        "/generate": dict(responses={200: {"model": Union[GenerateResponse, list[GenerateResponse]],
                                           "content": _SSE, "description": "One result, or a list for a batch"},
                                     **_ERRORS}),
        "/v1/completions": dict(responses={200: {"model": CompletionResponse, "content": _SSE}, **_ERRORS}),
        "/v1/chat/completions": dict(responses={200: {"model": ChatCompletionResponse, "content": _SSE},
                                                **_ERRORS}),
        "/health": dict(responses={200: {"model": Health}, 503: {"model": Health, "description": "Not serving"}}),
        "/metrics": dict(responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                                          "description": "Prometheus text exposition format"}}),
        "/health_generate": dict(responses={200: {"model": Health},
                                            503: {"model": Health, "description": "No token came back in time"}}),
        "/get_model_info": dict(responses={200: {"model": ModelInfo}}),
        "/get_server_info": dict(responses={200: {"content": {"application/json": {"schema": {"type": "object"}}},
                                                  "description": "Engine arguments, KV pool and version"}}),
        "/v1/models": dict(responses={200: {"model": ModelList}}),
        "/abort_request": dict(responses={
            200: {"description": "Aborted (or already finished / unknown: nothing to do); an empty object",
                  "content": {"application/json": {"schema": {"type": "object", "maxProperties": 0}}}},
            400: {"model": ErrorResponse, "description": "Neither rid nor abort_all"}}),
        **{path: dict(responses={200: {"content": {"application/json": {"schema": {"type": "object"}}},
                                       "description": "tokens, count, max_model_len"}, 400: _ERRORS[400]})
           for path in ("/tokenize", "/v1/tokenize")},
        **{path: dict(responses={200: {"content": {"application/json": {"schema": {"type": "object"}}},
                                       "description": "text"}, 400: _ERRORS[400]})
           for path in ("/detokenize", "/v1/detokenize")},
        "/flush_cache": dict(responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                              "description": "How many cached KV pages were freed"},
                                        503: {"model": ErrorResponse, "description": "The engine is not running"}}),
        "/start_profile": dict(responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                                "description": "What will be profiled, and where"},
                                          400: {"model": ErrorResponse, "description": "A field it cannot honor"},
                                          409: {"model": ErrorResponse, "description": "A profile already runs"}}),
        "/stop_profile": dict(responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                               "description": "The files written, one a line"},
                                         409: {"model": ErrorResponse, "description": "No profile runs"}}),
    }


def document(app: FastAPI, *, vocab_size: int, context_length: int) -> dict:
    """The app's OpenAPI document (built once), truthful about errors and this model's limits."""
    if app.openapi_schema is None:
        with warnings.catch_warnings():  # NOTE: a route of two methods has one id; made unique below
            warnings.filterwarnings("ignore", message="Duplicate Operation ID", category=UserWarning)
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for name, path in doc.get("paths", {}).items():
            for method, op in path.items():
                if len(path) > 1 and "operationId" in op:
                    op["operationId"] = f"{op['operationId'].rsplit('_', 1)[0]}_{method}"
                op.get("responses", {}).pop("422", None)
                if name in ("/metrics", "/flush_cache", "/start_profile", "/stop_profile"):  # text only
                    op["responses"]["200"]["content"].pop("application/json", None)
        schemas = doc.get("components", {}).get("schemas", {})
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        _fill_limits(doc, vocab_size=vocab_size, context_length=context_length)
        app.openapi_schema = doc
    return app.openapi_schema


def _fill_limits(node: Any, *, vocab_size: int, context_length: int) -> None:
    if isinstance(node, list):
        for x in node:
            _fill_limits(x, vocab_size=vocab_size, context_length=context_length)
        return
    if not isinstance(node, dict):
        return
    if node.pop("x-token-id", None):
        node["maximum"] = vocab_size - 1
    if node.pop("x-token-id-key", None):
        node["pattern"] = "^(" + range_regex(vocab_size - 1) + ")$"
    if node.pop("x-context-tokens", None):
        node["maximum"] = context_length
    if node.pop("x-prompt-ids", None):
        node["maxItems"] = context_length - 1
    for v in node.values():
        _fill_limits(v, vocab_size=vocab_size, context_length=context_length)


def range_regex(hi: int) -> str:
    """A regex alternation matching the decimal numbers 0..hi, without leading zeros.

    range_regex(511) = "[0-9]|[1-9][0-9]|[1-4][0-9][0-9]|50[0-9]|51[0-1]"."""
    digits = str(hi)
    alts = ["[0-9]"] if len(digits) > 1 else []
    alts += ["[1-9]" + "[0-9]" * (k - 1) for k in range(2, len(digits))]
    for i, d in enumerate(digits):
        low = 1 if i == 0 else 0
        if int(d) > low:
            alts.append(digits[:i] + f"[{low}-{int(d) - 1}]" + "[0-9]" * (len(digits) - i - 1))
    alts.append(digits[:-1] + f"[{0 if len(digits) > 1 else 0}-{digits[-1]}]")
    return "|".join(alts)
