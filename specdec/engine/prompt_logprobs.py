"""Prompt logprobs (SGLang's ``logprob_start_len``, OpenAI's ``echo`` + ``logprobs``) over prefill chunks.

A prefill step computes positions [start, end) of each request (its chunk). With every position's
logits (``LogitsMode.ALL``), row p predicts token p + 1, so a chunk yields the logprobs of tokens
start + 1 .. end, where token ``end`` is the chunk's known next token, or, after the prompt's last
chunk, the first output token (not a prompt token: left out). Token 0 has no logprob (None).

Worked example: prompt [a b c d e], chunks [0, 3) and [3, 5), logprob_start_len = 1:
    chunk [0, 3): rows 0 1 2 predict b c d    -> positions 0..3: None, lp(b), lp(c), lp(d)
    chunk [3, 5): rows 3 4 predict e, output  -> position 4: lp(e)
    kept from position 1: [lp(b), lp(c), lp(d), lp(e)]

They come from the raw target logits (no processors, no temperature). A position the prefix cache
supplied has no logits, so a request that wants prompt logprobs reuses cached KV only before its
``logprob_start_len`` (``cacheable_tokens``); a recompute after retraction records nothing again.

Glossary: V = vocab size; num_tokens = the positions of one prefill step, chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def wants_prompt_logprobs(req) -> bool:
    """Prompt logprobs are asked for and not yet recorded (not a recompute after retraction)."""
    return req.params.logprob_start_len >= 0 and not req.output_ids


def cacheable_tokens(req, tokens: list[int]) -> list[int]:
    """The part of ``tokens`` whose KV the prefix cache may supply: the positions before the one
    whose logits predict the first wanted prompt token."""
    if not wants_prompt_logprobs(req):
        return tokens
    return tokens[: max(req.params.logprob_start_len - 1, 0)]


class PromptLogprobs:
    """Records the prompt logprobs of one prefill step's chunks into their requests."""

    def __init__(self, chunks: Sequence) -> None:
        """``chunks``: ``specdec.engine.admission.PrefillChunk`` of the step, in batch order."""
        self.chunks = list(chunks)

    @classmethod
    def of(cls, chunks: Sequence) -> "PromptLogprobs | None":
        return cls(chunks) if any(wants_prompt_logprobs(c.req) for c in chunks) else None

    def record(
        self,
        logits: torch.Tensor,  # [num_tokens, V] every position of the step, chunk by chunk
    ) -> None:
        offset = 0
        for chunk in self.chunks:
            if wants_prompt_logprobs(chunk.req):
                self._record_chunk(chunk, logits[offset: offset + chunk.length])
            offset += chunk.length

    @staticmethod
    def _record_chunk(
        chunk,
        logits: torch.Tensor,  # [length, V] positions start .. end - 1
    ) -> None:
        req, first = chunk.req, chunk.req.params.logprob_start_len
        targets = chunk.tokens[chunk.start + 1: chunk.end] + ([] if chunk.is_last else [chunk.next_token])
        logprobs = torch.log_softmax(logits[: len(targets)].float(), dim=-1)  # [m, V]
        index = torch.tensor(targets, dtype=torch.int64, device=logits.device)
        token = logprobs.gather(1, index[:, None]).squeeze(1).tolist()
        top_lp, top_ids = logprobs.topk(req.params.top_logprobs_num, dim=-1)  # [m, k]
        tops = [list(zip(i, lp)) for i, lp in zip(top_ids.tolist(), top_lp.tolist())]
        positions = range(chunk.start + 1, chunk.start + 1 + len(targets))
        if chunk.start == 0:
            positions, token, tops = range(0, len(targets) + 1), [None] + token, [None] + tops
        for pos, lp, top in zip(positions, token, tops):
            if pos >= first:
                req.input_logprobs.append(lp)
                req.input_top_logprobs.append(top)
