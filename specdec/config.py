"""SpecConfig: the speculative-decoding settings, named after SGLang's server flags.

Flags map one to one: ``--speculative-num-steps`` is ``SpecConfig.num_steps`` and so on
(see ``SpecConfig.from_flags``). The config is frozen and validates itself; derive a changed
one with ``dataclasses.replace``.

Glossary (shared with docs/architecture.md):
    num_steps (S)        depth of the draft tree = draft forwards per decode step.
    topk (K)             children kept per expanded node, and frontier width.
    num_draft_tokens (N) tree nodes verified per request, the root included.
"""

from __future__ import annotations

import dataclasses
import enum

DEFAULT_NUM_STEPS = 5
DEFAULT_TOPK = 4
DEFAULT_NUM_DRAFT_TOKENS = 8
# --speculative-draft-kv-cache-dtype values (specdec.attention.kv_dtype.KV_CACHE_DTYPES maps them to dtypes)
DRAFT_KV_CACHE_DTYPES = ("auto", "fp8_e4m3")


class SpecAlgorithm(str, enum.Enum):
    EAGLE = "EAGLE"
    EAGLE3 = "EAGLE3"
    NGRAM = "NGRAM"  # no draft model: drafts looked up in each request's own tokens (specdec.ngram)
    STANDALONE = "STANDALONE"  # a whole small causal LM of the target's tokenizer drafts (specdec.eagle.standalone)

    @classmethod
    def parse(cls, name: str) -> "SpecAlgorithm":
        try:
            return cls(name.upper())
        except ValueError:
            choices = ", ".join(a.value for a in cls)
            raise ValueError(
                f"--speculative-algorithm: unknown algorithm {name!r}; choose one of {choices}"
            ) from None


class ConfigError(ValueError):
    """A speculative-decoding setting is invalid; the message names the flag."""


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    algorithm: SpecAlgorithm
    draft_model_path: str | None
    num_steps: int
    topk: int
    num_draft_tokens: int
    accept_threshold_single: float = 1.0
    accept_threshold_acc: float = 1.0
    token_map: str | None = None
    # decode batches with more requests than this run without speculation (None: always speculate)
    batch_size_threshold: int | None = None
    # the draft head's KV cache: "auto" (the head's dtype) or "fp8_e4m3" (specdec.attention.kv_dtype)
    draft_kv_cache_dtype: str = "auto"
    # benchmark only: verify in full, then commit a drawn number of tokens per request (mean TAU)
    # along the tree's first path, so full-size cost is measurable without a trained head
    simulate_accept_length: float | None = None
    # benchmark only: verify in full, then accept each tree node's child of rank r at depth d, under a
    # parent of rank p, with hazard simulate_hazards[d - 1][p][r] (specdec.eagle.acceptance; a
    # [depth][rank] table is read as one parent row), along the real tree
    simulate_hazards: tuple[tuple[tuple[float, ...], ...], ...] | None = None
    # benchmark only: verify in full, then replay a real draft head's recorded trees and its target's path
    # through them (an .npz trace of specdec.eagle.replay; the draft's tree follows the recorded scores)
    simulate_trace: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.algorithm, SpecAlgorithm):
            object.__setattr__(self, "algorithm", SpecAlgorithm.parse(str(self.algorithm)))
        _check_int("--speculative-num-steps", self.num_steps, low=1)
        _check_int("--speculative-eagle-topk", self.topk, low=1)
        _check_int("--speculative-num-draft-tokens", self.num_draft_tokens, low=2)
        max_nodes = 1 + self.topk + (self.num_steps - 1) * self.topk * self.topk
        if self.num_draft_tokens > max_nodes:
            raise ConfigError(
                f"--speculative-num-draft-tokens={self.num_draft_tokens} exceeds the "
                f"{max_nodes} nodes a tree with --speculative-num-steps={self.num_steps} and "
                f"--speculative-eagle-topk={self.topk} can hold"
            )
        if self.topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ConfigError(
                "--speculative-eagle-topk=1 is a chain: --speculative-num-draft-tokens must be "
                f"--speculative-num-steps + 1 = {self.num_steps + 1}, got {self.num_draft_tokens}"
            )
        if self.batch_size_threshold is not None:
            _check_int("--speculative-batch-size-threshold", self.batch_size_threshold, low=0)
        if self.draft_kv_cache_dtype not in DRAFT_KV_CACHE_DTYPES:
            raise ConfigError(f"--speculative-draft-kv-cache-dtype={self.draft_kv_cache_dtype!r}: choose one of "
                              f"{list(DRAFT_KV_CACHE_DTYPES)}")
        if self.simulate_accept_length is not None:
            tau = self.simulate_accept_length
            if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 1.0 <= tau <= self.num_steps + 1:
                raise ConfigError(
                    f"--speculative-simulate-accept-length must be a number in [1, --speculative-num-steps + 1 "
                    f"= {self.num_steps + 1}] (committed tokens per step), got {tau!r}"
                )
        if self.simulate_hazards is not None:
            object.__setattr__(self, "simulate_hazards", _hazard_table(self.simulate_hazards))
        if sum(x is not None for x in (self.simulate_accept_length, self.simulate_hazards, self.simulate_trace)) > 1:
            raise ConfigError("simulate one of a mean accept length, an acceptance model or a draft trace")
        for flag, value in (
            ("--speculative-accept-threshold-single", self.accept_threshold_single),
            ("--speculative-accept-threshold-acc", self.accept_threshold_acc),
        ):
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"{flag} must be in (0, 1], got {value}")

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @property
    def is_eagle3(self) -> bool:
        return self.algorithm is SpecAlgorithm.EAGLE3

    @property
    def is_standalone(self) -> bool:
        return self.algorithm is SpecAlgorithm.STANDALONE

    @property
    def is_ngram(self) -> bool:
        return self.algorithm is SpecAlgorithm.NGRAM

    @classmethod
    def from_flags(
        cls,
        speculative_algorithm: str,
        *,
        speculative_draft_model_path: str | None = None,
        speculative_num_steps: int | None = None,
        speculative_eagle_topk: int | None = None,
        speculative_num_draft_tokens: int | None = None,
        speculative_accept_threshold_single: float = 1.0,
        speculative_accept_threshold_acc: float = 1.0,
        speculative_token_map: str | None = None,
        speculative_batch_size_threshold: int | None = None,
        speculative_draft_kv_cache_dtype: str = "auto",
        speculative_simulate_accept_length: float | None = None,
        speculative_simulate_acceptance_model: str | None = None,
    ) -> "SpecConfig":
        """Resolve SGLang's flag semantics: all three unset -> (5, 4, 8); topk=1 -> chain."""
        steps, topk, ntok = speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens
        if steps is None and topk is None and ntok is None:
            steps, topk, ntok = DEFAULT_NUM_STEPS, DEFAULT_TOPK, DEFAULT_NUM_DRAFT_TOKENS
        else:
            steps = DEFAULT_NUM_STEPS if steps is None else steps
            topk = DEFAULT_TOPK if topk is None else topk
            if topk == 1:
                ntok = steps + 1
            elif ntok is None:
                ntok = min(DEFAULT_NUM_DRAFT_TOKENS, 1 + topk + (steps - 1) * topk * topk)
        return cls(
            algorithm=SpecAlgorithm.parse(speculative_algorithm),
            draft_model_path=speculative_draft_model_path,
            num_steps=steps,
            topk=topk,
            num_draft_tokens=ntok,
            accept_threshold_single=speculative_accept_threshold_single,
            accept_threshold_acc=speculative_accept_threshold_acc,
            token_map=speculative_token_map,
            batch_size_threshold=speculative_batch_size_threshold,
            draft_kv_cache_dtype=speculative_draft_kv_cache_dtype,
            simulate_accept_length=speculative_simulate_accept_length,
            **_read_acceptance_model(speculative_simulate_acceptance_model),
        )


