"""The KV lists attention reads, gathered from ``req_to_token`` on the device without host syncs:
FlashInfer-style flat slot lists (``create_kv_indices``), page tables (``create_kv_page_indices``)
and a CUDA-graph-planned forward's whole layout in one launch (``create_kv_layout``).

Each public op checks its inputs and dispatches like the tree ops (Triton on CUDA, or on CPU under
TRITON_INTERPRET=1; the reference otherwise); ``*_ref`` is the specification (host loops).

Glossary: a request *row* is its row of ``req_to_token`` ([max_reqs, max_context] KV slot of each
position); bs = requests; page_size = slots per KV page; a *sequence* is one attention query
row's KV list (a request, or one of its draft branches). Errors in the references raise
ValueError naming the argument; the Triton versions (in ``specdec.kernels.triton.cache_ops``)
raise the same on CPU and, on CUDA, keep their error flag on the device.
"""

from __future__ import annotations

import torch

from specdec.kernels.common import INDEX_DTYPES, check_rows, check_tensor, matches, table_row
from specdec.kernels.dispatch import select_impl


def _check_flat(
    indptr: torch.Tensor, start_idx: torch.Tensor | None, indices: torch.Tensor, *, kind: str, bs: int,
    device: torch.device,
) -> None:
    """The gathers' ``<kind>_indptr`` [>= bs + 1] and flat ``<kind>_indices`` (kind "kv" or "page"),
    and kv_start_idx [bs] or None; int32 or int64."""
    if (matches(indptr, INDEX_DTYPES, None, device) and indptr.dim() == 1 and indptr.shape[0] > bs
            and (start_idx is None or matches(start_idx, INDEX_DTYPES, (bs,), device))
            and matches(indices, INDEX_DTYPES, None, device) and indices.dim() == 1):
        return
    check_tensor(f"{kind}_indptr", indptr, dtype=INDEX_DTYPES, dim=1, device=device)
    if indptr.shape[0] < bs + 1:
        raise ValueError(f"{kind}_indptr: expected at least bs + 1 = {bs + 1} entries, got {indptr.shape[0]}")
    if start_idx is not None:
        check_tensor("kv_start_idx", start_idx, dtype=INDEX_DTYPES, shape=(bs,), device=device)
    check_tensor(f"{kind}_indices", indices, dtype=INDEX_DTYPES, dim=1, device=device)


# --------------------------------------------------------------------------- create_kv_indices
def create_kv_indices(
    req_to_token: torch.Tensor,  # [max_reqs, max_context]
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs] prefix tokens to list per request
    kv_indptr: torch.Tensor,  # [>= bs + 1] request b's slots start at kv_indptr[b]
    kv_start_idx: torch.Tensor | None,  # [bs] first position to list, or None for 0
    kv_indices: torch.Tensor,  # [>= sum(seq_lens)], written
) -> None:
    """FlashInfer-style flattening of each request's prefix slots (see the ref)."""
    bs, device = check_rows(req_to_token, req_pool_indices, {"seq_lens": seq_lens})
    _check_flat(kv_indptr, kv_start_idx, kv_indices, kind="kv", bs=bs, device=device)
    impl = select_impl("create_kv_indices", create_kv_indices_ref, device)
    impl(req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_start_idx, kv_indices)


def create_kv_indices_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
) -> None:
    """Specification of ``create_kv_indices`` (SGLang's create_flashinfer_kv_indices_triton).

    ``kv_indices[kv_indptr[b] + i] = req_to_token[row_b, start_b + i]`` for i < seq_len_b. Example:
    rows [1, 0], seq_lens [2, 3], kv_indptr [0, 2, 5], start None::

        kv_indices = [r2t[1, 0], r2t[1, 1], r2t[0, 0], r2t[0, 1], r2t[0, 2]]
    """
    _gather_ref(req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_start_idx, kv_indices, page_size=1)


def create_kv_page_indices(
    req_to_token: torch.Tensor,  # [max_reqs, max_context]
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs]
    page_indptr: torch.Tensor,  # [>= bs + 1] request b's pages start at page_indptr[b]
    page_indices: torch.Tensor,  # [>= sum(ceil(seq_len / page_size))], written
    *,
    page_size: int,
) -> None:
    """Each request's page table, FlashInfer's paged layout (see the ref)."""
    bs, device = check_rows(req_to_token, req_pool_indices, {"seq_lens": seq_lens})
    _check_flat(page_indptr, None, page_indices, kind="page", bs=bs, device=device)
    if page_size < 1:
        raise ValueError(f"page_size: expected >= 1, got {page_size}")
    impl = select_impl("create_kv_page_indices", create_kv_page_indices_ref, device)
    impl(req_to_token, req_pool_indices, seq_lens, page_indptr, page_indices, page_size=int(page_size))


