"""Typed request bodies of the HTTP routes (pydantic): what the OpenAPI document promises.

Every field a route honors is declared with its type and range; a value out of range is a 400
naming the field (``app`` turns pydantic's errors into 400s). Fields the server cannot honor
are declared as ``null`` only, so a request that sets one is rejected by name instead of being
silently ignored. An unknown top-level field is a 400 naming it (``extra="forbid"``): OpenAI's and
SGLang's servers ignore one (vLLM logs it), so a misspelt ``max_token`` would silently give 16
tokens; inside objects (messages, stream options, a JSON schema) unknown keys pass. Limits that depend on the model (vocab size, context length) are added to the
document by ``openapi.patch_model_limits`` and checked by the engine.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from specdec.engine.sampling import MAX_TEMPERATURE, MAX_TOP_LOGPROBS
from specdec.server.profiler import ACTIVITIES

MAX_N = 16  # parallel samples per prompt


def _integral(x: Any) -> Any:
    """JSON Schema's integer includes 154.0: take an integral float as the int (strict otherwise)."""
    return int(x) if isinstance(x, float) and x.is_integer() else x


# NOTE: after the Field: a validator placed before the constraints hides them from the document
_INT = BeforeValidator(_integral)


def _not_bool(x: Any) -> Any:
    """A Literal compares by equality (True == 1, 0 == False): keep JSON's types apart."""
    if isinstance(x, bool):
        raise ValueError("expected an integer, got a boolean")
    return x


def _only_bool(x: Any) -> Any:
    if not isinstance(x, bool):
        raise ValueError(f"expected a boolean, got {type(x).__name__}")
    return x
MAX_STOPS = 16

TokenId = Annotated[int, Field(ge=0), _INT]
# the x- markers are replaced by this model's limits in the document (openapi._fill_limits)
PromptTokenId = Annotated[int, Field(ge=0, json_schema_extra={"x-token-id": True}), _INT]
TokenIds = Annotated[list[PromptTokenId], Field(min_length=1, json_schema_extra={"x-prompt-ids": True})]
MaxTokens = Annotated[int, Field(ge=0, json_schema_extra={"x-context-tokens": True}), _INT]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
StopItem = Union[Annotated[str, Field(min_length=1)], TokenId]
Stop = Union[Annotated[str, Field(min_length=1)], TokenId, Annotated[list[StopItem], Field(max_length=MAX_STOPS)]]
# OpenAI: "token id" -> bias; the key is a decimal token id
LogitBias = dict[Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,8})$", json_schema_extra={"x-token-id-key": True})],
                 Annotated[float, Field(ge=-100.0, le=100.0)]]
Unsupported = Optional[None]  # declared so that the route can name it; only null is accepted
Regex = Annotated[str, Field(min_length=1, json_schema_extra={"format": "regex"})]


def only(value: bool) -> Any:
    """A boolean field accepted only at ``value`` (or null): SGLang's request fields that
    sglang-router 0.3.2 adds, at their defaults, to every request it forwards (``--dp-size``)."""
    return Optional[Annotated[Literal[value], BeforeValidator(_only_bool)]]


def at_most_one(*fields: str, response_format: bool = False) -> dict:
    """JSON Schema: no two of ``fields`` are set to a value (null counts as unset)."""
    value = {"not": {"type": "null"}}
    json_format = {"type": "object", "properties": {"type": {"enum": ["json_object", "json_schema"]}},
                   "required": ["type"]}
    names = [*fields, *(["response_format"] if response_format else [])]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    return {"allOf": [{"not": {"properties": {a: json_format if a == "response_format" else value,
                                              b: json_format if b == "response_format" else value},
                               "required": [a, b]}} for a, b in pairs]}


class _Body(BaseModel):
    # strict: no coercion (0 is not false, "1" is not 1), so the document's types are the truth
    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(_Body):
    include_usage: Optional[bool] = None


class JsonSchemaFormat(_Body):
    name: str = "response"
    description: Optional[str] = None
    # the JSON schema the output must validate against ({} = any JSON value)
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: Optional[bool] = None


class TextFormat(_Body):
    type: Literal["text"]


