"""Typed response bodies of the HTTP routes (pydantic), for the OpenAPI document.

The handlers build plain dicts (the hot path); these models only describe them. Logprobs shapes
follow OpenAI: completions ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``; chat
``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}``.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Out):
    message: str
    type: str
    code: int


class ErrorResponse(_Out):
    error: ErrorDetail


class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Out):
    tokens: list[str]
    token_logprobs: list[Optional[float]]
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class CompletionChoice(_Out):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    # extension: the generated token ids
    token_ids: list[int]


class CompletionResponse(_Out):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TopLogprob(_Out):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    content: Optional[list[TokenLogprob]] = None


class AssistantMessage(_Out):
    role: Literal["assistant"]
    content: Optional[str] = None


class ChatChoice(_Out):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None
    token_ids: list[int]


class ChatCompletionResponse(_Out):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class GenerateMeta(_Out):
    id: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: Optional[str] = None
    # prompt tokens the prefix cache supplied (their prefill was skipped)
    cached_tokens: int = 0
    # with return_logprob: (logprob, token id, text or null) per output token
    output_token_logprobs: Optional[list[list[Any]]] = None
    # with top_logprobs_num: per output token a list of (logprob, token id, text or null)
    output_top_logprobs: Optional[list[list[list[Any]]]] = None
    input_token_logprobs: Optional[list[list[Any]]] = None
    input_top_logprobs: Optional[list[Optional[list[list[Any]]]]] = None


class GenerateResponse(_Out):
    output_ids: list[int]
    text: Optional[str] = None
    meta_info: GenerateMeta


class Health(_Out):
    status: str


class ModelInfo(_Out):
    model_path: Optional[str] = None
    served_model_name: str
    is_generation: bool
    context_length: int
    vocab_size: int
    has_tokenizer: bool
    speculative_algorithm: Optional[str] = None
    chat_template: str


class ModelCard(_Out):
    id: str
    object: Literal["model"]
    owned_by: str
    max_model_len: int


class ModelList(_Out):
    object: Literal["list"]
    data: list[ModelCard]
