"""Sampling parameters (SGLang's ``sampling_params`` keys) and batched sampling from logits.

Filters, applied to p = softmax(logits / temperature) of each row, all on the original p and
therefore order-independent (each keeps a prefix of the tokens sorted by p, descending):

    top_k   keep the k most likely tokens (-1 = all).
    top_p   keep the smallest prefix whose mass reaches top_p: token i (sorted) is kept iff the
            mass strictly before it is < top_p. The most likely token is always kept.
    min_p   keep tokens with p >= min_p * max(p).

The kept probabilities are renormalised. A greedy row (temperature < 1e-5, or top_k == 1) is a
one-hot at argmax(logits).

Example, p = [0.5, 0.25, 0.125, 0.125] (already sorted):
    top_k=2     -> [0.5, 0.25] / 0.75
    top_p=0.75  -> [0.5, 0.25] / 0.75   (the mass before the third token is 0.75: not < 0.75)
    top_p=0.7   -> [0.5, 0.25] / 0.75
    top_p=0.8   -> [0.5, 0.25, 0.125] / 0.875
    min_p=0.3   -> [0.5, 0.25] / 0.75   (0.125 < 0.3 * 0.5)

Before temperature and the filters, a request's logits processors (``logits_process``) may
have changed the logits: penalties, logit_bias, min_new_tokens and a grammar mask. Logprobs come
from those processed logits, before temperature and the filters (see ``batch_sampling``).

Glossary: bs = requests; V = vocab size; n = logits rows (n = bs, or bs * N in verify where
``row_to_request`` maps each row to its request).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import torch

from specdec.forward import to_device
from specdec.models.ops.topk import argmax

# SGLang treats temperatures below this as greedy.
GREEDY_EPS = 1e-5
MAX_TEMPERATURE = 100.0
# OpenAI's bound on top_logprobs
MAX_TOP_LOGPROBS = 20
# a top_k past any vocabulary size means all tokens (-1)
MAX_TOP_K = 2**31 - 1
GRAMMAR_KEYS = ("json_schema", "regex", "ebnf")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    # stop strings, matched on the decoded output (``specdec.engine.stop_strings``); need a tokenizer
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # specdec extension: False decodes this request without speculation (its draft cache is
    # still kept in step, so it can be switched back on by a later request of the same kind)
    speculative: bool = True
    # logits processors (applied to the target logits before temperature; ``logits_process``):
    # OpenAI's presence / frequency penalties count this request's output tokens, in [-2, 2]
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # HF / vLLM: divides positive (multiplies negative) logits of tokens seen in prompt or output
    repetition_penalty: float = 1.0
    # token id -> added to its logit, in [-100, 100] (a dict; stored as sorted pairs)
    logit_bias: Any = None
    # stop tokens (EOS, stop_token_ids) are banned until this many tokens were generated
    min_new_tokens: int = 0
    # per-request RNG: the same request with the same seed reproduces its output
    sampling_seed: int | None = None
    # structured output, at most one: a JSON schema (string or object), a regex, an EBNF grammar
    json_schema: Any = None
    regex: str | None = None
    ebnf: str | None = None
    # logprobs of output tokens (and top_logprobs_num alternatives); prompt logprobs from
    # position logprob_start_len (-1 = none)
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1

    def __post_init__(self) -> None:
        _check_float("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"sampling_params.temperature must be >= 0, got {self.temperature}")
        if self.temperature > MAX_TEMPERATURE:  # NOTE: fp32 holds it; 1e308 would become inf (NaN probs)
            raise ValueError(f"sampling_params.temperature must be <= {MAX_TEMPERATURE:g}, got {self.temperature}")
        _check_float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling_params.top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k)
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"sampling_params.top_k must be -1 (all) or >= 1, got {self.top_k}")
        if self.top_k > MAX_TOP_K:  # NOTE: keeps every token of any vocabulary; a tensor holds 64 bits
            object.__setattr__(self, "top_k", -1)
        _check_float("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"sampling_params.min_p must be in [0, 1], got {self.min_p}")
        _check_int("max_new_tokens", self.max_new_tokens)
        if self.max_new_tokens < 0:
            raise ValueError(
                f"sampling_params.max_new_tokens must be >= 0, got {self.max_new_tokens}"
            )
        ids = self.stop_token_ids
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise ValueError(f"sampling_params.stop_token_ids must be a list of ints, got {ids!r}")
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise ValueError(
                    f"sampling_params.stop_token_ids must be a list of ints >= 0, got {list(ids)!r}"
                )
        object.__setattr__(self, "stop_token_ids", tuple(ids))
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, Sequence) or not all(isinstance(x, str) and x for x in stop):
            raise ValueError(f"sampling_params.stop must be a non-empty string or a list of them, "
                             f"got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(stop))
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"sampling_params.ignore_eos must be a bool, got {self.ignore_eos!r}")
        if not isinstance(self.speculative, bool):
            raise ValueError(f"sampling_params.speculative must be a bool, got {self.speculative!r}")
        self._check_processors()
        self._check_logprobs()

    def _check_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            _check_float(name, getattr(self, name))
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"sampling_params.{name} must be in [-2, 2], got {getattr(self, name)}")
        _check_float("repetition_penalty", self.repetition_penalty)
        # NOTE: a penalty near 0 would divide logits into inf (NaN probabilities)
        if not 0.01 <= self.repetition_penalty <= 2.0:
            raise ValueError(f"sampling_params.repetition_penalty must be in [0.01, 2], got {self.repetition_penalty}")
        object.__setattr__(self, "logit_bias", _normalise_bias(self.logit_bias))
        _check_int("min_new_tokens", self.min_new_tokens)
        if self.min_new_tokens < 0:
            raise ValueError(f"sampling_params.min_new_tokens must be >= 0, got {self.min_new_tokens}")
        if self.sampling_seed is not None:
            _check_int("sampling_seed", self.sampling_seed)
            object.__setattr__(self, "sampling_seed", self.sampling_seed % 2**63)  # any int: torch takes 63 bits
        grammars = [k for k in GRAMMAR_KEYS if getattr(self, k) is not None]
        if len(grammars) > 1:
            raise ValueError(f"sampling_params: give at most one of json_schema, regex, ebnf (got {', '.join(grammars)})")
        if isinstance(self.json_schema, dict):
            import json

            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        for k in GRAMMAR_KEYS:
            v = getattr(self, k)
            if v is not None and not (isinstance(v, str) and v):
                raise ValueError(f"sampling_params.{k} must be a non-empty string, got {v!r}")

    def _check_logprobs(self) -> None:
        if not isinstance(self.return_logprob, bool):
            raise ValueError(f"sampling_params.return_logprob must be a bool, got {self.return_logprob!r}")
        _check_int("top_logprobs_num", self.top_logprobs_num)
        if not 0 <= self.top_logprobs_num <= MAX_TOP_LOGPROBS:
            raise ValueError(
                f"sampling_params.top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs_num}")
        _check_int("logprob_start_len", self.logprob_start_len)
        if self.logprob_start_len < -1:
            raise ValueError(f"sampling_params.logprob_start_len must be >= -1, got {self.logprob_start_len}")

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "SamplingParams":
        """Build from a request's ``sampling_params`` JSON object. A key set to null (None)
        takes its default; unknown keys are rejected."""
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ValueError(f"sampling_params must be an object, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"sampling_params: unknown key(s) {', '.join(map(repr, unknown))}; "
                f"known keys are {', '.join(sorted(known))}"
            )
        return cls(**{k: v for k, v in d.items() if v is not None})

    # NOTE: the flags below are read per request and decode step; cached (the params are frozen)
    @functools.cached_property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    @functools.cached_property
    def grammar(self) -> tuple[str, str] | None:
        """(kind, source) of the structured-output grammar, or None."""
        return next(((k, getattr(self, k)) for k in GRAMMAR_KEYS if getattr(self, k) is not None), None)

    @functools.cached_property
    def has_penalties(self) -> bool:
        """Logits processors that read the request's tokens (need its committed tokens on the host)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.min_new_tokens)

    @functools.cached_property
    def needs_processing(self) -> bool:
        """Any logits processor at all: penalties, logit_bias, min_new_tokens, a grammar."""
        return self.has_penalties or bool(self.logit_bias) or self.grammar is not None

    @functools.cached_property
    def wants_logprobs(self) -> bool:
        return self.return_logprob or self.top_logprobs_num > 0


