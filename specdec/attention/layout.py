"""RaggedLayout: which KV slots each query row reads, in the form every backend can consume.

The batch is split into attention *sequences*. Usually a sequence is one request: its query rows
are its new tokens and its KV list is ``req_to_token[row, :prefix_len]`` followed by the new
tokens' own slots. A draft decode step instead makes every branch its own sequence: one query row
whose KV list is the request's prefix followed by that branch's ancestors (itself last).

Visibility inside a sequence with q query rows and kv entries: when ``mask`` is None it is
causal aligned to the end (row j sees kv entries [0, kv - q + j]); TARGET_VERIFY gives an explicit
mask: every row sees the whole prefix, and tree node i sees tree node j iff ``tree_mask[i, j]``.

Worked example, verify with prefix 2 and a 3-node tree (root 0 with children 1 and 2):
    kv entries:   p0 p1 n0 n1 n2
    row n0:        1  1  1  0  0
    row n1:        1  1  1  1  0
    row n2:        1  1  1  0  1
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import torch

from specdec.forward import ForwardBatch, ForwardMode, to_device
from specdec.kernels import create_kv_indices, create_kv_layout


@dataclasses.dataclass(frozen=True)
class RaggedLayout:
    # [num_seqs + 1] query rows of sequence s are packed rows qo_indptr[s]:qo_indptr[s+1]
    qo_indptr: torch.Tensor
    # [num_seqs + 1] KV entries of sequence s are kv_indices[kv_indptr[s]:kv_indptr[s+1]]
    kv_indptr: torch.Tensor
    # [total_kv] int64 KV slots, in position order within each sequence
    kv_indices: torch.Tensor
    # [sum_s q_s * kv_s] bool, row-major [q_s, kv_s] per sequence; None = causal aligned to the end
    mask: torch.Tensor | None
    # [num_seqs + 1] start of each sequence's block in ``mask``; None when mask is None
    mask_indptr: torch.Tensor | None
    # host copies of the per-sequence lengths (planning happens on the host once per forward)
    q_lens: list[int]
    kv_lens: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.q_lens)


def _indptr(lens: list[int], device: torch.device) -> torch.Tensor:
    """[len(lens) + 1] int64 offsets, summed on the host and copied without waiting for the device."""
    return to_device(list(itertools.accumulate(lens, initial=0)), torch.int64, device)


def _packed_kv(batch: ForwardBatch, prefix_lens: list[int], extend_lens: list[int], kv_lens: list[int],
               kv_indptr: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[sum(kv_lens)] int64: each request's prefix slots (gathered from ``req_to_token`` on the
    device), then its new tokens' slots. Reads nothing from the device: the host knows the lengths.

    Example, prefix_lens [2, 1], extend_lens [1, 2]: kv_indptr [0, 3, 6] and
    [r2t[row0, 0] r2t[row0, 1] own0 | r2t[row1, 0] own1 own2], own at entries [2, 4, 5].
    """
    kv_indices = torch.empty(sum(kv_lens), dtype=torch.int64, device=device)
    if not kv_lens:
        return kv_indices
    prefix_dev = to_device(prefix_lens, torch.int64, device)
    create_kv_indices(batch.req_to_token, batch.req_pool_indices, prefix_dev, kv_indptr, None, kv_indices)
    starts = np.cumsum([0] + kv_lens[:-1]) + np.asarray(prefix_lens)  # [bs] first own entry
    extend = np.asarray(extend_lens)
    own = np.repeat(starts - (np.cumsum(extend) - extend), extend) + np.arange(int(extend.sum()))
    kv_indices[to_device(own.tolist(), torch.int64, device)] = batch.out_cache_loc.to(torch.int64)
    return kv_indices


def _prefix_slots(batch: ForwardBatch, rows: torch.Tensor, lens: list[int]) -> list[torch.Tensor]:
    table = batch.req_to_token
    return [table[r, :n].to(torch.int64) for r, n in zip(rows.tolist(), lens)]


def build_ragged_layout(batch: ForwardBatch) -> RaggedLayout:
    device = batch.input_ids.device
    prefix_lens = batch.host_prefix_lens()
    extend_lens = batch.host_extend_lens()
    if batch.draft_ancestors is not None:
        return _draft_layout(batch, prefix_lens, extend_lens, device)

    kv_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    kv_indptr = _indptr(kv_lens, device)
    mask = mask_indptr = None
    if batch.forward_mode == ForwardMode.TARGET_VERIFY:
        mask, mask_indptr = _verify_mask(batch, prefix_lens, extend_lens, device)
    return RaggedLayout(
        qo_indptr=_indptr(extend_lens, device),
        kv_indptr=kv_indptr,
        kv_indices=_packed_kv(batch, prefix_lens, extend_lens, kv_lens, kv_indptr, device),
        mask=mask,
        mask_indptr=mask_indptr,
        q_lens=list(extend_lens),
        kv_lens=kv_lens,
    )


