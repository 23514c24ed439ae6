"""FlashAttention-4 attention over our KV cache: ``flash_attn.cute.flash_attn_varlen_func``.

FA4 (PyPI ``flash-attn-4``, CuTe DSL, JIT-compiled per shape class on first use, 2-3 s each) runs
on Hopper (SM90) and Blackwell. It reads a paged cache ``[num_pages, page_size, kv_heads, head_dim]``
through ``page_table`` (int32 [num_seqs, pages]) and ``seqused_k`` (int32 [num_seqs]), with varlen
queries (``cu_seqlens_q``). Our cache is token-granular, so, as for fa3, a layer's K buffer
[num_slots, kv_heads, head_dim] is viewed as pages of one slot and each sequence's KV slots are its
page-table row: exact for the host's page_size 1 and 16 alike. The page tables are fa3's
(``flashattention_backend.flash_attention_metadata`` / ``static_flash_attention_metadata``): the
two kernels read the same arguments under other names.

    EXTEND with no cached prefix   one dense causal varlen call over the new K/V (no page table)
    EXTEND, DRAFT_EXTEND, DECODE,  one paged call, causal aligned to the end of each sequence
    draft decode branches
    TARGET_VERIFY, tree="mask_mod" one paged call over prefix + tree whose ``mask_mod`` reads the
    (the default)                  [N, N] tree block of the request (``fa4_masks``)
    TARGET_VERIFY, tree="merge"    prefix part + per-row tree part (page tables of fa3), merged by
                                   log-sum-exp (``merge.merge_attention_states``): 1.3-3.6x slower

Split-KV: FA4 4.0.0b36 refuses its own split-KV on SM90 ("SplitKV not supported on SM 9.0"), and
one CTA per (sequence, KV head) leaves a small decode batch on a few SMs. So unmasked calls whose
sequences have one query row, or are not causal (verify's prefix part), are cut into key chunks by
page table (``fa4_split``): one varlen call over (sequence, chunk) pairs, merged by log-sum-exp.
``fa4_split.plan_num_splits`` sizes the chunks from a host bound on the KV length (eager: the
longest sequence; CUDA graphs: the graph's bound); chunks past a sequence's end are empty. It is
off by default (``num_splits=1``): measured on the H100, the chunked call plus the torch merge of
its parts took longer than the unsplit call at every decode size (bs 1: 66 vs 31 us at 1k keys).

CUDA graphs: every argument is a device tensor or a host int fixed by the batch size and the
graph's length bound, so static forwards (``ForwardBatch.static_max_seq_len``) build their page
tables on the device and are captured like triton's; nothing is planned on the host.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from specdec.attention.base import AttentionBackend, AttentionLayer
from specdec.attention.fa4_split import SplitCall, combine_splits, plan_num_splits, repeat_queries, split_keys
from specdec.attention.flashattention_backend import (
    FlashAttentionMetadata,
    PagedCall,
    flash_attention_metadata,
    static_flash_attention_metadata,
)
from specdec.attention.layout import build_ragged_layout
from specdec.attention.merge import merge_attention_states
from specdec.forward import ForwardBatch, ForwardMode

INSTALL_HINT = ("pip install 'specdec[fa4]' (flash-attn-4 4.0.0b36 tested on an H100; it brings the CuTe DSL, "
                "nvidia-cutlass-dsl, and JIT-compiles on first use)")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
TREE_MODES = ("merge", "mask_mod")


def import_flash_attn_varlen_func() -> Callable[..., object]:
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except (ImportError, AttributeError, OSError) as e:  # absent, or built against another torch / CUDA
        raise ImportError(f"--attention-backend fa4 needs FlashAttention-4 (module flash_attn.cute), which is not "
                          f"importable ({e}): {INSTALL_HINT}") from e
    return flash_attn_varlen_func


def check_device(device: torch.device) -> None:
    if device.type != "cuda":
        raise RuntimeError(f"fa4 backend needs a CUDA device (Hopper or newer), got {device}")


@dataclasses.dataclass(frozen=True)
class FA4Metadata:
    # fa3's page tables: the whole layout (causal), or under the tree mask the prefix part
    # (tree mode "merge") or prefix + tree (tree mode "mask_mod", ``main.causal`` False)
    paged: FlashAttentionMetadata | None  # None with dense_cu_seqlens
    # ``paged.main`` cut into key chunks (``fa4_split``); None: one call
    split: SplitCall | None
    # tree mode "mask_mod": [num_seqs, N, N] int32 tree blocks, the mask_mod's aux tensor
    tree_blocks: torch.Tensor | None
    # EXTEND with no cached prefix: [num_seqs + 1] int32 offsets of the new tokens (q and k alike)
    dense_cu_seqlens: torch.Tensor | None
    # dense only: the longest sequence
    max_len: int = 0


def tree_blocks_of(batch: ForwardBatch, q_lens: list[int] | None) -> torch.Tensor:  # [bs, max N, max N] int32
    """TARGET_VERIFY's tree mask as the mask_mod's aux tensor: request b's [N_b, N_b] block, zero-padded.

    ``q_lens`` are the host's tree sizes (eager); None means N per request (static forwards).
    """
    if batch.tree_mask is None:
        raise ValueError("TARGET_VERIFY batch needs tree_mask")
    bs = batch.batch_size
    if q_lens is None or len(set(q_lens)) <= 1:
        n = batch.num_tokens // max(bs, 1)
        return batch.tree_mask.view(bs, n, n).to(torch.int32).contiguous()
    n_max = max(q_lens)
    blocks = torch.zeros(bs, n_max, n_max, dtype=torch.int32, device=batch.tree_mask.device)
    offset = 0
    for b, n in enumerate(q_lens):
        blocks[b, :n, :n] = batch.tree_mask[offset: offset + n * n].view(n, n)
        offset += n * n
    return blocks


class FA4Backend(AttentionBackend):
    name = "fa4"
    # static forwards build their page tables on the device (``static_flash_attention_metadata``)
    supports_cuda_graph = True
    # TARGET_VERIFY's tree mode when none is given (the registry creates backends without arguments)
    # NOTE: measured on the H100 (benchmarks/results/2026-11-24-h100-fa4): mask_mod is 1.3-3.6x faster
    # than the merge, whose tree part is one FA4 sequence per tree row
    default_tree = "mask_mod"

    def __init__(self, *, tree: str | None = None, num_splits: int | None = 1, waves: float = 2.0,
                 dense_prefill: bool = True) -> None:
        """``tree``: how TARGET_VERIFY applies the tree mask (``TREE_MODES``); ``num_splits`` forces the
        key chunks of splittable calls (None: ``fa4_split.plan_num_splits`` with ``waves``; the default 1
        never splits: on the H100 the chunked call plus its torch merge measured slower than one call); ``dense_prefill``: EXTEND with no cached prefix reads the new K/V directly."""
        tree = tree or self.default_tree
        if tree not in TREE_MODES:
            raise ValueError(f"fa4 backend: tree={tree!r}, expected one of {TREE_MODES}")
        if num_splits is not None and num_splits < 1:
            raise ValueError(f"num_splits={num_splits}: expected >= 1 or None")
        self.tree, self.num_splits, self.waves, self.dense_prefill = tree, num_splits, waves, dense_prefill
        self._varlen = import_flash_attn_varlen_func()
        self._tree_mask_mod = None
        self._num_sms: int | None = None
        if tree == "mask_mod":
            from specdec.attention import fa4_masks

            self._tree_mask_mod = fa4_masks.tree_mask_mod()

    # ------------------------------------------------------------------ planning
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        check_device(batch.input_ids.device)
        verify = batch.forward_mode == ForwardMode.TARGET_VERIFY
        mask_mod = verify and self.tree == "mask_mod"
        static = batch.static_max_seq_len is not None
        if static:
            paged = _unmasked_static(batch) if mask_mod else static_flash_attention_metadata(batch)
            uniform = True
        else:
            dense = self._dense_offsets(batch)
            if dense is not None:
                batch.attn_metadata = FA4Metadata(paged=None, split=None, tree_blocks=None, dense_cu_seqlens=dense,
                                                  max_len=max(batch.host_extend_lens(), default=0))
                return
            layout = build_ragged_layout(batch)
            if mask_mod:  # the whole list of every sequence; the mask is applied in the kernel
                layout = dataclasses.replace(layout, mask=None, mask_indptr=None)
            paged = flash_attention_metadata(layout)
            uniform = len(set(layout.q_lens)) <= 1
        tree_blocks = split = None
        if mask_mod:  # the same table, its causal rule replaced by the tree's mask_mod
            tree_blocks = tree_blocks_of(batch, None if static else batch.host_extend_lens())
            paged = FlashAttentionMetadata(main=dataclasses.replace(paged.main, causal=False), tree=None)
        elif uniform and (not paged.main.causal or paged.main.max_seqlen_q == 1):
            splits = self._plan_splits(paged.main, batch)
            split = split_keys(paged.main, splits) if splits > 1 else None
        batch.attn_metadata = FA4Metadata(paged=paged, split=split, tree_blocks=tree_blocks, dense_cu_seqlens=None)

    def _dense_offsets(self, batch: ForwardBatch) -> torch.Tensor | None:
        if not (self.dense_prefill and batch.forward_mode == ForwardMode.EXTEND and batch.draft_ancestors is None):
            return None
        if any(batch.host_prefix_lens()):
            return None
        lens = torch.tensor([0] + list(batch.host_extend_lens()), dtype=torch.int64)
        return torch.cumsum(lens, 0).to(device=batch.input_ids.device, dtype=torch.int32)

    def _plan_splits(self, main: PagedCall, batch: ForwardBatch) -> int:
        """Key chunks for ``main``, from its table width (the host bound on its sequences' keys)."""
        if self.num_splits is not None:
            return self.num_splits
        if self._num_sms is None:
            self._num_sms = torch.cuda.get_device_properties(batch.input_ids.device).multi_processor_count
        num_seqs, width = main.page_table.shape
        return plan_num_splits(num_seqs, main.max_seqlen_q, width, num_kv_heads=batch.kv_cache.num_kv_heads,
                               num_sms=self._num_sms, waves=self.waves)

    # ------------------------------------------------------------------ running
    def _paged(self, q3: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, part: PagedCall,
               layer: AttentionLayer, *, return_lse: bool = False,
               tree_blocks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        extra = {}
        if tree_blocks is not None:
            extra = dict(mask_mod=self._tree_mask_mod, aux_tensors=[tree_blocks])
        # NOTE: num_splits=1: FA4's own split-KV asserts on SM90; ours is the page-table chunking
        return self._varlen(q3, k_cache, v_cache, cu_seqlens_q=part.cu_seqlens_q, max_seqlen_q=part.max_seqlen_q,
                            seqused_k=part.cache_seqlens, page_table=part.page_table, softmax_scale=layer.scaling,
                            causal=part.causal, num_splits=1, return_lse=return_lse, **extra)

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads * head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        layer: AttentionLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
        md: FA4Metadata = batch.attn_metadata
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        batch.kv_cache.set_kv(layer.layer_id, batch.out_cache_loc, k.view(-1, hkv, d), v.view(-1, hkv, d))
        k_buf, v_buf = batch.kv_cache.get_kv(layer.layer_id)
        if q.shape[0] == 0:
            return torch.empty_like(q)
        if k_buf.dtype not in SUPPORTED_DTYPES or q.dtype != k_buf.dtype:
            raise ValueError(f"fa4 backend: q {q.dtype} and KV cache {k_buf.dtype} must both be float16 or bfloat16")
        q3 = q.reshape(-1, hq, d).contiguous()  # [num_tokens, hq, d]
        if md.dense_cu_seqlens is not None:
            out, _ = self._varlen(q3, k.reshape(-1, hkv, d).contiguous(), v.reshape(-1, hkv, d).contiguous(),
                                  cu_seqlens_q=md.dense_cu_seqlens, cu_seqlens_k=md.dense_cu_seqlens,
                                  max_seqlen_q=md.max_len, max_seqlen_k=md.max_len, softmax_scale=layer.scaling,
                                  causal=True)
            return out.reshape(-1, hq * d)
        k_cache, v_cache = k_buf.unsqueeze(1), v_buf.unsqueeze(1)  # [num_slots, page_size 1, hkv, d]
        tree = md.paged.tree
        if md.split is not None:
            out_parts, lse_parts = self._paged(repeat_queries(q3, md.split), k_cache, v_cache, md.split.part, layer,
                                               return_lse=True)
            out, lse = combine_splits(out_parts, lse_parts, md.split)  # lse [num_tokens, hq]
        elif tree is None:
            out, _ = self._paged(q3, k_cache, v_cache, md.paged.main, layer, tree_blocks=md.tree_blocks)
            return out.reshape(-1, hq * d)
        else:
            out, lse = self._paged(q3, k_cache, v_cache, md.paged.main, layer, return_lse=True)
            lse = lse.transpose(0, 1)  # FA4's varlen LSE is [num_heads, total_q], natural log
        if tree is not None:
            out_tree, lse_tree = self._paged(q3, k_cache, v_cache, tree, layer, return_lse=True)
            out, _ = merge_attention_states(out, lse, out_tree, lse_tree.transpose(0, 1))
        return out.reshape(-1, hq * d)


def _unmasked_static(batch: ForwardBatch) -> FlashAttentionMetadata:
    """A static verify forward planned as if unmasked (prefix + tree, one table): tree mode "mask_mod"."""
    unmasked = dataclasses.replace(batch, forward_mode=ForwardMode.DRAFT_EXTEND)
    return static_flash_attention_metadata(unmasked)


__all__ = ["FA4Backend", "FA4Metadata", "import_flash_attn_varlen_func", "tree_blocks_of"]
