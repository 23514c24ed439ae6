"""STANDALONE speculation: a whole small causal LM (any model the registry builds) is the draft.

SGLang's ``--speculative-algorithm STANDALONE`` runs its EAGLE worker with a full LLM as the draft;
so do we. ``StandaloneDraft`` wraps the LM so that ``DraftRunner`` drives it like a head: token ids
in (it ignores target features; the target captures none), its own embedding and lm_head, all its
layers over its own KV cache in the shared draft slot scheme (``DraftResources``: the host's slot
indices, the tree scratch, a padding slot, and one parking slot per request row). It reads tokens
aligned with the target's positions (``draft_inputs.AlignedInputs``), not shifted like a head.

``check_vocab`` is the start-up check that draft and target speak the same token ids.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from specdec.forward import ForwardBatch, LogitsOutput
from specdec.models.config import KVLayout


class StandaloneDraft(nn.Module):
    """A causal LM as the draft: ``forward`` returns its logits and a zero-width hidden state (the
    tree's frontier carries no draft features between steps)."""

    standalone = True
    hidden_feature_size = 0  # target features the draft reads

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config = model.config

    @property
    def kv_layout(self) -> KVLayout:
        return self.model.kv_layout

    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        logits = self.model(batch).next_token_logits  # [rows, vocab]
        return LogitsOutput(next_token_logits=logits, hidden_states=logits.new_empty((logits.shape[0], 0)))


def is_standalone(draft: nn.Module) -> bool:
    return bool(getattr(draft, "standalone", False))


def check_vocab(target_config: Any, draft_config: Any, target_tokenizer: Any = None, draft_tokenizer: Any = None,
                *, flag: str = "--speculative-draft-model-path") -> None:
    """Raise ValueError naming ``flag`` unless the draft's token ids mean the target's: the same
    vocabulary size and, where both have tokenizers, the same special ids and token strings."""
    if draft_config.vocab_size != target_config.vocab_size:
        raise ValueError(f"{flag}: the draft model's vocabulary has {draft_config.vocab_size} tokens, the target's "
                         f"{target_config.vocab_size}; STANDALONE needs the target's tokenizer")
    if target_tokenizer is None or draft_tokenizer is None:
        return
    for name in ("bos_token_id", "eos_token_id"):
        a, b = getattr(target_tokenizer, name, None), getattr(draft_tokenizer, name, None)
        if a != b:
            raise ValueError(f"{flag}: the draft's tokenizer has {name}={b}, the target's {a}; STANDALONE needs the "
                             "target's tokenizer")
    a, b = token_strings(target_tokenizer), token_strings(draft_tokenizer)
    if a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        raise ValueError(f"{flag}: the draft's tokenizer differs from the target's at token {first} "
                         f"({_at(b, first)!r} vs {_at(a, first)!r}); STANDALONE needs the target's tokenizer")


def token_strings(tokenizer: Any) -> list[str]:
    """Every token id's string: the vocabulary of a ``tokenizers`` or SentencePiece tokenizer, else
    each id decoded alone."""
    tok, sp = getattr(tokenizer, "tok", None), getattr(tokenizer, "sp", None)
    if tok is not None and hasattr(tok, "get_vocab"):
        vocab = tok.get_vocab(with_added_tokens=True)
        out = [""] * (max(vocab.values(), default=-1) + 1)
        for piece, i in vocab.items():
            out[i] = piece
        return out
    if sp is not None:
        return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return [tokenizer.decode([i]) for i in range(int(tokenizer.vocab_size))]


def _at(strings: list[str], i: int) -> str | None:
    return strings[i] if i < len(strings) else None
