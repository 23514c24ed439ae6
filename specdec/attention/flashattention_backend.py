"""FlashAttention-3 attention over our KV cache: ``flash_attn_with_kvcache`` with a page table.

Our cache is token-granular, so it is passed as a paged cache with page_size 1: a layer's K buffer
[num_slots, num_kv_heads, head_dim] viewed as [num_slots, 1, num_kv_heads, head_dim] and each
sequence's KV slots as its row of ``page_table`` (exact for our page_size 1 and 16 alike). Queries
are varlen (``cu_seqlens_q``), one sequence per ``RaggedLayout`` sequence.

flash-attn has no arbitrary mask, so a masked layout (TARGET_VERIFY) runs as two calls merged by
log-sum-exp (``merge.merge_attention_states``):

    prefix part   one sequence per request: its N tree rows over the prefix slots, no mask
    tree part     one sequence per tree row: that row over the tree slots it may see (a page table
                  built from the mask row), no mask

Worked example, prefix [p0 p1], tree 0 -> {1, 2} in slots [n0 n1 n2]:
    prefix part: page_table [[p0, p1]], cache_seqlens [2], cu_seqlens_q [0, 3]
    tree part:   page_table [[n0, 0, 0], [n0, n1, 0], [n0, n2, 0]], cache_seqlens [1, 2, 2], cu_seqlens_q [0, 1, 2, 3]
(the tree part's table is max(N) wide: trimming it to the deepest row would cost a device sync)

Everything else (EXTEND, DRAFT_EXTEND: causal aligned to the end; DECODE and draft decode
branches: one row per sequence) is one causal call. ``init_forward_metadata`` builds the page
tables once per forward; ``forward`` only writes K/V and calls the kernel. The kernel takes its
lengths and page tables as device tensors, so a static forward (CUDA-graph capture) builds them
on the device from ``StaticLayout`` alone, its tables as wide as the graph's length bound.

The kernel comes from FlashAttention-3 (flash-attention's ``hopper/`` build, module
``flash_attn_interface``) or SGLang's ``sgl_kernel.flash_attn`` (same signature), imported when the
backend is created. flash-attn 2.x does not qualify: its paged KV needs page_block_size % 256 == 0.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

import torch

from specdec.attention.base import AttentionBackend, AttentionLayer
from specdec.attention.layout import RaggedLayout, build_ragged_layout, build_static_layout
from specdec.attention.merge import merge_attention_states
from specdec.forward import ForwardBatch, ForwardMode

# (module exposing flash_attn_with_kvcache, how to get it)
KERNEL_MODULES = (
    ("flash_attn_interface", "build FlashAttention-3: flash-attention/hopper, `python setup.py install`"),
    ("sgl_kernel.flash_attn", "pip install sgl-kernel"),
)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


def import_flash_attn_with_kvcache() -> Callable[..., object]:
    for module, _ in KERNEL_MODULES:
        try:
            return importlib.import_module(module).flash_attn_with_kvcache
        except (ImportError, AttributeError, OSError):  # absent, or built against another torch
            continue
    hints = "; or ".join(f"{hint} (module {module})" for module, hint in KERNEL_MODULES)
    raise ImportError("--attention-backend fa3 needs FlashAttention-3's flash_attn_with_kvcache (page table, varlen "
                      f"queries, return_softmax_lse): {hints}. PyPI flash-attn 2.x is not enough: its paged "
                      "KV needs page_block_size % 256 == 0.")


def check_device(device: torch.device) -> None:
    if device.type != "cuda":
        raise RuntimeError(f"fa3 backend needs a CUDA device, got {device}")


@dataclasses.dataclass(frozen=True)
class PagedCall:
    """The arguments of one ``flash_attn_with_kvcache`` call that depend on the batch."""

    # [num_seqs + 1] int32 query rows of sequence s: cu_seqlens_q[s]:cu_seqlens_q[s+1]
    cu_seqlens_q: torch.Tensor
    max_seqlen_q: int
    # [num_seqs] int32 KV entries sequence s reads
    cache_seqlens: torch.Tensor
    # [num_seqs, max_kv] int32 KV slot of each entry (page id with page_size 1), 0 past cache_seqlens
    page_table: torch.Tensor
    causal: bool


@dataclasses.dataclass(frozen=True)
class FlashAttentionMetadata:
    # the whole layout (causal), or under a mask the prefix of every sequence (no mask)
    main: PagedCall
    # masked layouts only: one sequence per query row over the new KV entries that row may see
    tree: PagedCall | None


def page_table_from_ragged(
    kv_indptr: torch.Tensor,  # [num_seqs + 1]
    kv_indices: torch.Tensor,  # [total_kv]
    lens: list[int],  # [num_seqs] how many leading entries of each sequence's list to keep
) -> torch.Tensor:  # [num_seqs, max(lens) or 1] int32, 0-padded
    device = kv_indices.device
    width = max(max(lens, default=0), 1)
    col = torch.arange(width, device=device)[None]  # [1, width]
    valid = col < torch.tensor(lens, dtype=torch.int64, device=device)[:, None]  # [num_seqs, width]
    if kv_indices.numel() == 0:
        return torch.zeros(valid.shape, dtype=torch.int32, device=device)
    idx = (kv_indptr[:-1].to(torch.int64)[:, None] + col).clamp(max=kv_indices.numel() - 1)
    return torch.where(valid, kv_indices[idx], 0).to(torch.int32)


def tree_part(layout: RaggedLayout) -> PagedCall:
    """One sequence per query row: the row's visible new KV entries, read off the layout's mask.

    Row i of sequence s (prefix p = kv_s - q_s) sees new entry j < q_s iff
    ``mask[mask_indptr[s] + i * kv_s + p + j]``; that entry's slot is ``kv_indices[kv_indptr[s] + p + j]``.
    """
    device = layout.kv_indices.device
    q_lens = torch.tensor(layout.q_lens, dtype=torch.int64, device=device)
    kv_lens = torch.tensor(layout.kv_lens, dtype=torch.int64, device=device)
    num_rows, width = sum(layout.q_lens), max(max(layout.q_lens, default=0), 1)
    seq = torch.repeat_interleave(torch.arange(layout.num_seqs, device=device), q_lens)  # [num_rows]
    row = torch.arange(num_rows, device=device) - layout.qo_indptr.to(torch.int64)[seq]  # row within its sequence
    prefix = (kv_lens - q_lens)[seq][:, None]  # [num_rows, 1]
    j = torch.arange(width, device=device)[None]  # [1, width]
    inside = j < q_lens[seq][:, None]  # [num_rows, width]
    bit = layout.mask_indptr.to(torch.int64)[seq][:, None] + row[:, None] * kv_lens[seq][:, None] + prefix + j
    visible = inside & layout.mask[bit.clamp(0, max(layout.mask.numel() - 1, 0))]
    entry = (layout.kv_indptr.to(torch.int64)[seq][:, None] + prefix + j).clamp(max=max(layout.kv_indices.numel() - 1, 0))
    slots = layout.kv_indices[entry]  # [num_rows, width]
    # visible entries first, in column order (the order of KV entries does not change attention)
    order = torch.argsort((~visible).to(torch.int8), dim=1, stable=True)
    count = visible.sum(dim=1)  # [num_rows]
    table = torch.where(j < count[:, None], slots.gather(1, order), 0)
    return PagedCall(
        cu_seqlens_q=torch.arange(num_rows + 1, dtype=torch.int32, device=device),
        max_seqlen_q=1,
        cache_seqlens=count.to(torch.int32),
        page_table=table.to(torch.int32),
        causal=False,
    )


def flash_attention_metadata(layout: RaggedLayout) -> FlashAttentionMetadata:
    """Page tables for one forward (pure torch: runs on any device)."""
    if layout.mask is None:
        lens, tree = layout.kv_lens, None
    else:
        # NOTE: the layout promises every masked row sees its whole prefix; only the new part is masked
        lens, tree = [kv - q for q, kv in zip(layout.q_lens, layout.kv_lens)], tree_part(layout)
    main = PagedCall(
        cu_seqlens_q=layout.qo_indptr.to(torch.int32),
        max_seqlen_q=max(layout.q_lens, default=1),
        cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=layout.kv_indices.device),
        page_table=page_table_from_ragged(layout.kv_indptr, layout.kv_indices, lens),
        causal=layout.mask is None,
    )
    return FlashAttentionMetadata(main=main, tree=tree)


def static_flash_attention_metadata(batch: ForwardBatch) -> FlashAttentionMetadata:
    """``flash_attention_metadata`` of a static forward, from device tensors alone (no host read):
    every sequence has ``q`` query rows and ``own`` entries past its prefix, tables are bound-wide."""
    layout = build_static_layout(batch)
    device = layout.kv_indices.device
    q, own = layout.q_len, layout.max_kv_len - layout.max_prefix_len
    masked = batch.forward_mode == ForwardMode.TARGET_VERIFY
    kv_lens = (layout.kv_indptr[1:] - layout.kv_indptr[:-1]).to(torch.int64)  # [num_seqs] prefix + own
    lens = kv_lens - own if masked else kv_lens  # under the tree mask the main call reads the prefix only
    col = torch.arange(layout.max_prefix_len if masked else layout.max_kv_len, device=device)[None]
    entry = (layout.kv_indptr[:-1].to(torch.int64)[:, None] + col).clamp(max=layout.kv_indices.numel() - 1)
    main = PagedCall(
        cu_seqlens_q=layout.qo_indptr, max_seqlen_q=q, cache_seqlens=lens.to(torch.int32),
        page_table=torch.where(col < lens[:, None], layout.kv_indices[entry], 0).to(torch.int32), causal=not masked)
    if not masked:
        return FlashAttentionMetadata(main=main, tree=None)
    # one sequence per tree row: the request's new slots that row sees (visible ones first)
    num_rows = batch.num_tokens
    visible = batch.tree_mask.view(num_rows, q).to(torch.bool)  # [bs * q, q]
    slots = batch.out_cache_loc.view(-1, 1, q).expand(-1, q, q).reshape(num_rows, q)  # [bs * q, q]
    order = torch.argsort((~visible).to(torch.int8), dim=1, stable=True)
    count = visible.sum(dim=1)
    j = torch.arange(q, device=device)[None]
    tree = PagedCall(
        cu_seqlens_q=torch.arange(num_rows + 1, dtype=torch.int32, device=device), max_seqlen_q=1,
        cache_seqlens=count.to(torch.int32),
        page_table=torch.where(j < count[:, None], slots.gather(1, order), 0).to(torch.int32), causal=False)
    return FlashAttentionMetadata(main=main, tree=tree)


class FlashAttentionBackend(AttentionBackend):
    name = "fa3"
    # static forwards build their page tables on the device (``static_flash_attention_metadata``)
    supports_cuda_graph = True

    def __init__(self) -> None:
        self._flash_attn_with_kvcache = import_flash_attn_with_kvcache()

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        check_device(batch.input_ids.device)
        if batch.static_max_seq_len is not None:
            batch.attn_metadata = static_flash_attention_metadata(batch)
        else:
            batch.attn_metadata = flash_attention_metadata(build_ragged_layout(batch))

    def _call(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, part: PagedCall,
              layer: AttentionLayer, *, return_lse: bool):
        return self._flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=part.cache_seqlens, page_table=part.page_table,
            cu_seqlens_q=part.cu_seqlens_q, max_seqlen_q=part.max_seqlen_q, softmax_scale=layer.scaling,
            causal=part.causal, return_softmax_lse=return_lse)

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads * head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        layer: AttentionLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
        md: FlashAttentionMetadata = batch.attn_metadata
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        batch.kv_cache.set_kv(layer.layer_id, batch.out_cache_loc, k.view(-1, hkv, d), v.view(-1, hkv, d))
        k_buf, v_buf = batch.kv_cache.get_kv(layer.layer_id)
        if q.shape[0] == 0:
            return torch.empty_like(q)
        if k_buf.dtype not in SUPPORTED_DTYPES or q.dtype != k_buf.dtype:
            raise ValueError(f"fa3 backend: q {q.dtype} and KV cache {k_buf.dtype} must both be float16 or bfloat16")
        k_cache, v_cache = k_buf.unsqueeze(1), v_buf.unsqueeze(1)  # [num_slots, page_size 1, hkv, d]
        q3 = q.reshape(-1, hq, d).contiguous()
        if md.tree is None:
            return self._call(q3, k_cache, v_cache, md.main, layer, return_lse=False).reshape(-1, hq * d)
        out_prefix, lse_prefix, *_ = self._call(q3, k_cache, v_cache, md.main, layer, return_lse=True)
        out_tree, lse_tree, *_ = self._call(q3, k_cache, v_cache, md.tree, layer, return_lse=True)
        # flash-attn's varlen LSE is [num_heads, num_tokens]
        out, _ = merge_attention_states(out_prefix, lse_prefix.transpose(0, 1), out_tree, lse_tree.transpose(0, 1))
        return out.reshape(-1, hq * d)
