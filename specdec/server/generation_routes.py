"""The server's generation routes: ``/generate`` (SGLang's native API) and OpenAI's
``/v1/completions`` and ``/v1/chat/completions``, whole or streamed as Server-Sent Events.
``app.create_app`` registers them beside ``service_routes.ServiceRoutes``; the module docstring of
``specdec.server.app`` describes what they accept and return. They reach the engine only through
the ``EngineClient``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from specdec.server.async_engine import EngineClient, InvalidRequest
from specdec.server.openai_api import chat_logprobs, completion_logprobs, native_logprobs, sampling_params, seeds
from specdec.server.protocol import (
    Generation,
    HTTPError,
    Stops,
    abort_on_disconnect,
    each_update,
    error_body,
    native_prompts,
    openai_prompts,
    parse_stops,
    render_chat,
    sse,
    with_stops,
)
from specdec.server.schemas import ChatCompletionRequest, CompletionRequest, GenerateRequest


def with_rids(prompts: list[dict], rid: str | None) -> list[dict]:
    """The client's ``rid`` on each request: as it is for one, "{rid}_{i}" for request i of several
    (SGLang's names: a batch, or OpenAI's choices)."""
    if rid is None:
        return prompts
    return [{**p, "rid": rid if len(prompts) == 1 else f"{rid}_{i}"} for i, p in enumerate(prompts)]


class GenerationRoutes:
    """The generation routes of one app (``app.create_app`` routes to them; the rest are
    ``service_routes.ServiceRoutes``)."""

    def __init__(self, async_engine: EngineClient, *, model_name: str, model_path: str | None) -> None:
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
