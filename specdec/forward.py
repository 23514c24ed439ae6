"""The vocabulary shared by a host engine and specdec: forward modes and one forward's inputs/outputs.

A ``ForwardBatch`` describes one model forward over packed tokens. Attention is described per
request: request ``b`` reads the ``prefix_lens[b]`` KV slots cached in its row of the
request-to-token table, plus the KV of its own new tokens (``out_cache_loc``, written by the
forward itself). Among the new tokens of a request the mask is causal, except:

* TARGET_VERIFY: ``tree_mask`` says which tree nodes each node sees (its ancestors and itself);
* DRAFT decode (``draft_ancestors`` set): each of the ``topk`` rows of a request is its own branch
  that sees the prefix plus the KV slots of its ancestors (itself last), nothing else.

Glossary: bs = requests in the batch; num_tokens = packed tokens in the forward; N =
num_draft_tokens (tree nodes per request); S = num_steps; K = topk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from typing import Any, Iterator

import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1  # prefill: new prompt tokens after an optional cached prefix
    DECODE = 2  # one new token per request (also one draft step, one token per branch)
    TARGET_VERIFY = 3  # target over the N tree nodes of each request
    DRAFT_EXTEND = 4  # draft head over the committed tokens of each request
    IDLE = 5  # nothing to run

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)


class CaptureHiddenMode(enum.IntEnum):
    NULL = 0  # return no hidden states
    LAST = 1  # the hidden state of each request's last token
    FULL = 2  # the hidden state of every token


class LogitsMode(enum.IntEnum):
    LAST = 1  # logits of each request's last token: [bs, vocab]
    ALL = 2  # logits of every token: [num_tokens, vocab]


@dataclasses.dataclass
class ForwardBatch:
    """Inputs of one forward. Built once by whoever runs the forward, then only read."""

    forward_mode: ForwardMode
    # [num_tokens]
    input_ids: torch.Tensor
    # [num_tokens] absolute position of each token in its sequence
    positions: torch.Tensor
    # [num_tokens] KV slot each token's K/V is written to
    out_cache_loc: torch.Tensor
    # [bs] row of each request in the request-to-token table
    req_pool_indices: torch.Tensor
    # [bs] tokens already in each request's KV cache (visible to all its new tokens)
    prefix_lens: torch.Tensor
    # [bs] new tokens of each request in this forward (topk for a draft step)
    extend_lens: torch.Tensor
    # [max_reqs, max_context] int32 KV slot of each (request row, position)
    req_to_token: torch.Tensor
    # the KV cache this forward reads and writes, and the backend that computes attention
    kv_cache: Any
    attn_backend: Any
    logits_mode: LogitsMode = LogitsMode.LAST
    # the logits' dtype: float32, or None for the lm_head's own (the model dtype). The values are
    # the same either way (rounded to the model dtype, widened exactly), so a consumer that needs
    # fp32 widens; None saves writing and reading the wider copy (a verify's [bs * N, vocab])
    logits_dtype: torch.dtype | None = torch.float32
    capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL
    # TARGET_VERIFY only: [bs * N * N] bool, row-major [N, N] per request, True = may attend
    tree_mask: torch.Tensor | None = None
    # draft decode only: [bs * topk, depth] int64 KV slots of each branch's ancestors, itself last
    draft_ancestors: torch.Tensor | None = None
    # draft forwards only: [num_tokens, hidden] features the draft head conditions on
    spec_hidden_states: torch.Tensor | None = None
    # host-side copies (lists) of prefix_lens / extend_lens, so backends plan without a sync
    prefix_lens_cpu: list[int] | None = None
    extend_lens_cpu: list[int] | None = None
    # [bs] packed row whose logits / hidden state LogitsMode.LAST and CaptureHiddenMode.LAST
    # return; None = each request's last new token. Set when requests carry padding tokens.
    output_rows: torch.Tensor | None = None
    # [KV slots + 1] int64, persistent: the forward writes each input token's id at its KV slot
    # (``out_cache_loc``) before running, inside its CUDA graph where the graph was captured with this
    # tensor (NGRAM's device lookups read a request's history from it; the padding slot last)
    slot_tokens: torch.Tensor | None = None
    # CUDA-graph capture: a static bound on prefix_len + extend_len of every request. When set the
    # backend plans from device tensors only (no host reads, shapes fixed by the bound).
    static_max_seq_len: int | None = None
    # backend-built metadata (set by attn_backend.init_forward_metadata, read by its forward)
    attn_metadata: Any = None

    @classmethod
    def decode(
        cls,
        input_ids: torch.Tensor,  # [bs] the last committed token of each request
        seq_lens: torch.Tensor,  # [bs] tokens in each request's KV cache
        out_cache_loc: torch.Tensor,  # [bs] the slot each new token's K/V goes to
        req_pool_indices: torch.Tensor,  # [bs]
        *,
        req_to_token: torch.Tensor,
        kv_cache: Any,
        attn_backend: Any,
        capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL,
        seq_lens_cpu: list[int] | None = None,
        slot_tokens: torch.Tensor | None = None,
    ) -> "ForwardBatch":
        """Plain decoding: one new token per request, at position seq_len, after its whole cache."""
        ones = torch.ones_like(seq_lens)
        return cls(
            forward_mode=ForwardMode.DECODE,
            input_ids=input_ids,
            positions=seq_lens,
            out_cache_loc=out_cache_loc,
            req_pool_indices=req_pool_indices,
            prefix_lens=seq_lens,
            extend_lens=ones,
            req_to_token=req_to_token,
            kv_cache=kv_cache,
            attn_backend=attn_backend,
            logits_mode=LogitsMode.LAST,
            capture_hidden_mode=capture_hidden_mode,
            prefix_lens_cpu=seq_lens_cpu,
            extend_lens_cpu=[1] * int(seq_lens.shape[0]),
            slot_tokens=slot_tokens,
        )

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def host_prefix_lens(self) -> list[int]:
        return self.prefix_lens_cpu if self.prefix_lens_cpu is not None else self.prefix_lens.tolist()

    def host_extend_lens(self) -> list[int]:
        return self.extend_lens_cpu if self.extend_lens_cpu is not None else self.extend_lens.tolist()


@dataclasses.dataclass
class LogitsOutput:
    # [bs, vocab] (LogitsMode.LAST) or [num_tokens, vocab] (LogitsMode.ALL)
    next_token_logits: torch.Tensor
    # [bs or num_tokens, hidden_features] per CaptureHiddenMode; None for NULL.
    # For a target these are the features a draft head conditions on (the final normed hidden
    # state for EAGLE, the concatenated auxiliary layer inputs for EAGLE-3); for a draft head, the
    # hidden state it feeds to its next step.
    hidden_states: torch.Tensor | None = None
    # [rows] int64 argmax of next_token_logits, where a captured graph computed it with the logits
    # (its host launches spared: ``specdec.eagle.output.sample_next``); None: not computed
    greedy_ids: torch.Tensor | None = None


# ----------------------------------------------------------------------------- deterministic inference
# --enable-deterministic-inference (SGLang's flag): every op of the target whose reduction order could
# depend on the batch reads this switch and takes its batch-invariant path, so that a row's result
# depends only on that row's inputs, not on how many rows the forward has (M), which other requests
# share the batch, or the draft tree's shape; greedy speculative decoding then equals plain decoding
# bit for bit:
#   linear      ``specdec.models.ops.batch_invariant``: one fixed tiling for every M, no split-K; the
#               lm_head writes fp32 logits without rounding them to the model dtype
#   norms, RoPE, SiLU-and-mul   already per row (``specdec.models.ops``)
#   attention   every query row over its own KV list in position order (prefix, then its tree
#               ancestors, then itself), one split: a verify node computes exactly what a decode step
#               at its position computes (backends with ``supports_deterministic``)
# NOTE: a process-wide switch (like ``gemv.cublas_only``), read when an op runs or a forward is
# planned: the engine sets it once at construction, before any forward.
_batch_invariant = False


def set_batch_invariant(enabled: bool) -> None:
    global _batch_invariant
    _batch_invariant = bool(enabled)


def batch_invariant_enabled() -> bool:
    return _batch_invariant


@contextlib.contextmanager
def batch_invariant(enabled: bool = True) -> Iterator[None]:
    """The switch set within the block (tests), restored after it."""
    saved = _batch_invariant
    set_batch_invariant(enabled)
    try:
        yield
    finally:
        set_batch_invariant(saved)


def to_device(values: list, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)`` without waiting for the device.

    NOTE: a copy from pageable host memory waits for the stream to drain (on CUDA every
    ``torch.tensor(list, device=...)`` does); from pinned memory it is queued behind the work.
    """
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


@contextlib.contextmanager
def deliberate_sync() -> Iterator[None]:
    """Marks a wait for the device that is meant (a step's one read of its results): torch's sync
    debug mode is off inside, so a check of everything else (``specdec.bench.sync_debug``,
    tests/e2e/test_gpu_host_syncs.py) sees only the waits nobody meant.
    NOTE: the mode is process-wide; this assumes one thread drives the device."""
    mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else 0
    if mode:
        torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        if mode:
            torch.cuda.set_sync_debug_mode(mode)