def _check_float(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"sampling_params.{name} must be a finite number, got {value!r}")


def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"sampling_params.{name} must be an int, got {value!r}")


def _normalise_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """logit_bias as sorted (token id, bias) pairs; keys may be ints or decimal strings (OpenAI)."""
    if bias is None:
        return ()
    items = bias.items() if isinstance(bias, dict) else bias
    if isinstance(bias, (str, bytes)) or not isinstance(items, (Sequence, type({}.items()))):
        raise ValueError(f"sampling_params.logit_bias must be an object of token id -> bias, got {bias!r}")
    out = {}
    for pair in items:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"sampling_params.logit_bias must be an object of token id -> bias, got {bias!r}")
        key, value = pair
        token = int(key) if isinstance(key, str) and key.strip().isdigit() else key
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"sampling_params.logit_bias: keys must be token ids >= 0, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise ValueError(f"sampling_params.logit_bias[{key}] must be a number in [-100, 100], got {value!r}")
        out[token] = float(value)
    return tuple(sorted(out.items()))


@dataclasses.dataclass(frozen=True)
class SamplingBatch:
    """Per-request sampling parameters of a batch as tensors. Built once, then only read."""

    # [bs] fp32; 1.0 for greedy rows (their temperature is never divided by)
    temperatures: torch.Tensor
    # [bs] fp32
    top_ps: torch.Tensor
    # [bs] int64; -1 = all
    top_ks: torch.Tensor
    # [bs] fp32
    min_ps: torch.Tensor
    # [bs] bool
    is_greedy: torch.Tensor
    # host-side summaries, so the hot path skips work without a sync
    all_greedy: bool
    need_top_k: bool
    need_top_p: bool
    need_min_p: bool

    @classmethod
    def from_params(
        cls, params: Sequence[SamplingParams], device: torch.device | str
    ) -> "SamplingBatch":
        greedy = [p.is_greedy for p in params]

        def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
            return to_device(values, dtype, device)  # built when requests join: no wait for the step in flight

        return cls(
            temperatures=tensor(
                [1.0 if g else p.temperature for p, g in zip(params, greedy)], torch.float32
            ),
            top_ps=tensor([p.top_p for p in params], torch.float32),
            top_ks=tensor([p.top_k for p in params], torch.int64),
            min_ps=tensor([p.min_p for p in params], torch.float32),
            is_greedy=tensor(greedy, torch.bool),
            all_greedy=all(greedy),
            need_top_k=any(p.top_k != -1 and not g for p, g in zip(params, greedy)),
            need_top_p=any(p.top_p < 1.0 and not g for p, g in zip(params, greedy)),
            need_min_p=any(p.min_p > 0.0 and not g for p, g in zip(params, greedy)),
        )

    @property
    def batch_size(self) -> int:
        return int(self.temperatures.shape[0])


