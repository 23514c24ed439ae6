"""Triton kernels behind ``specdec.models.ops.topk.softmax_topk`` and ``argmax``.

Imported only where Triton applies (CUDA, or CPU tensors under TRITON_INTERPRET=1).

Two launches, no host sync:

  _chunk_topk   grid (rows, chunks): a program loads BLOCK logits of one row (fp32), writes their
                max m_c and sum_c exp(x - m_c), and its k best (value, column), found by k passes
                of an arg-max that picks the lowest column among equals and then masks it out.
  _merge_topk   grid (rows,): the row's max M = max_c m_c and denominator Z = sum_c s_c exp(m_c - M)
                (the softmax statistics of a split row, as in split-KV attention), then k arg-max
                passes over the chunks' candidates laid out chunk by chunk, so among equal logits
                the lowest column still wins; p = exp(x - M) / Z; the column read through ``id_map`` when one
                is given (a draft vocab's target ids).

``argmax`` is the same split without the softmax: _chunk_argmax keeps each chunk's maximum and
its first column (a NaN, if any: the chunk's first NaN), _merge_argmax the first chunk holding
the row's maximum (or a NaN).

With ``PDL`` (see ``specdec.models.ops.launch``) each kernel waits for the previous one before it
reads, then lets the next launch. A row with fewer than k logits above -inf gets -inf candidates
from the padding past the vocabulary; their token ids are clamped into the vocabulary, so every id
written is a valid index whatever the input.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.models.ops.launch import pdl_kwargs

MAX_BLOCK = 2048  # columns a chunk program holds (fp32: 16 values a thread at 4 warps)


@triton.jit
def _load_chunk(logits_ptr, stride_row, vocab, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """The program's chunk of its row in fp32, -inf past the vocabulary: (row, chunk, offs, x)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    cols = chunk * BLOCK + offs
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=cols < vocab,
                other=float("-inf")).to(tl.float32)
    return row, chunk, offs, x