def _verify_mask(
    batch: ForwardBatch, prefix_lens: list[int], extend_lens: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    if batch.tree_mask is None:
        raise ValueError("TARGET_VERIFY batch needs tree_mask")
    blocks = []
    offset = 0
    for p, n in zip(prefix_lens, extend_lens):
        tree = batch.tree_mask[offset : offset + n * n].view(n, n).to(torch.bool)
        offset += n * n
        blocks.append(torch.cat([torch.ones(n, p, dtype=torch.bool, device=device), tree], 1).flatten())
    sizes = [n * (p + n) for p, n in zip(prefix_lens, extend_lens)]
    return torch.cat(blocks), _indptr(sizes, device)


def _draft_layout(
    batch: ForwardBatch, prefix_lens: list[int], extend_lens: list[int], device: torch.device
) -> RaggedLayout:
    ancestors = batch.draft_ancestors  # [bs * topk, depth]
    topk = extend_lens[0] if extend_lens else 1
    if any(e != topk for e in extend_lens) or ancestors.shape[0] != batch.num_tokens:
        raise ValueError("draft decode batch needs topk tokens per request and one ancestor row each")
    depth = int(ancestors.shape[1])
    prefixes = _prefix_slots(batch, batch.req_pool_indices, prefix_lens)
    kv_lists = []
    for b, prefix in enumerate(prefixes):
        for j in range(topk):
            kv_lists.append(torch.cat([prefix, ancestors[b * topk + j].to(torch.int64)]))
    kv_lens = [p + depth for p in prefix_lens for _ in range(topk)]
    return RaggedLayout(
        qo_indptr=_indptr([1] * len(kv_lens), device),
        kv_indptr=_indptr(kv_lens, device),
        kv_indices=torch.cat(kv_lists) if kv_lists else torch.zeros(0, dtype=torch.int64, device=device),
        mask=None,
        mask_indptr=None,
        q_lens=[1] * len(kv_lens),
        kv_lens=kv_lens,
    )


@dataclasses.dataclass(frozen=True)
class StaticLayout:
    """RaggedLayout built from device tensors alone, for CUDA-graph capture.

    Every request has the same number of new tokens (``q_len``; a draft decode step: one row per
    branch), so the shapes depend only on the batch size and ``ForwardBatch.static_max_seq_len``;
    the lengths themselves stay on the device. ``kv_indices`` is sized for the bound and filled
    up to ``kv_indptr[-1]``.
    """

    # [num_seqs + 1] int32
    qo_indptr: torch.Tensor
    # [num_seqs + 1] int32
    kv_indptr: torch.Tensor
    # [num_seqs * (max_prefix_len + own)] int32 KV slots: prefix then own entries, per sequence
    kv_indices: torch.Tensor
    # query rows per sequence
    q_len: int
    # host bounds that size grids and split plans
    max_prefix_len: int
    max_kv_len: int


def build_static_layout(batch: ForwardBatch) -> StaticLayout:
    """The sequences of ``build_ragged_layout``, planned without reading a device value.

    A sequence's KV list is ``req_to_token[row, :prefix_len]`` followed by its own entries: the
    request's ``out_cache_loc`` (q_len of them), or a draft branch's ancestors (itself last).
    """
    bound = batch.static_max_seq_len
    if bound is None:
        raise ValueError("build_static_layout needs batch.static_max_seq_len")
    bs, device = batch.batch_size, batch.input_ids.device
    if batch.draft_ancestors is not None:
        own = batch.draft_ancestors  # [bs * K, depth]: each branch a sequence of one query row
        q_len = 1
    else:
        if batch.num_tokens % max(bs, 1):
            raise ValueError(f"static layout: {batch.num_tokens} tokens are not the same count for {bs} requests")
        q_len = batch.num_tokens // max(bs, 1)
        own = batch.out_cache_loc.view(bs, q_len)
    num_seqs, width = own.shape
    kv_indptr = torch.empty(num_seqs + 1, dtype=torch.int32, device=device)
    kv_indices = torch.empty(num_seqs * (bound + width), dtype=torch.int32, device=device)
    create_kv_layout(batch.req_to_token, batch.req_pool_indices, batch.prefix_lens, own, kv_indptr, kv_indices)
    qo_indptr = (torch.arange(0, (num_seqs + 1) * q_len, q_len, dtype=torch.int32, device=device) if q_len
                 else torch.zeros(num_seqs + 1, dtype=torch.int32, device=device))
    return StaticLayout(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, q_len=q_len,
                        max_prefix_len=bound, max_kv_len=bound + width)