def _read_acceptance_model(path: str | None) -> dict:
    """``simulate_trace`` for a draft trace (.npz), else ``simulate_hazards`` from a JSON acceptance model."""
    if path is not None and path.endswith(".npz"):
        from pathlib import Path

        if not Path(path).is_file():
            raise ConfigError(f"--speculative-simulate-acceptance-model {path}: no such file")
        return {"simulate_trace": path}
    return {"simulate_hazards": _read_hazards(path)}


def _read_hazards(path: str | None) -> tuple[tuple[tuple[float, ...], ...], ...] | None:
    """The ``hazards`` table of an acceptance-model JSON file (``specdec.eagle.acceptance``)."""
    if path is None:
        return None
    import json

    try:
        return _hazard_table(json.loads(open(path).read())["hazards"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--speculative-simulate-acceptance-model {path}: {e}") from None


def _hazard_table(table) -> tuple[tuple[tuple[float, ...], ...], ...]:
    """A [depth][parent rank][rank] table of hazards in [0, 1] (a [depth][rank] one gains a parent axis)."""
    def is_row(x) -> bool:
        return isinstance(x, (list, tuple)) and all(isinstance(h, (int, float)) and not isinstance(h, bool) for h in x)

    if isinstance(table, (list, tuple)) and table and all(is_row(r) for r in table):
        table = [[r] for r in table]
    ok = isinstance(table, (list, tuple)) and bool(table) and all(
        isinstance(d, (list, tuple)) and d and all(is_row(r) and r for r in d) for d in table)
    if ok:
        shape = {(len(d), len(r)) for d in table for r in d}
        ok = len(shape) == 1 and all(0.0 <= h <= 1.0 for d in table for r in d for h in r)
    if not ok:
        raise ConfigError("the simulated acceptance model must be a [depth][rank] or [depth][parent rank][rank] "
                          "table of hazards in [0, 1]")
    return tuple(tuple(tuple(float(h) for h in r) for r in d) for d in table)


def _check_int(flag: str, value: object, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{flag} must be an integer, got {value!r}")
    if value < low:
        raise ConfigError(f"{flag} must be >= {low}, got {value}")