def probs_from_logits(
    logits: torch.Tensor,
    sampling: SamplingBatch,
    row_to_request: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sampling distribution of each row: [n, V] fp32 (see the module docstring).

    logits: [n, V]; row_to_request: [n] request of each row (None: row b is request b).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [n, V], got shape {tuple(logits.shape)}")
    n, vocab = logits.shape
    if row_to_request is None:
        if n != sampling.batch_size:
            raise ValueError(
                f"logits has {n} rows but the sampling batch has {sampling.batch_size} requests; "
                "pass row_to_request"
            )
        row_to_request = torch.arange(n, device=logits.device)
    elif tuple(row_to_request.shape) != (n,):
        raise ValueError(f"row_to_request must be [{n}], got {tuple(row_to_request.shape)}")
    rows = row_to_request.to(device=logits.device, dtype=torch.long)
    logits = logits.float()
    greedy = sampling.is_greedy[rows]  # [n]
    onehot = torch.zeros_like(logits).scatter_(1, logits.argmax(dim=1, keepdim=True), 1.0)
    if sampling.all_greedy:
        return onehot
    probs = torch.softmax(logits / sampling.temperatures[rows, None], dim=1)  # [n, V]
    if sampling.need_top_k or sampling.need_top_p or sampling.need_min_p:
        probs = restrict_probs(
            probs,
            top_ks=sampling.top_ks[rows],
            top_ps=sampling.top_ps[rows],
            min_ps=sampling.min_ps[rows],
        )
    return torch.where(greedy[:, None], onehot, probs)


def restrict_probs(
    probs: torch.Tensor,
    *,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
) -> torch.Tensor:
    """Apply top-k, top-p and min-p to each row of ``probs`` and renormalise: [n, V] fp32.

    probs: [n, V]; top_ks, top_ps, min_ps: [n] (top_k -1 = all).
    """
    n, vocab = probs.shape
    # NOTE: a stable sort keeps ties in vocab order, so the kept set is deterministic.
    sorted_probs, order = probs.float().sort(dim=1, descending=True, stable=True)  # [n, V]
    rank = torch.arange(vocab, device=probs.device)[None, :]  # [1, V]
    k = torch.where(top_ks < 0, vocab, top_ks)[:, None]  # [n, 1]
    mass_before = torch.cumsum(sorted_probs, dim=1) - sorted_probs  # [n, V]
    # NOTE: top_p = 1 keeps everything even where fp32 rounding lifts mass_before to 1.
    keep = (rank < k) & ((mass_before < top_ps[:, None]) | (top_ps[:, None] >= 1.0))
    keep &= sorted_probs >= min_ps[:, None] * sorted_probs[:, :1]
    keep[:, 0] = True
    kept = torch.where(keep, sorted_probs, 0.0)
    kept = kept / kept.sum(dim=1, keepdim=True)
    return torch.zeros_like(kept).scatter_(1, order, kept)


def sample(
    logits: torch.Tensor,
    sampling: SamplingBatch,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token per request: [bs] int64. logits: [bs, V].

    Greedy rows take argmax(logits); the others draw from ``probs_from_logits``.
    """
    greedy = argmax(logits)  # [bs]
    if sampling.all_greedy:
        return greedy
    probs = probs_from_logits(logits, sampling)
    drawn = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return torch.where(sampling.is_greedy, greedy, drawn)