class JsonObjectFormat(_Body):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Body):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[Union[TextFormat, JsonObjectFormat, JsonSchemaResponseFormat], Field(discriminator="type")]


class _OpenAICommon(_Body):
    """Fields /v1/completions and /v1/chat/completions share."""

    model: Optional[str] = None
    max_tokens: Optional[MaxTokens] = None
    temperature: Optional[Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE)]] = None
    top_p: Optional[Annotated[float, Field(gt=0.0, le=1.0)]] = None
    n: Optional[Annotated[int, Field(ge=1, le=MAX_N), _INT]] = None
    stop: Optional[Stop] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    logit_bias: Optional[LogitBias] = None
    seed: Optional[Annotated[int, _INT]] = None  # any integer (taken modulo 2**63)
    # identifiers for the caller's records: accepted, they do not change the output
    user: Optional[str] = None
    response_format: Optional[ResponseFormat] = None
    # SGLang's request id, for /abort_request (choice i of several gets "{rid}_{i}")
    rid: Optional[Annotated[str, Field(min_length=1)]] = None
    # extensions (vLLM / SGLang names)
    top_k: Optional[Annotated[Union[Literal[-1], Annotated[int, Field(ge=1), _INT]], BeforeValidator(_integral)]] = None
    min_p: Optional[Annotated[float, Field(ge=0.0, le=1.0)]] = None
    repetition_penalty: Optional[Annotated[float, Field(ge=0.01, le=2.0)]] = None
    min_tokens: Optional[Annotated[int, Field(ge=0), _INT]] = None
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[TokenId]] = None
    regex: Optional[Regex] = None
    # not supported: only null
    best_of: Optional[Annotated[Literal[1], BeforeValidator(_integral), BeforeValidator(_not_bool)]] = None
    service_tier: Unsupported = None
    # what sglang-router adds to a request it forwards: accepted at its no-op value only
    no_stop_trim: only(False) = None
    skip_special_tokens: only(True) = None
    return_hidden_states: only(False) = None


class CompletionRequest(_OpenAICommon):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=at_most_one("regex", response_format=True))

    prompt: Union[str, Annotated[list[str], Field(min_length=1)], TokenIds, Annotated[list[TokenIds], Field(min_length=1)]]
    echo: Optional[bool] = None
    # OpenAI's legacy completions logprobs: how many top alternatives per token (0: the token only)
    logprobs: Optional[Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), _INT]] = None
    suffix: Unsupported = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: str
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None


class ChatCompletionRequest(_OpenAICommon):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=at_most_one("regex", response_format=True))

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Optional[MaxTokens] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), _INT]] = None
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
    verbosity: Unsupported = None
    # stored completions: nothing is stored, so only store=false (and no metadata for it)
    store: Optional[Annotated[Literal[False], BeforeValidator(_only_bool)]] = None
    metadata: Unsupported = None
    # identifiers for the caller's records or a cache hint: accepted, they do not change the output
    safety_identifier: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    # sglang-router's additions (see _OpenAICommon)
    continue_final_message: only(False) = None
    separate_reasoning: only(True) = None
    stream_reasoning: only(True) = None