def create_kv_page_indices_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    page_indptr: torch.Tensor,
    page_indices: torch.Tensor,
    *,
    page_size: int,
) -> None:
    """Specification of ``create_kv_page_indices``.

    ``page_indices[page_indptr[b] + i] = req_to_token[row_b, i * page_size] // page_size`` for
    i < ceil(seq_len_b / page_size): position i*ps is the first of the request's i-th page, and
    PagedKVMemory keeps a page's slots consecutive. Example, page_size 4, row slots
    [28 29 30 31 | 8 9 10 11 | 20], seq_len 9 -> pages [7, 2, 5].
    """
    _gather_ref(req_to_token, req_pool_indices, seq_lens, page_indptr, None, page_indices, page_size=page_size)


def create_kv_layout(
    req_to_token: torch.Tensor,  # [max_reqs, max_context]
    req_pool_indices: torch.Tensor,  # [bs]
    prefix_lens: torch.Tensor,  # [bs] prefix tokens of each request
    own: torch.Tensor,  # [bs * branches, width] each attention sequence's own slots, after its prefix (rows may be strided)
    kv_indptr: torch.Tensor,  # [bs * branches + 1], written
    kv_indices: torch.Tensor,  # [>= sum over sequences of prefix + width], written
) -> None:
    """Every attention sequence's KV list and offsets in one launch (see the ref): the static
    (CUDA-graph) layout of a verify, a draft extend or a draft decode step."""
    bs, device = check_rows(req_to_token, req_pool_indices, {"prefix_lens": prefix_lens})
    if not (isinstance(own, torch.Tensor) and own.dim() == 2 and own.dtype in INDEX_DTYPES and own.device == device
            and (own.shape[1] <= 1 or own.stride(1) == 1)):  # NOTE: rows may be strided (a column slice)
        raise ValueError(f"own: expected a 2-D int32 / int64 tensor on {device} with unit stride along its rows, got "
                         + (f"{own.dtype} {tuple(own.shape)} strides {own.stride()} on {own.device}"
                            if isinstance(own, torch.Tensor) else type(own).__name__))
    if (bs == 0) != (own.shape[0] == 0) or (bs and own.shape[0] % bs):
        raise ValueError(f"own: expected a multiple of bs = {bs} rows (branches per request), got {own.shape[0]}")
    check_tensor("kv_indptr", kv_indptr, dtype=INDEX_DTYPES, shape=(own.shape[0] + 1,), device=device)
    check_tensor("kv_indices", kv_indices, dtype=INDEX_DTYPES, dim=1, device=device)
    impl = select_impl("create_kv_layout", create_kv_layout_ref, device)
    impl(req_to_token, req_pool_indices, prefix_lens, own, kv_indptr, kv_indices)


def create_kv_layout_ref(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    own: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> None:
    """Specification of ``create_kv_layout``.

    Sequence ``s = b * branches + j`` (``branches = own.shape[0] // bs``) lists request b's prefix,
    ``req_to_token[row_b, :prefix_b]``, then ``own[s]``; sequences are packed in order and
    ``kv_indptr`` is their offsets. Example: rows [1, 0], prefix_lens [2, 1], own [[7], [8], [9], [5]]
    (2 branches, width 1)::

        kv_indptr  = [0, 3, 6, 8, 10]
        kv_indices = [r2t[1,0] r2t[1,1] 7 | r2t[1,0] r2t[1,1] 8 | r2t[0,0] 9 | r2t[0,0] 5]
    """
    num_seqs, width = own.shape
    branches = num_seqs // max(req_pool_indices.shape[0], 1)
    rows, prefix = req_pool_indices.repeat_interleave(branches), prefix_lens.repeat_interleave(branches)
    kv_indptr[0] = 0
    kv_indptr[1:] = torch.cumsum(prefix + width, 0)
    create_kv_indices_ref(req_to_token, rows, prefix, kv_indptr, None, kv_indices)
    own_pos = kv_indptr[:-1, None].long() + prefix[:, None] + torch.arange(width, device=own.device)  # [num_seqs, width]
    kv_indices.scatter_(0, own_pos.flatten(), own.flatten().to(kv_indices.dtype))


def _gather_ref(req_to_token, req_pool_indices, seq_lens, indptr, start_idx, out, *, page_size: int) -> None:
    rows, lens, offs = req_pool_indices.tolist(), seq_lens.tolist(), indptr.tolist()
    starts = start_idx.tolist() if start_idx is not None else [0] * len(rows)
    for b, (row, length, start) in enumerate(zip(rows, lens, starts)):
        table = table_row(req_to_token, row, b)
        count = -(-length // page_size)
        if not (0 <= start and 0 <= length and start + length <= table.shape[0]):
            raise ValueError(f"seq_lens/kv_start_idx: request {b} lists positions [{start}, {start + length}) "
                             f"outside [0, {table.shape[0]})")
        if not 0 <= offs[b] <= offs[b] + count <= out.numel():
            raise ValueError(f"indptr: request {b} writes [{offs[b]}, {offs[b] + count}) of {out.numel()} entries")
        firsts = table[start : start + length : page_size]
        out[offs[b] : offs[b] + count] = (firsts // page_size).to(out.dtype)