@triton.jit
def _chunk_topk_kernel(logits_ptr, stride_row, vocab, val_ptr, idx_ptr, max_ptr, sum_ptr, num_chunks,
                       K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row, chunk, offs, x = _load_chunk(logits_ptr, stride_row, vocab, BLOCK, PDL)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # NOTE: an all -inf chunk adds exp(-inf) = 0, not NaN
    s = tl.sum(tl.exp(x - m_safe), axis=0)
    slot = row * num_chunks + chunk
    tl.store(max_ptr + slot, m)
    tl.store(sum_ptr + slot, s)
    for i in tl.static_range(K):
        best, at = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(val_ptr + slot * K + i, best)
        tl.store(idx_ptr + slot * K + i, chunk * BLOCK + at)
        x = tl.where(offs == at, float("-inf"), x)


@triton.jit
def _merge_topk_kernel(val_ptr, idx_ptr, max_ptr, sum_ptr, probs_ptr, index_ptr, map_ptr, num_chunks, vocab,
                       K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_CAND: tl.constexpr, HAS_MAP: tl.constexpr,
                       PDL: tl.constexpr):
    row = tl.program_id(0)
    chunks = tl.arange(0, BLOCK_C)
    cand = tl.arange(0, BLOCK_CAND)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    m = tl.load(max_ptr + row * num_chunks + chunks, mask=chunks < num_chunks, other=float("-inf"))
    s = tl.load(sum_ptr + row * num_chunks + chunks, mask=chunks < num_chunks, other=0.0)
    row_max = tl.max(m, axis=0)
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    denom = tl.sum(s * tl.exp(m - row_max), axis=0)
    base = row * num_chunks * K
    valid = cand < num_chunks * K
    v = tl.load(val_ptr + base + cand, mask=valid, other=float("-inf"))
    ids = tl.load(idx_ptr + base + cand, mask=valid, other=0)
    for i in tl.static_range(K):
        best, at = tl.max(v, axis=0, return_indices=True, return_indices_tie_break_left=True)
        token = tl.sum(tl.where(cand == at, ids, 0), axis=0)
        tl.store(probs_ptr + row * K + i, tl.exp(best - row_max) / denom)
        token = tl.minimum(token, vocab - 1).to(tl.int64)
        if HAS_MAP:
            token = tl.load(map_ptr + token)
        tl.store(index_ptr + row * K + i, token)
        v = tl.where(cand == at, float("-inf"), v)


def _chunks(logits: torch.Tensor, block: int | None) -> tuple[torch.Tensor, int, int]:
    """(logits with unit stride along V, columns a chunk program holds, chunks a row)."""
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    block = block or min(MAX_BLOCK, max(16, triton.next_power_of_2(logits.shape[1])))
    return logits, block, triton.cdiv(logits.shape[1], block)


def softmax_topk(
    logits: torch.Tensor,  # [R, V], unit stride along V
    k: int,
    *,
    id_map: torch.Tensor | None = None,  # [V] int64
    block: int | None = None,  # columns per chunk program (tests force small chunks)
) -> tuple[torch.Tensor, torch.Tensor]:  # ([R, k] fp32, [R, k] int64)
    """Launch (inputs checked by ``specdec.models.ops.topk.softmax_topk``)."""
    logits, block, num_chunks = _chunks(logits, block)
    (rows, vocab), device = logits.shape, logits.device
    cand_val = torch.empty(rows, num_chunks, k, dtype=torch.float32, device=device)
    cand_idx = torch.empty(rows, num_chunks, k, dtype=torch.int32, device=device)
    chunk_max = torch.empty(rows, num_chunks, dtype=torch.float32, device=device)
    chunk_sum = torch.empty(rows, num_chunks, dtype=torch.float32, device=device)
    probs = torch.empty(rows, k, dtype=torch.float32, device=device)
    index = torch.empty(rows, k, dtype=torch.int64, device=device)
    pdl = pdl_kwargs(device)
    _chunk_topk_kernel[(rows, num_chunks)](
        logits, logits.stride(0), vocab, cand_val, cand_idx, chunk_max, chunk_sum, num_chunks,
        K=k, BLOCK=block, num_warps=4, **pdl)
    _merge_topk_kernel[(rows,)](
        cand_val, cand_idx, chunk_max, chunk_sum, probs, index, id_map if id_map is not None else index,
        num_chunks, vocab, K=k, BLOCK_C=max(16, triton.next_power_of_2(num_chunks)),
        BLOCK_CAND=max(16, triton.next_power_of_2(num_chunks * k)), HAS_MAP=id_map is not None, num_warps=4, **pdl)
    return probs, index


@triton.jit
def _first_max(x, offs, BLOCK: tl.constexpr):
    """torch's argmax of a vector: (its maximum, NaN if it holds one; the first position holding it)."""
    is_nan = x != x
    first_nan = tl.min(tl.where(is_nan, offs, BLOCK), axis=0)
    best, at = tl.max(tl.where(is_nan, float("-inf"), x), axis=0, return_indices=True,
                      return_indices_tie_break_left=True)
    has_nan = first_nan < BLOCK
    return tl.where(has_nan, float("nan"), best), tl.where(has_nan, first_nan, at)


@triton.jit
def _chunk_argmax_kernel(logits_ptr, stride_row, vocab, val_ptr, idx_ptr, num_chunks,
                         BLOCK: tl.constexpr, PDL: tl.constexpr):
    row, chunk, offs, x = _load_chunk(logits_ptr, stride_row, vocab, BLOCK, PDL)
    best, at = _first_max(x, offs, BLOCK)
    slot = row * num_chunks + chunk
    tl.store(val_ptr + slot, best)
    tl.store(idx_ptr + slot, chunk * BLOCK + at)


@triton.jit
def _merge_argmax_kernel(val_ptr, idx_ptr, out_ptr, num_chunks, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    chunks = tl.arange(0, BLOCK_C)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    valid = chunks < num_chunks
    v = tl.load(val_ptr + row * num_chunks + chunks, mask=valid, other=float("-inf"))
    ids = tl.load(idx_ptr + row * num_chunks + chunks, mask=valid, other=0)
    _, pick = _first_max(v, chunks, BLOCK_C)  # chunks in column order: the first chunk is the first column
    tl.store(out_ptr + row, tl.sum(tl.where(chunks == pick, ids, 0), axis=0).to(tl.int64))


def argmax(
    logits: torch.Tensor,  # [R, V], unit stride along V
    *,
    block: int | None = None,  # columns per chunk program (tests force small chunks)
) -> torch.Tensor:  # [R] int64
    """Launch (inputs checked by ``specdec.models.ops.topk.argmax``)."""
    logits, block, num_chunks = _chunks(logits, block)
    (rows, vocab), device = logits.shape, logits.device
    chunk_val = torch.empty(rows, num_chunks, dtype=torch.float32, device=device)
    chunk_idx = torch.empty(rows, num_chunks, dtype=torch.int32, device=device)
    out = torch.empty(rows, dtype=torch.int64, device=device)
    pdl = pdl_kwargs(device)
    _chunk_argmax_kernel[(rows, num_chunks)](logits, logits.stride(0), vocab, chunk_val, chunk_idx, num_chunks,
                                             BLOCK=block, num_warps=4, **pdl)
    _merge_argmax_kernel[(rows,)](chunk_val, chunk_idx, out, num_chunks,
                                  BLOCK_C=max(16, triton.next_power_of_2(num_chunks)), num_warps=4, **pdl)
    return out
