"""The host contract: what a serving engine provides so a speculative worker (EAGLE, n-gram) can
drive its decode steps.

specdec never imports a host engine. A host hands the worker objects that satisfy these Protocols
(``specdec.engine`` is the reference implementation). The worker shares the host's
request-to-token table and KV slot allocator with its draft head: a KV slot index means the same
token position in the target's KV cache and in the draft's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol, Union, runtime_checkable

import numpy as np
import torch

from specdec.forward import ForwardBatch, LogitsOutput


# [bs] per-request values: a tensor (on any device), or host ints, which the worker passes whenever
# the host gave it host copies, so that the allocator need not read the device
Lens = Union[torch.Tensor, Sequence[int]]


class OutOfKVSlots(RuntimeError):
    """The KV allocator cannot provide the slots a forward needs."""


@runtime_checkable
class KVMemory(Protocol):
    """Request-to-token table plus the paged KV slot allocator behind it."""

    page_size: int
    # KV slots in the cache: every slot index the allocator hands out is < capacity
    capacity: int
    # [max_reqs, max_context] int32: KV slot of each (request row, position)
    req_to_token: torch.Tensor

    def alloc_extend(self, req_pool_indices: Lens, prefix_lens: Lens, extend_lens: Lens) -> torch.Tensor:
        """Give positions [prefix_len, prefix_len + extend_len) of each request KV slots.

        Fills each request's partially used last page first, writes the slots into
        ``req_to_token`` and returns them packed request by request: [sum(extend_lens)] on the
        device. Raises ``OutOfKVSlots`` (allocating nothing) when there is not enough room.
        """

    def truncate(self, req_pool_indices: Lens, old_lens: Lens, new_lens: Lens) -> None:
        """Release positions [new_len, old_len) of each request (whole pages only are freed)."""

    def available_size(self) -> int:
        """Free KV slots."""


def shared_arange(n: int, device: torch.device | str) -> torch.Tensor:
    """``torch.arange(n)`` (int64) on ``device``, made once and shared: never write to it.

    Between the CUDA graphs of a decode step every op is a launch that costs host time; a constant
    rebuilt each step is one of them. NOTE: nothing is cached while a CUDA graph captures (a tensor
    made then would live in the graph's memory pool and go with it): a capture gets a fresh one."""
    device = torch.device(device)
    if _capturing(device):
        return torch.arange(n, device=device)
    return _shared_arange(n, device)


def shared_full(n: int, value: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``torch.full((n,), value, dtype=dtype)`` on ``device``, made once and shared as ``shared_arange``."""
    device = torch.device(device)
    if _capturing(device):
        return torch.full((n,), value, dtype=dtype, device=device)
    return _shared_full(n, value, dtype, device)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@functools.lru_cache(maxsize=256)
def _shared_arange(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, device=device)


@functools.lru_cache(maxsize=256)
def _shared_full(n: int, value: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.full((n,), value, dtype=dtype, device=device)


def table_slots(
    req_to_token: torch.Tensor,  # [max_reqs, max_context] int32
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs]
    tokens: int,
) -> torch.Tensor:  # [bs * tokens] int64, request by request
    """The slots ``req_to_token`` holds for positions seq_len .. seq_len + tokens - 1 of each request
    (positions the host reserved ahead, read on the device without a host sync)."""
    # NOTE: a flat index and ``torch.take``: as many launches as advanced indexing, half its host time
    # (a step's slot lookup runs outside its graphs, on the host's critical path)
    first = torch.add(seq_lens, req_pool_indices, alpha=req_to_token.shape[1])  # [bs] flat index of seq_len
    if tokens == 1:
        return torch.take(req_to_token, first).long()
    return torch.take(req_to_token, first[:, None] + shared_arange(tokens, seq_lens.device)).flatten().long()


def step_slots(
    memory: KVMemory,
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs]
    tokens: int,
    *,
    seq_lens_cpu: list[int] | None = None,
    rows_cpu: list[int] | None = None,
    reserved: bool = False,
) -> torch.Tensor:  # [bs * tokens] int64, request by request
    """KV slots for a step's ``tokens`` new positions per request: the ones the host reserved ahead
    (``reserved``: read from the table, no host sync), else allocated now, from the host's copies of
    the rows and lengths when it has them (the allocator then reads nothing from the device)."""
    if reserved:
        return table_slots(memory.req_to_token, req_pool_indices, seq_lens, tokens)
    if seq_lens_cpu is not None and rows_cpu is not None:
        return memory.alloc_extend(rows_cpu, seq_lens_cpu, [tokens] * len(rows_cpu))
    return memory.alloc_extend(req_pool_indices, seq_lens, torch.full_like(seq_lens, tokens))


@runtime_checkable
class TargetKVCache(Protocol):
    def move(self, src_locs: torch.Tensor, dst_locs: torch.Tensor) -> None:
        """Copy K/V of every layer from slots ``src_locs`` to ``dst_locs`` ([groups, width] int64
        each, one group per request). Within a group every source is read before any destination
        is written (accepted tree nodes move towards the prefix); groups touch disjoint slots;
        entries with src == dst are no-ops."""


@runtime_checkable
class TargetModelRunner(Protocol):
    """Runs the target model; the worker builds TARGET_VERIFY batches and calls ``forward``."""

    kv_cache: TargetKVCache
    attn_backend: object
    # [vocab, hidden] embedding and lm_head weights (EAGLE-1 heads share them with the target)
    embed_weight: torch.Tensor
    lm_head_weight: torch.Tensor
    hidden_size: int
    vocab_size: int
    # target layers whose inputs EAGLE-3 captures, or None when the target captures the final state
    aux_hidden_layers: tuple[int, ...] | None

    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        """One forward. Fills ``batch.attn_metadata`` via its backend, then runs the model. Where
        ``batch.slot_tokens`` is set, first writes each input token's id at its KV slot there (NGRAM's
        device lookups; a host with CUDA graphs captures the write, see ``ForwardBatch.slot_tokens``)."""


@runtime_checkable
class SamplingInfo(Protocol):
    """Per-request sampling settings of one batch, as the worker needs them.

    Optional members (the worker looks them up with ``getattr``; a host without them gets plain
    sampling; ``specdec.engine.batch_sampling.BatchSampling`` has them all):

        needs_processing: bool, process(logits, tree) -> logits
            logits processors (penalties, logit_bias, grammar masks) at every tree node, each
            node seeing its own path; [bs * N, vocab] in and out, applied before ``probs``
        top_logprobs_num: int | None, record_logprobs(logits, tokens)
            logprobs of the committed tokens [bs, S + 1] under their nodes' processed logits
        uniforms(bs, n, device) -> ([bs, n], [bs])
            verification's coins in (0, 1], drawn by the host (per-request seeds)
    """

    # True when every request decodes greedily (the worker then verifies with exact argmax)
    is_all_greedy: bool

    def probs(self, logits: torch.Tensor, row_to_request: torch.Tensor) -> torch.Tensor:
        """Target distribution after temperature / top-k / top-p: [n, vocab] fp32.

        Row i of ``logits`` belongs to request ``row_to_request[i]``. Greedy requests get a
        one-hot row at the argmax.
        """

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """One token per request from ``logits`` [bs, vocab]: [bs] int64."""


@runtime_checkable
class TokenHistory(Protocol):
    """Each request row's tokens so far, on the host: what a drafter without a model (the n-gram
    worker) looks its drafts up in. The host brings a row up to date before every decode step
    that includes it, so that the row ends with the step's root (the last committed token)."""

    # [max_reqs, max_context] int: row r's first num_tokens[r] entries are its prompt + output
    token_ids: np.ndarray
    # [max_reqs] int
    num_tokens: np.ndarray
