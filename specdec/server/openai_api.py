"""OpenAI requests -> engine sampling params, and engine logprobs -> OpenAI / SGLang shapes.

Parameter mapping (every declared field is honored or rejected; the README's table lists them):

    max_tokens / max_completion_tokens -> max_new_tokens (defaults 16 / 128)
    temperature, top_p, top_k, min_p, ignore_eos, stop_token_ids, presence_penalty,
    frequency_penalty, repetition_penalty, logit_bias        -> the same sampling_params keys
    min_tokens -> min_new_tokens;  seed -> sampling_seed (+ the choice's index when n > 1)
    response_format json_object -> json_schema {"type": "object"}; json_schema -> its schema;
    regex (extension) -> the same key; at most one grammar per request
    completions logprobs=k -> output logprobs with k alternatives; echo + logprobs -> prompt ones
    chat logprobs=true, top_logprobs=k -> the same (top_logprobs alone implies logprobs)

Logprobs are from the target distribution after the request's logits processors (penalties,
logit_bias, min_tokens, grammar mask) and before temperature / top-p / top-k / min-p.
"""

from __future__ import annotations

import json
from typing import Any

from specdec.server.schemas import ChatCompletionRequest, CompletionRequest

_PASSTHROUGH = ("temperature", "top_p", "top_k", "min_p", "ignore_eos", "stop_token_ids", "presence_penalty",
                "frequency_penalty", "repetition_penalty", "logit_bias", "regex")


class UnsupportedRequest(ValueError):
    """A request the server cannot honor (HTTP 400 with the reason)."""


def sampling_params(body: CompletionRequest | ChatCompletionRequest, *, chat: bool) -> dict[str, Any]:
    """The engine's sampling_params of one choice (``seed`` is added per choice by the caller)."""
    max_tokens = (body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens) \
        if chat else body.max_tokens
    params: dict[str, Any] = {"max_new_tokens": max_tokens if max_tokens is not None else (128 if chat else 16)}
    params.update({k: getattr(body, k) for k in _PASSTHROUGH if getattr(body, k) is not None})
    if body.min_tokens is not None:
        params["min_new_tokens"] = body.min_tokens
    grammar = _response_format_schema(body)
    if grammar is not None:
        if "regex" in params:
            raise UnsupportedRequest("give at most one of response_format (json_object / json_schema) and regex")
        params["json_schema"] = grammar
    top = _top_logprobs(body, chat=chat)
    if top is not None:
        params.update(return_logprob=True, top_logprobs_num=top)
        if not chat and body.echo:
            params["logprob_start_len"] = 0
    return params


def seeds(body: CompletionRequest | ChatCompletionRequest, n: int) -> list[int | None]:
    """Per-choice sampling seeds: seed + index (mod 2**63), or None without a seed."""
    if body.seed is None:
        return [None] * n
    return [(body.seed + j) % 2**63 for j in range(n)]


def _response_format_schema(body) -> str | None:
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return json.dumps({"type": "object"})
    return json.dumps(fmt.json_schema.schema_)


def _top_logprobs(body, *, chat: bool) -> int | None:
    if not chat:
        return body.logprobs
    if body.logprobs or body.top_logprobs:
        return body.top_logprobs or 0
    return None


# ------------------------------------------------------------------ logprobs shapes
def token_texts(tokenizer: Any, ids: list[int], context: list[int] = ()) -> list[str]:
    """Each token's text as it appears after the tokens before it (leading spaces kept).

    Decoded against up to four preceding tokens, since a decoder strips a sequence's first
    space; without a tokenizer a token is ``token_id:<id>`` (vLLM's spelling)."""
    if tokenizer is None:
        return [f"token_id:{t}" for t in ids]
    full = list(context)[-4:] + list(ids)
    start = len(full) - len(ids)
    out = []
    for i in range(start, len(full)):
        window = full[max(0, i - 4): i]
        out.append(tokenizer.decode(window + [full[i]])[len(tokenizer.decode(window)):] if window
                   else tokenizer.decode([full[i]]))
    return out


def completion_logprobs(tokenizer: Any, ids: list[int], logprobs: list, tops: list, *,
                        context: list[int] = (), offset: int = 0) -> dict:
    """OpenAI's completions ``logprobs`` object of ``ids`` (a None logprob: the prompt's first)."""
    texts = token_texts(tokenizer, ids, context)
    top_texts = [dict(zip(token_texts(tokenizer, [t for t, _ in top], list(context) + ids[:i]),
                          (lp for _, lp in top))) if top is not None else None
                 for i, top in enumerate(tops)]
    offsets, pos = [], offset
    for t in texts:
        offsets.append(pos)
        pos += len(t)
    return {"tokens": texts, "token_logprobs": list(logprobs), "top_logprobs": top_texts, "text_offset": offsets}


def chat_logprobs(tokenizer: Any, ids: list[int], logprobs: list, tops: list, *, context: list[int] = ()) -> dict:
    """OpenAI's chat ``logprobs`` object: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    texts = token_texts(tokenizer, ids, context)
    content = []
    for i, (text, lp, top) in enumerate(zip(texts, logprobs, tops)):
        alt = token_texts(tokenizer, [t for t, _ in top], list(context) + ids[:i])
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode()),
                        "top_logprobs": [{"token": a, "logprob": alp, "bytes": list(a.encode())}
                                         for a, (_, alp) in zip(alt, top)]})
    return {"content": content}


def native_logprobs(tokenizer: Any, ids: list[int], logprobs: list, tops: list | None, *, with_text: bool) -> tuple:
    """SGLang's ``[logprob, token id, text or null]`` triples and top lists of them."""
    texts = token_texts(tokenizer, ids) if with_text and tokenizer is not None else [None] * len(ids)
    triples = [[lp, t, s] for lp, t, s in zip(logprobs, ids, texts)]
    if tops is None:
        return triples, None
    top = [None if alts is None else [[lp, t, tokenizer.decode([t]) if with_text and tokenizer else None]
                                      for t, lp in alts] for alts in tops]
    return triples, top