class NativeSamplingParams(BaseModel):
    """SGLang's ``sampling_params`` keys (unknown keys are a 400: the engine names them)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=at_most_one("json_schema", "regex"))

    max_new_tokens: Optional[MaxTokens] = None
    temperature: Optional[Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE)]] = None
    top_p: Optional[Annotated[float, Field(gt=0.0, le=1.0)]] = None
    top_k: Optional[Annotated[Union[Literal[-1], Annotated[int, Field(ge=1), _INT]], BeforeValidator(_integral)]] = None
    min_p: Optional[Annotated[float, Field(ge=0.0, le=1.0)]] = None
    stop: Optional[Stop] = None
    stop_token_ids: Optional[list[TokenId]] = None
    ignore_eos: Optional[bool] = None
    speculative: Optional[bool] = None
    presence_penalty: Optional[Penalty] = None
    frequency_penalty: Optional[Penalty] = None
    repetition_penalty: Optional[Annotated[float, Field(ge=0.01, le=2.0)]] = None
    min_new_tokens: Optional[Annotated[int, Field(ge=0), _INT]] = None
    logit_bias: Optional[LogitBias] = None
    sampling_seed: Optional[Annotated[int, _INT]] = None  # any integer (taken modulo 2**63)
    # a JSON schema as a string (SGLang) or an object
    json_schema: Optional[Union[Annotated[str, Field(min_length=1)], dict[str, Any]]] = None
    regex: Optional[Regex] = None


class GenerateRequest(_Body):
    """SGLang's native /generate: one prompt or a batch (``text`` or ``input_ids``)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "oneOf": [{"required": ["text"]}, {"required": ["input_ids"]}]})

    # exactly one of text and input_ids (not null: the document's oneOf says so)
    text: Union[str, Annotated[list[str], Field(min_length=1)]] = None  # type: ignore[assignment]
    input_ids: Union[TokenIds, Annotated[list[TokenIds], Field(min_length=1)]] = None  # type: ignore[assignment]
    # one object for every prompt, or one per prompt of a batch
    sampling_params: Optional[Union[NativeSamplingParams, Annotated[list[NativeSamplingParams],
                                                                    Field(min_length=1)]]] = None
    stream: Optional[bool] = None
    return_logprob: Optional[bool] = None
    top_logprobs_num: Optional[Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), _INT]] = None
    # prompt logprobs from this prompt position (-1: none)
    logprob_start_len: Optional[Annotated[int, Field(ge=-1), _INT]] = None
    return_text_in_logprobs: Optional[bool] = None
    # the client's request id, for /abort_request (prompt i of a batch gets "{rid}_{i}", as in
    # SGLang); unique among the requests in flight (default: the server picks one, meta_info.id)
    rid: Optional[Annotated[str, Field(min_length=1)]] = None
    # what sglang-router adds to a request it forwards: accepted at its no-op value only
    model: Unsupported = None
    log_metrics: only(True) = None
    return_hidden_states: only(False) = None
    background: only(False) = None
    no_logs: only(False) = None
    return_bytes: only(False) = None
    return_entropy: only(False) = None


class AbortRequest(_Body):
    """SGLang's /abort_request: end one request (``rid``, its ``meta_info.id``) or every one."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"anyOf": [
        {"required": ["rid"], "properties": {"rid": {"type": "string"}}},
        {"required": ["abort_all"], "properties": {"abort_all": {"const": True}}}]})

    rid: Optional[Annotated[str, Field(min_length=1)]] = None
    abort_all: Optional[bool] = None


def set_fields(model: BaseModel) -> dict[str, Any]:
    """The declared fields a request set to a value (null counts as unset)."""
    return {k: v for k, v in model.model_dump(exclude_unset=True, by_alias=False).items()
            if k in type(model).model_fields and v is not None}


class TokenizeRequest(_Body):
    """SGLang's and vLLM's /tokenize: the prompt's token ids as /generate would see them."""

    model: Optional[str] = None
    prompt: Union[str, Annotated[list[str], Field(min_length=1)]]
    add_special_tokens: Optional[bool] = None  # the tokenizer's BOS (default true)


class DetokenizeRequest(_Body):
    """SGLang's /detokenize: the text of token ids (a list of lists for several)."""

    model: Optional[str] = None
    tokens: Union[list[PromptTokenId], Annotated[list[list[PromptTokenId]], Field(min_length=1)]]


class ProfileRequest(_Body):
    """SGLang's /start_profile body (every field optional; ``specdec.server.profiler`` says what
    each does). SGLang's fields this server cannot honor are accepted at their no-op value only."""

    model_config = ConfigDict(extra="forbid", strict=True)

    output_dir: Optional[Annotated[str, Field(min_length=1)]] = None
    start_step: Optional[Annotated[int, Field(ge=0), _INT]] = None
    num_steps: Optional[Annotated[int, Field(ge=1), _INT]] = None
    activities: Optional[list[Literal[ACTIVITIES]]] = None
    with_stack: Optional[bool] = None
    record_shapes: Optional[bool] = None
    profile_prefix: Optional[Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")]] = None
    # one process is profiled (rank 0), all its steps in one file
    merge_profiles: only(False) = None
    profile_by_stage: only(False) = None
