"""Request/response plumbing for the HTTP server: errors, SSE framing, stop sequences, chat
templates, prompt parsing, and ``Generation`` (one request's stream as the endpoints see it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from specdec.engine.chat import render_messages
from specdec.engine.stop_strings import stop_search_start, trim_at_stop
from specdec.server.detokenize import TextStream
from specdec.server.stream import RequestStream

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


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


def error_handler(status_and_message):
    """An async exception handler (a sync one would run in Starlette's thread pool)."""

    async def handle(_: Request, e: Exception) -> JSONResponse:
        return error_response(*status_and_message(e))

    return handle


def sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


# ------------------------------------------------------------------ stops and chat template
@dataclasses.dataclass(frozen=True)
class Stops:
    """A request's ``stop``: token ids stop like ``stop_token_ids``; strings go to the engine's
    ``sampling_params.stop`` (matched on the decoded output: ``specdec.engine.stop_strings``)."""

    token_ids: tuple[int, ...] = ()
    strings: tuple[str, ...] = ()


def parse_stops(stop: Any, tokenizer: Any, field: str = "stop") -> Stops:
    if stop is None:
        return Stops()
    items = [stop] if isinstance(stop, (str, int)) else stop
    if not isinstance(items, list):
        raise HTTPError(400, f"{field} must be a string, a token id or a list of them")
    ids, strings = [], []
    for s in items:
        if isinstance(s, int) and not isinstance(s, bool) and s >= 0:
            ids.append(s)
        elif isinstance(s, str) and s:
            if tokenizer is None:
                raise HTTPError(400, f"{field}: string stops need a tokenizer; this model has none (use token ids)")
            strings.append(s)
        else:
            raise HTTPError(400, f"{field}: entries must be non-empty strings or token ids >= 0, got {s!r}")
    return Stops(tuple(ids), tuple(strings))


def with_stops(params: Any, stops: Stops) -> Any:
    """sampling_params with the stop token ids and strings added (left alone when malformed: the
    engine says why)."""
    if not (stops.token_ids or stops.strings) or not isinstance(params, dict):
        return params
    own = params.get("stop_token_ids") or []
    if not isinstance(own, (list, tuple)):
        return params
    out = {**params, "stop_token_ids": [*own, *stops.token_ids]}
    return {**out, "stop": list(stops.strings)} if stops.strings else out


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
    rendered = render_messages(tokenizer, clean, error=lambda message: HTTPError(400, message))
    if rendered is not None:
        return rendered
    return "".join(f"{m['role']}: {m['content']}\n" for m in clean) + "assistant:"


# ------------------------------------------------------------------ one request's visible output
class Generation:
    """What the client sees of one request: ids, text cut before a stop string, and stream deltas.

    The engine ends a request at the token that completes a stop string, so ``ids`` (and the
    logprobs, aligned with them) never go past it; only the text is cut here, at the first stop
    string the engine counts (none within the first ``min_new_tokens - 1`` tokens)."""

    def __init__(self, stream: RequestStream, tokenizer: Any, stops: Stops, *, min_new_tokens: int = 0) -> None:
        self.stream = stream
        self.tokenizer = tokenizer
        self.stops = stops
        self.min_new_tokens = min_new_tokens
        self.ids: list[int] = []
        self._decoded = TextStream(tokenizer)  # the text of ids, decoded as they come
        self.text = ""  # that text, cut at a stop string
        self.finish_reason: str | None = None
        self.meta_info: dict | None = None
        self.cached_tokens = 0  # prompt tokens from the prefix cache, as the engine's Events say
        self.error: str | None = None
        self.error_status = 200
        self.sent_chars = 0
        self.sent_ids = 0
        # with logprobs: aligned with ids
        self.logprobs: list[float] = []
        self.top_logprobs: list[list[tuple[int, float]]] = []
        self.delta_start = 0  # ids[delta_start:sent_ids] is the last delta take_delta handed out

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    async def advance(self) -> None:
        event = await self.stream.next_event()
        self.ids.extend(event.token_ids)
        if event.logprobs is not None:
            self.logprobs.extend(event.logprobs)
            self.top_logprobs.extend(event.top_logprobs)
        if event.error is not None:
            self.error, self.error_status = event.error, event.status
            return
        self.cached_tokens = event.cached_tokens
        if self.tokenizer is not None:
            min_end = stop_search_start(self.ids, self.min_new_tokens, self.tokenizer) if self.stops.strings else 0
            self.text = trim_at_stop(self._decoded.update(self.ids, final=event.finished), self.stops.strings, min_end)
        if event.finished:
            self.meta_info = event.meta_info
            self.finish_reason = self.meta_info["finish_reason"]

    def partial_meta(self) -> dict:
        """meta_info of a request the engine has not finished yet (streaming)."""
        return {"id": self.stream.rid, "prompt_tokens": self.stream.prompt_tokens,
                "completion_tokens": len(self.ids), "finish_reason": None, "cached_tokens": self.cached_tokens}

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
        self.delta_start = self.sent_ids
        ids, self.sent_ids = self.ids[self.sent_ids:], len(self.ids)
        return delta, ids


async def each_update(gens: list[Generation]) -> AsyncIterator[int]:
    """Yield the index of a generation after each of its Events, until all have finished."""
    if len(gens) == 1:  # the common case, without a task an Event
        while not gens[0].finished:
            await gens[0].advance()
            yield 0
        return
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
async def abort_on_disconnect(request: Request, gens: list[Generation]):
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


# ------------------------------------------------------------------ prompts
def native_prompts(text: Any, input_ids: Any) -> tuple[list[dict], bool]:
    """(prompts, single) of a typed /generate body."""
    if (text is None) == (input_ids is None):
        raise HTTPError(400, "give exactly one of text or input_ids")
    if isinstance(text, str):
        return [{"text": text}], True
    if text is not None:
        return [{"text": t} for t in text], False
    if isinstance(input_ids[0], int):
        return [{"input_ids": list(input_ids)}], True
    return [{"input_ids": list(x)} for x in input_ids], False


def openai_prompts(prompt: Any) -> list[dict]:
    """One prompt dict per OpenAI completions prompt (a typed body's str / [str] / [int] / [[int]])."""
    if isinstance(prompt, str):
        return [{"text": prompt}]
    if isinstance(prompt[0], str):
        return [{"text": p} for p in prompt]
    if isinstance(prompt[0], int):
        return [{"input_ids": list(prompt)}]
    return [{"input_ids": list(p)} for p in prompt]
