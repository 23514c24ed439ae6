"""Schemathesis hooks for the OpenAPI test: shape the generated bodies around the constraints
JSON Schema cannot express, so that every other schema-valid request must succeed.

1. A prompt's length in *tokens*: a prompt longer than the context is a 400 however short its
   string. Prompt strings (``prompt``, ``text``, chat ``role`` / ``content``) are cut to a few
   characters, chat messages (and content parts) to a few; token-id prompts are bounded by the
   document itself (``maxItems``).
2. A /generate batch needs as many per-prompt sampling_params as prompts (a list of one serves
   all): the shorter of the two lists is repeated to match (nothing generated is dropped, so a
   body that violates the schema still does).
3. A grammar must compile: a ``json_schema`` string must be a JSON schema and a ``regex`` must
   stay inside xgrammar's dialect (no lookaround, no backreferences). One that does not compile
   (a 400 naming the field, tested in test_openai) is replaced by one that does.

4. /start_profile writes files where ``output_dir`` says, from the server's process: a generated
   folder name is replaced by one under the system's temporary folder.

To keep the CI run short, max_tokens / max_new_tokens are capped at a few tokens (a smaller
schema-valid value).

``before_call`` runs in every phase (coverage included) on the body about to be sent; the
checks judge the body as sent.
"""

import json
import os
import tempfile

import schemathesis

KEEP_CHARS = 3
KEEP_MESSAGES = 4
MAX_TOKENS = 4


def _cut(x):
    return x[:KEEP_CHARS] if isinstance(x, str) else x


def _shorten(body: dict) -> None:
    for key in ("prompt", "text"):
        value = body.get(key)
        if isinstance(value, str):
            body[key] = _cut(value)
        elif isinstance(value, list):
            body[key] = [_cut(v) for v in value]
    messages = body.get("messages")
    if isinstance(messages, list):
        messages = body["messages"] = messages[:KEEP_MESSAGES]  # the chat template adds tokens per message
        for m in messages:
            if not isinstance(m, dict):
                continue
            for k in ("role", "content", "name"):
                if isinstance(m.get(k), str):
                    m[k] = _cut(m[k])
            if isinstance(m.get("content"), list):
                m["content"] = [{**p, "text": _cut(p["text"])} if isinstance(p, dict) and "text" in p else p
                                for p in m["content"][:KEEP_MESSAGES]]


def _match_batch(body: dict) -> None:
    params = body.get("sampling_params")
    if not isinstance(params, list) or len(params) <= 1:
        return
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, str):
        body["text"] = [text] * len(params)
    elif isinstance(text, list) and text and len(text) != len(params):
        body["text"] = (text * len(params))[: len(params)] if len(text) < len(params) else text
    elif isinstance(ids, list) and ids and not any(isinstance(t, list) for t in ids):  # one prompt (154.0 is an id)
        body["input_ids"] = [ids] * len(params)
    elif isinstance(ids, list) and ids and len(ids) < len(params):
        body["input_ids"] = (ids * len(params))[: len(params)]
    prompts = body.get("text") if isinstance(body.get("text"), list) else body.get("input_ids")
    if isinstance(prompts, list) and prompts and any(isinstance(p, (list, str)) for p in prompts) \
            and len(prompts) > len(params):
        body["sampling_params"] = (params * len(prompts))[: len(prompts)]


def _compiles(kind: str, source) -> bool:
    import xgrammar

    try:
        if kind == "regex":
            xgrammar.Grammar.from_regex(source)
        else:
            xgrammar.Grammar.from_json_schema(source if isinstance(source, str) else json.dumps(source))
    except Exception:  # noqa: BLE001 — xgrammar raises RuntimeError for a grammar it cannot compile
        return False
    return True


def _fix_grammars(params: dict) -> None:
    if isinstance(params.get("regex"), str) and not _compiles("regex", params["regex"]):
        params["regex"] = "[a-z]+"
    schema = params.get("json_schema")
    if isinstance(schema, (str, dict)) and not _compiles("json_schema", schema):
        params["json_schema"] = "{}" if isinstance(schema, str) else {}


def _cap_tokens(params: dict, key: str) -> None:
    if isinstance(params.get(key), int) and not isinstance(params[key], bool) and params[key] > MAX_TOKENS:
        params[key] = MAX_TOKENS


def _shape_params(body: dict) -> None:
    _fix_grammars(body)
    _cap_tokens(body, "max_tokens")
    _cap_tokens(body, "max_completion_tokens")
    if ("prompt" in body or "messages" in body) and "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = MAX_TOKENS  # the defaults (16 / 128) are slow
    if ("text" in body or "input_ids" in body) and body.get("sampling_params") is None:
        body["sampling_params"] = {"max_new_tokens": MAX_TOKENS}  # the default (128) is slow
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
        inner = fmt["json_schema"]
        if isinstance(inner.get("schema"), dict) and not _compiles("json_schema", inner["schema"]):
            inner["schema"] = {}
    params = body.get("sampling_params")
    for p in params if isinstance(params, list) else [params]:
        if isinstance(p, dict):
            _fix_grammars(p)
            _cap_tokens(p, "max_new_tokens")


PROFILE_DIR = os.path.join(tempfile.gettempdir(), "specdec-schemathesis-profiles")


@schemathesis.hook
def before_call(ctx, case, kwargs) -> None:
    if isinstance(case.body, dict) and case.body.get("output_dir") is not None:
        case.body["output_dir"] = PROFILE_DIR
    if isinstance(case.body, dict):
        _shorten(case.body)
        _shape_params(case.body)
        _match_batch(case.body)
