"""Typed request bodies of the HTTP routes (pydantic): what the OpenAPI document promises.

Every field a route honors is declared with its type and range; a value out of range is a 400
naming the field (``app`` turns pydantic's errors into 400s). Fields the server cannot honor
are declared as ``null`` only, so a request that sets one is rejected by name instead of being
silently ignored. Unknown fields are ignored (``extra="allow"``), as OpenAI's and SGLang's
servers do. Limits that depend on the model (vocab size, context length) are added to the
document by ``openapi.patch_model_limits`` and checked by the engine.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from specdec.engine.sampling import MAX_TOP_LOGPROBS

MAX_N = 16  # parallel samples per prompt
MAX_STOPS = 16

TokenId = Annotated[int, Field(ge=0)]
# the x- markers are replaced by this model's limits in the document (openapi._fill_limits)
PromptTokenId = Annotated[int, Field(ge=0, json_schema_extra={"x-token-id": True})]
TokenIds = Annotated[list[PromptTokenId], Field(min_length=1, json_schema_extra={"x-prompt-ids": True})]
MaxTokens = Annotated[int, Field(ge=0, json_schema_extra={"x-context-tokens": True})]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
StopItem = Union[Annotated[str, Field(min_length=1)], TokenId]
Stop = Union[Annotated[str, Field(min_length=1)], TokenId, Annotated[list[StopItem], Field(max_length=MAX_STOPS)]]
# OpenAI: "token id" -> bias; the key is a decimal token id
LogitBias = dict[Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,8})$", json_schema_extra={"x-token-id-key": True})],
                 Annotated[float, Field(ge=-100.0, le=100.0)]]
Unsupported = Optional[None]  # declared so that the route can name it; only null is accepted


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Body):
    include_usage: Optional[bool] = None


class JsonSchemaFormat(_Body):
    name: str = "response"
    description: Optional[str] = None
    # the JSON schema the output must validate against
    schema_: Optional[dict[str, Any]] = Field(default=None, alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class _OpenAICommon(_Body):
    """Fields /v1/completions and /v1/chat/completions share."""

    model: Optional[str] = None
    max_tokens: Optional[MaxTokens] = None
    temperature: Optional[Annotated[float, Field(ge=0.0)]] = None
    top_p: Optional[Annotated[float, Field(gt=0.0, le=1.0)]] = None
    n: Optional[Annotated[int, Field(ge=1, le=MAX_N)]] = None
    stop: Optional[Stop] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    logit_bias: Optional[LogitBias] = None
    seed: Optional[Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]] = None
    user: Optional[str] = None
    response_format: Optional[ResponseFormat] = None
    # extensions (vLLM / SGLang names)
    top_k: Optional[Union[Literal[-1], Annotated[int, Field(ge=1)]]] = None
    min_p: Optional[Annotated[float, Field(ge=0.0, le=1.0)]] = None
    repetition_penalty: Optional[Annotated[float, Field(gt=0.0, le=2.0)]] = None
    min_tokens: Optional[Annotated[int, Field(ge=0)]] = None
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[TokenId]] = None
    regex: Optional[Annotated[str, Field(min_length=1)]] = None
    ebnf: Optional[Annotated[str, Field(min_length=1)]] = None
    # not supported: only null
    best_of: Optional[Literal[1]] = None
    service_tier: Unsupported = None


class CompletionRequest(_OpenAICommon):
    prompt: Union[str, Annotated[list[str], Field(min_length=1)], TokenIds, Annotated[list[TokenIds], Field(min_length=1)]]
    echo: Optional[bool] = None
    # OpenAI's legacy completions logprobs: how many top alternatives per token (0: the token only)
    logprobs: Optional[Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]] = None
    suffix: Unsupported = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: str
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None


class ChatCompletionRequest(_OpenAICommon):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Optional[MaxTokens] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]] = None
    # not supported: only null (or an empty list / "none" where OpenAI's clients send those)
    tools: Optional[Annotated[list[Any], Field(max_length=0)]] = None
    tool_choice: Optional[Literal["none"]] = None
    functions: Unsupported = None
    function_call: Optional[Literal["none"]] = None
    parallel_tool_calls: Optional[bool] = None
    audio: Unsupported = None
    modalities: Optional[list[Literal["text"]]] = None
    prediction: Unsupported = None
    reasoning_effort: Unsupported = None
    web_search_options: Unsupported = None


class NativeSamplingParams(BaseModel):
    """SGLang's ``sampling_params`` keys (unknown keys are a 400: the engine names them)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: Optional[MaxTokens] = None
    temperature: Optional[Annotated[float, Field(ge=0.0)]] = None
    top_p: Optional[Annotated[float, Field(gt=0.0, le=1.0)]] = None
    top_k: Optional[Union[Literal[-1], Annotated[int, Field(ge=1)]]] = None
    min_p: Optional[Annotated[float, Field(ge=0.0, le=1.0)]] = None
    stop: Optional[Stop] = None
    stop_token_ids: Optional[list[TokenId]] = None
    ignore_eos: Optional[bool] = None
    speculative: Optional[bool] = None
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    repetition_penalty: Optional[Annotated[float, Field(gt=0.0, le=2.0)]] = None
    min_new_tokens: Optional[Annotated[int, Field(ge=0)]] = None
    logit_bias: Optional[LogitBias] = None
    sampling_seed: Optional[Annotated[int, Field(ge=0, le=2**63 - 1)]] = None
    json_schema: Optional[Annotated[str, Field(min_length=1)]] = None
    regex: Optional[Annotated[str, Field(min_length=1)]] = None
    ebnf: Optional[Annotated[str, Field(min_length=1)]] = None


class GenerateRequest(_Body):
    """SGLang's native /generate: one prompt or a batch (``text`` or ``input_ids``)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={
        "oneOf": [{"required": ["text"]}, {"required": ["input_ids"]}]})

    # exactly one of text and input_ids (not null: the document's oneOf says so)
    text: Union[str, Annotated[list[str], Field(min_length=1)]] = None  # type: ignore[assignment]
    input_ids: Union[TokenIds, Annotated[list[TokenIds], Field(min_length=1)]] = None  # type: ignore[assignment]
    sampling_params: Optional[Union[NativeSamplingParams, list[NativeSamplingParams]]] = None
    stream: Optional[bool] = None
    return_logprob: Optional[bool] = None
    top_logprobs_num: Optional[Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]] = None
    # prompt logprobs from this prompt position (-1: none)
    logprob_start_len: Optional[Annotated[int, Field(ge=-1)]] = None
    return_text_in_logprobs: Optional[bool] = None


def set_fields(model: BaseModel) -> dict[str, Any]:
    """The declared fields a request set to a value (null counts as unset)."""
    return {k: v for k, v in model.model_dump(exclude_unset=True, by_alias=False).items()
            if k in type(model).model_fields and v is not None}
