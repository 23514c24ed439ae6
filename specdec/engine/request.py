"""Request: one generation request inside the reference host engine, and its stop conditions."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from specdec.engine.sampling import SamplingParams
from specdec.engine.stop_strings import completes_stop, stop_search_start, trim_at_stop


class FinishReason(str, enum.Enum):
    STOP = "stop"  # a stop token (EOS or stop_token_ids) or the end of a stop string was emitted
    LENGTH = "length"  # max_new_tokens reached
    ABORT = "abort"  # the client aborted it


@dataclasses.dataclass
class Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    # tokens that end the request: EOS (unless ignore_eos) and stop_token_ids
    stop_ids: frozenset[int]
    # prompt tokens whose KV came from the prefix cache at admission (not computed)
    cached_tokens: int = 0
    output_ids: list[int] = dataclasses.field(default_factory=list)
    row: int = -1  # request-pool row while running
    kv_len: int = 0  # tokens in the KV cache (the last output token is not yet)
    # positions [0, kv_alloc) hold KV slots (overlap scheduling reserves past kv_len)
    kv_alloc: int = 0
    finish_reason: FinishReason | None = None
    # admitted into a decode step (its fill ids' KV cached but for the last token): its next token
    # comes from a plain step over that token, not from a prefill step; cleared once launched
    fresh: bool = False
    spec_verify_ct: int = 0
    accept_lengths: list[int] = dataclasses.field(default_factory=list)
    # decode steps by tree shape ("SxKxN"), "plain" for steps without a draft tree (speculative engines)
    spec_shapes: dict[str, int] = dataclasses.field(default_factory=dict)
    # structured output: the grammar matcher of the committed tokens (specdec.engine.grammar)
    grammar: Any = None
    # sampling_seed: this request's own RNG (None: the engine's)
    generator: Any = None
    # with params.wants_logprobs: per output token its logprob and [(token id, logprob)] top list
    output_logprobs: list[float] = dataclasses.field(default_factory=list)
    output_top_logprobs: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    # with params.logprob_start_len >= 0: prompt tokens from there (the first of a prompt has none)
    input_logprobs: list[float | None] = dataclasses.field(default_factory=list)
    input_top_logprobs: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def last_token(self) -> int:
        """The last of its fill ids (prompt, then output): the input of its next decode step."""
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    def append(self, tokens: list[int], logprobs: tuple[list[float], list[list]] | None = None, *,
               tokenizer: Any = None) -> None:
        """Append committed tokens one by one; never one past a stop token, the token that
        completes a stop string (from output token ``min_new_tokens`` on:
        ``specdec.engine.stop_strings``) or max_new_tokens.

        ``logprobs``: (logprob of each token, top list of each token), aligned with ``tokens``;
        ``tokenizer``: decodes the tail for stop strings (required when ``params.stop`` is set)."""
        params = self.params
        if self.grammar is None and not params.stop and (logprobs is None or not params.wants_logprobs):
            self._append_ids(tokens)
            return
        for i, token in enumerate(tokens):
            if len(self.output_ids) >= params.max_new_tokens:
                self.finish_reason = FinishReason.LENGTH
                return
            self.output_ids.append(token)
            if logprobs is not None and params.wants_logprobs:
                self.output_logprobs.append(logprobs[0][i])
                self.output_top_logprobs.append(logprobs[1][i])
            if token in self.stop_ids or (params.stop and len(self.output_ids) >= params.min_new_tokens
                                          and completes_stop(self.output_ids, params.stop, tokenizer)):
                self.finish_reason = FinishReason.STOP
                return
            if self.grammar is not None:
                self.grammar.accept(token)
                if self.grammar.terminated:  # the grammar admits nothing more (e.g. ignore_eos)
                    self.finish_reason = FinishReason.STOP
                    return
        if len(self.output_ids) >= params.max_new_tokens:
            self.finish_reason = FinishReason.LENGTH

    def _append_ids(self, tokens: list[int]) -> None:
        """``append`` where only stop tokens and max_new_tokens can end the request: the tokens up
        to the first stop token, cut at max_new_tokens, in one extend (a decode step's commit of
        every request goes through here, so it checks per step, not per token)."""
        room = self.params.max_new_tokens - len(self.output_ids)
        keep = tokens if len(tokens) <= room else tokens[:max(room, 0)]
        stop = self.stop_ids
        if stop and not stop.isdisjoint(keep):
            end = next(i for i, t in enumerate(keep) if t in stop) + 1
            self.output_ids.extend(keep[:end])
            self.finish_reason = FinishReason.STOP
            return
        self.output_ids.extend(keep)
        if len(self.output_ids) >= self.params.max_new_tokens:
            self.finish_reason = FinishReason.LENGTH

    def result(self, tokenizer=None) -> dict:
        """SGLang's output dict. ``text`` (with a tokenizer) leaves out a stop string and what
        follows it in its last token.

        Accept statistics: ``spec_accept_lengths`` holds, per verify step, the draft tokens the
        target accepted, even where the request kept fewer of that step's tokens (it ended at a
        stop token, a stop string or max_new_tokens inside the step); ``spec_accept_length`` is
        completion tokens (those kept) per verify step, so it counts only the tokens returned."""
        meta = {
            "id": self.rid,
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": len(self.output_ids),
            "finish_reason": self.finish_reason.value if self.finish_reason else None,
            "cached_tokens": self.cached_tokens,
            "spec_verify_ct": self.spec_verify_ct,
            "spec_accept_lengths": list(self.accept_lengths),
        }
        if self.spec_verify_ct:
            # SGLang's figure, completion tokens per verify step, less the tokens of plain steps
            plain = self.spec_shapes.get("plain", 0)
            meta["spec_accept_length"] = (len(self.output_ids) - plain) / self.spec_verify_ct
        if self.spec_shapes:
            meta["spec_shapes"] = dict(self.spec_shapes)
        if self.params.wants_logprobs:
            meta["output_token_logprobs"] = list(self.output_logprobs)
            meta["output_top_logprobs"] = list(self.output_top_logprobs)
        if self.params.logprob_start_len >= 0:
            meta["input_token_logprobs"] = list(self.input_logprobs)
            meta["input_top_logprobs"] = list(self.input_top_logprobs)
        out = {"output_ids": list(self.output_ids), "meta_info": meta}
        if tokenizer is not None:
            text, stop = tokenizer.decode(self.output_ids), self.params.stop
            if stop:
                min_end = stop_search_start(self.output_ids, self.params.min_new_tokens, tokenizer)
                text = trim_at_stop(text, stop, min_end)
            out["text"] = text
        return out
