"""Chat messages rendered with a tokenizer's chat template, as an instruct model is prompted.

A chat model (SmolLM2-135M-Instruct's GGUF carries a Jinja ``tokenizer.chat_template``) answers
well only inside its template, so training prompts (regeneration) and benchmark prompts are both
rendered here, the same way, and so are the server's chat completions:

    "Name a colour."  ->  "<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>\\n"
                          "<|im_start|>user\\nName a colour.<|im_end|>\\n<|im_start|>assistant\\n"

The Jinja environment is the one Hugging Face (and ``specdec serve``) render with: sandboxed,
``trim_blocks`` and ``lstrip_blocks``. jinja2 comes with torch. A tokenizer without a template
gets the text unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_user_prompt(tokenizer: Any, text: str) -> str:
    """``text`` as one user message followed by the assistant header (the generation prompt)."""
    rendered = render_messages(tokenizer, [{"role": "user", "content": text}])
    return text if rendered is None else rendered


def render_messages(tokenizer: Any, messages: list[dict], *,
                error: Callable[[str], Exception] = ValueError) -> str | None:
    """``messages`` ({role, content} dicts) in the tokenizer's chat template, followed by the
    assistant header; None when the tokenizer has no template. A template's own
    ``raise_exception`` raises ``error(message)``."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise error(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=True,
        bos_token=getattr(tokenizer, "bos_token", "") or "", eos_token=getattr(tokenizer, "eos_token", "") or "",
    )
