"""Triton attention over the paged KV cache: our own decode and extend kernels.

``init_forward_metadata`` turns the batch's layout into the int32 index arrays and host ints the
kernels take, once per forward; ``forward`` (once per layer) only writes K/V (one kernel) and
launches.
A draft decode step (``draft_ancestors`` set) runs the draft-step kernel: all of a request's
branches in one program over its shared prefix, read straight from the request-to-token table, then
each branch's ancestors; it needs no slot list. Otherwise one query row per sequence and no mask
(DECODE, a one-token DRAFT_EXTEND) runs the split-KV decode kernel, and everything else the extend
kernel (prefix unmasked, new tokens causal or under TARGET_VERIFY's tree mask, passed as it is).

The target's prefill (EXTEND) plans a request's rows so that they take the same bits whatever other
kinds of request its step holds: a request of one new token (a prompt the prefix cache holds but for
its last token) as a row over its own list (``row_attention``, fixed position splits; on the one-token
prefill graphs too, ``prefill_apart_from_decode``); a fresh prompt, or one of ``prefill_one_pass_min_q``
new tokens or more over a cached prefix, through the extend kernel's one pass (one launch configuration,
no KV split; ``skip`` leaves it the other requests), which folds a row's entries in tiles from position
0: a prompt the scheduler cuts at tile boundaries into chunks that long (``prefill_chunk_rule``) takes
in chunks the bits it takes prefilled whole. Fewer new tokens over a cached prefix (a conversation's next
turn) take the extend kernel's plan by such requests of the step alone (a split prefix: one pass over a
long prefix at small batch cost 10x, 255 against 25 µs a layer for 16 tokens over 8192 on an H200).
Planned by the group, as a decode step of the group's size, a cached prompt's first token took other
bits in each engine: NGRAM's greedy answers equalled plain decoding's in 42 of 80 MT-bench second turns
at 32 requests on an H200, 70 of 80 planned as here, same call; the other four sets within 2 either way
(benchmarks/results/2026-12-01-h200-prefill-one-plan). The cost: a cached prompt's one-token rows take
``row_attention``'s time, not the decode kernel's (bs 1 over 8192 entries 38 against 24 µs a layer of the
8B, bs 32 over 1024 52 against 45); other prefills' within 1 %.

TARGET_VERIFY runs each tree node as a decode step (``decode_attention_rows``): over its own KV list
(prefix, ancestors, itself; built on the device) with the split plan of the decode batch of as many
requests. A node's attention is then the decode step's of the same token bit for bit (under CUDA
graphs; eagerly unless the plans' bounds differ), and with the linear layers' one tiling for 1-8
rows (``specdec.models.ops.gemv``) the whole verify forward of a node is the decode step's. The decode
kernel folds a list's last 16 entries as a tile of their own (its tail), so a node of a tree of up to 16
nodes has its ancestors in its tail alone and the rest of its list inside the prefix. A request's nodes
share the decode kernel's query tile (4 nodes of 4 heads in 16 rows, a program two such tiles; under the
large batches' streaming plan one tile of up to 32 rows) and each prefix tile's load, as the extend kernel
does, then fold their tails side by side in one more tile. Verify batches run so when every request has
the same tree of at most ``verify_rows_max_nodes`` nodes (VERIFY_ROWS_MAX_NODES), or when the batch has at
most ``verify_as_decode_max_rows`` nodes in all (VERIFY_AS_DECODE_MAX_ROWS; trees of more than 16 nodes
then run a grid a node); others run the extend kernel under the tree mask. Measured on an H200
(benchmarks/results/2026-11-29-h200-verify-node-groups): SmolLM2's bf16 greedy answers with EAGLE-3
equal plain decoding's in 8/8, 80/80, 79/80, 122/128 and 233/256 at 1-128 requests at once (vLLM 0.26
beside it: 8/8, 43/80, 36/80, 54/128, 123/256); on the 8B shape at context 1 k an 8-node tree's
attention takes 1.1-1.4x the extend kernel's at 8-64 requests (1.3-1.6x before the tail tile) and its
step 1-10 % longer at 1-64, a 4-node chain's step within its spread
(benchmarks/results/2026-12-02-h200-decode-tail; other warps or stages, or one query tile a program,
made it no cheaper: 2026-12-01-h200-node-group-cost, 2026-12-01-h200-verify-profile). Trees of 9-16
nodes (NGRAM's chains of 9 and 12) take node groups too: with the extend kernel they parted NGRAM's
answers from plain decoding's in 17-28 of 32 prompts at 32 requests in each of five sets, with node
groups in 0-6 (SmolLM2, H200), for 1.05-1.42x the extend kernel's attention for a 12-node chain on the
8B shape at 1-64 requests (benchmarks/results/2026-12-01-h200-ngram-agreement).

Two planners: the ``RaggedLayout`` from host lengths (eager forwards), and, when the batch carries
``static_max_seq_len`` (CUDA-graph capture), the ``StaticLayout`` built on the device alone, whose
grids and split plans are sized by that bound so that one captured graph serves every length.
Deterministic inference plans every batch but a draft step with ``rowwise.plan_row_kv`` (on the
device alone, eager or captured) and runs ``row_attention``: each query row over its own KV list in
fixed position splits.

Sliding windows (``AttentionLayer.sliding_window``, a local layer's) reach every kernel as an argument
(a global layer passes none): decode and row kernels start each list at its last ``window`` entries
(a row or decode query is at its list's last position), the draft-step kernel at its branches' shared
position's window, and the extend kernel skips the prefix tiles no row of a block sees and masks the
rest per row (tree nodes at their ``batch.positions``). Split plans are sized by ``min(bound,
window)``, so local layers read and split only their windows, eagerly and under CUDA graphs alike,
and a verify node as a decode step still equals the decode step of its token bit for bit.

On CPU tensors the kernels run only under the Triton interpreter (TRITON_INTERPRET=1 set before
this module is imported), which is how the CPU tests run them.

NOTE: unlike the model's Triton ops, these kernels launch without programmatic dependent launch:
with it (store, decode, extend and merge) plain decode at bs 1 was 0.9% faster on an H100 but tree
and chain verify at bs 1 0.6-1.3% slower (benchmarks/results/2026-11-26-h100-wide-verify).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import torch

from specdec.attention.base import AttentionBackend, AttentionLayer, ChunkRule
from specdec.attention.layout import build_ragged_layout, build_static_layout
from specdec.attention.rowwise import RowKV, plan_row_kv
from specdec.attention.triton_kernels import (
    decode_attention,
    decode_attention_rows,
    draft_decode_attention,
    extend_attention,
    row_attention,
    store_kv,
)
from specdec.attention.triton_kernels.common import DECODE_TAIL, check_device, widest_kv_tile
from specdec.forward import ForwardBatch, ForwardMode, batch_invariant_enabled, to_device

VERIFY_AS_DECODE_MAX_ROWS = 64
# node groups serve trees whose nodes all fit the decode kernel's tail; a larger tree at any batch size would
# run a grid a node
VERIFY_ROWS_MAX_NODES = DECODE_TAIL


@dataclasses.dataclass(frozen=True)
class TritonMetadata:
    # [num_seqs + 1] int32 query rows of sequence s: qo_indptr[s]:qo_indptr[s+1]
    qo_indptr: torch.Tensor
    # [num_seqs + 1] int32 KV entries of sequence s: kv_indices[kv_indptr[s]:kv_indptr[s+1]]
    kv_indptr: torch.Tensor
    # [total_kv] int32 KV slots, in position order per sequence
    kv_indices: torch.Tensor
    # [sum_s q_s * q_s] uint8 TARGET_VERIFY tree blocks, row-major [q_s, q_s]; None = causal
    mask: torch.Tensor | None
    # [num_seqs + 1] int64 start of each sequence's block in ``mask``; None when mask is None
    mask_indptr: torch.Tensor | None
    # host ints that size grids and split plans without a device sync
    max_q_len: int
    max_kv_len: int
    max_prefix_len: int
    # every sequence has one query row and no mask: the decode kernel
    use_decode: bool


@dataclasses.dataclass(frozen=True)
class VerifyRowsMetadata:
    # every verify node's own KV list (prefix, ancestors by depth, itself), as deterministic mode's
    rows: RowKV
    # the decode batch whose split plan the rows take: its requests and longest KV list (host ints)
    plan_seqs: int
    plan_max_kv_len: int
    # nodes a request (request-major rows): node groups
    nodes_per_seq: int


@dataclasses.dataclass(frozen=True)
class PlannedPrefill:
    """Prefill requests of a few new tokens over a cached prefix: the extend kernel planned by them alone."""

    tokens: torch.Tensor | None  # [T] int64 their packed query rows (None: every row)
    extend: TritonMetadata  # their layout alone


@dataclasses.dataclass(frozen=True)
class PrefillMetadata:
    # the requests of the extend kernel's one pass, the others skipped; None: none such
    extend: TritonMetadata | None
    skip: torch.Tensor | None  # [bs] int8 the requests the one pass leaves (None: none such)
    planned: PlannedPrefill | None  # the few new tokens over a cached prefix (None: none such)
    # the one-token requests' rows over their own lists (``row_attention``); None: none such
    rows: RowKV | None
    row_tokens: torch.Tensor | None  # [R] int64 which packed rows those are (None: every row)


@dataclasses.dataclass(frozen=True)
class DraftStepMetadata:
    # [bs] table row and cached tokens of each request
    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    # [bs * topk, depth] KV slots of each branch's ancestors, itself last
    ancestors: torch.Tensor
    # host bound on the prefixes (the longest, or the captured bound) that sizes the split plan
    max_prefix_len: int


class TritonBackend(AttentionBackend):
    name = "triton"
    supports_cuda_graph = True
    supports_fp8_kv_cache = True
    supports_deterministic = True
    supports_sliding_window = True
    prefill_apart_from_decode = True

    def prefill_chunk_rule(self, device: torch.device) -> ChunkRule:
        """The extend kernel's one pass folds a row's entries in tiles from position 0; a chunk that starts
        on a tile boundary folds its prefix in the tiles the whole prompt's causal pass folds, and one of
        ``prefill_one_pass_min_q`` tokens or more over a prefix runs the one pass (module docstring)."""
        return ChunkRule(align=widest_kv_tile(device), least=prefill_one_pass_min_q(device))

    def __init__(self, *, num_splits: int | None = None,
                 verify_as_decode_max_rows: int = VERIFY_AS_DECODE_MAX_ROWS,
                 verify_rows_max_nodes: int = VERIFY_ROWS_MAX_NODES) -> None:
        """``num_splits`` forces the split-KV count (default: planned from the grid and lengths);
        ``verify_as_decode_max_rows`` / ``verify_rows_max_nodes``: the verify batches whose nodes run
        as decode steps (module docstring; both 0: always the extend kernel)."""
        if num_splits is not None and num_splits < 1:
            raise ValueError(f"num_splits={num_splits}: expected >= 1 or None")
        self.num_splits = num_splits
        self.verify_as_decode_max_rows = verify_as_decode_max_rows
        self.verify_rows_max_nodes = verify_rows_max_nodes

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        check_device(batch.input_ids.device)
        if batch.draft_ancestors is not None:
            bound = batch.static_max_seq_len
            batch.attn_metadata = DraftStepMetadata(
                req_pool_indices=batch.req_pool_indices,
                prefix_lens=batch.prefix_lens,
                ancestors=batch.draft_ancestors,
                max_prefix_len=bound if bound is not None else max(batch.host_prefix_lens(), default=0),
            )
            return
        if batch_invariant_enabled():  # eager or under a CUDA graph: planned on the device alone
            batch.attn_metadata = plan_row_kv(batch)
            return
        if batch.forward_mode == ForwardMode.TARGET_VERIFY and self._verifies_as_decode(batch):
            batch.attn_metadata = _plan_verify_rows(batch)
            return
        if batch.forward_mode == ForwardMode.EXTEND:
            batch.attn_metadata = _plan_prefill(batch)
            return
        if batch.static_max_seq_len is not None:
            batch.attn_metadata = self._plan_static(batch)
            return
        batch.attn_metadata = _plan_ragged(batch)

    def _verifies_as_decode(self, batch: ForwardBatch) -> bool:
        """Whether a verify batch's nodes run as decode steps (module docstring)."""
        nodes = batch.num_tokens // max(batch.batch_size, 1)
        return (batch.num_tokens <= self.verify_as_decode_max_rows or nodes <= self.verify_rows_max_nodes) \
            and _same_tree_size(batch)

    @staticmethod
    def _plan_static(batch: ForwardBatch) -> TritonMetadata:
        layout = build_static_layout(batch)
        mask, mask_indptr = _tree_mask(batch, None, q_len=layout.q_len)
        return TritonMetadata(
            qo_indptr=layout.qo_indptr,
            kv_indptr=layout.kv_indptr,
            kv_indices=layout.kv_indices,
            mask=mask,
            mask_indptr=mask_indptr,
            max_q_len=layout.q_len,
            max_kv_len=layout.max_kv_len,
            max_prefix_len=layout.max_prefix_len,
            use_decode=mask is None and layout.q_len == 1,
        )

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads * head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        layer: AttentionLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
        md: TritonMetadata | VerifyRowsMetadata | DraftStepMetadata | RowKV = batch.attn_metadata
        hq, d = layer.num_heads, layer.head_dim
        k_buf, v_buf = batch.kv_cache.get_kv(layer.layer_id)
        store_kv(k_buf, v_buf, batch.out_cache_loc, k, v)
        q3 = q.reshape(-1, hq, d)  # [num_tokens, hq, d]
        out = torch.empty_like(q3, memory_format=torch.contiguous_format)
        window = layer.sliding_window
        if isinstance(md, DraftStepMetadata):
            draft_decode_attention(q3, k_buf, v_buf, batch.req_to_token, md.req_pool_indices, md.prefix_lens,
                                   md.ancestors, out, sm_scale=layer.scaling, max_prefix_len=md.max_prefix_len,
                                   num_splits=self.num_splits, window=window)
        elif isinstance(md, VerifyRowsMetadata):
            decode_attention_rows(q3, k_buf, v_buf, md.rows.kv_table, md.rows.row_lens, out, sm_scale=layer.scaling,
                                  max_kv_len=md.plan_max_kv_len, plan_seqs=md.plan_seqs, num_splits=self.num_splits,
                                  window=window, nodes_per_seq=md.nodes_per_seq)
        elif isinstance(md, RowKV):
            row_attention(q3, k_buf, v_buf, md.kv_table, md.row_list, md.row_lens, out, sm_scale=layer.scaling,
                          max_kv_len=md.max_kv_len, window=window)
        elif isinstance(md, PrefillMetadata):
            _prefill_attention(q3, k_buf, v_buf, out, md, layer, window, batch.positions)
        elif md.use_decode:
            # NOTE: with one row per sequence, sequence s is packed query row s (qo_indptr = 0..n), and its
            # query is at its list's last position (what the window counts back from)
            decode_attention(q3, k_buf, v_buf, md.kv_indptr, md.kv_indices, out, sm_scale=layer.scaling,
                             max_kv_len=md.max_kv_len, num_splits=self.num_splits, window=window)
        else:
            extend_attention(q3, k_buf, v_buf, md.qo_indptr, md.kv_indptr, md.kv_indices, md.mask,
                             md.mask_indptr, out, sm_scale=layer.scaling, max_q_len=md.max_q_len,
                             max_prefix_len=md.max_prefix_len, num_splits=self.num_splits, window=window,
                             positions=batch.positions)
        return out.view(-1, hq * d)


def _plan_ragged(batch: ForwardBatch) -> TritonMetadata:
    """An eager batch's layout and plan bounds from its host lengths."""
    layout = build_ragged_layout(batch)
    mask, mask_indptr = _tree_mask(batch, layout.q_lens)
    return _metadata(layout.qo_indptr, layout.kv_indptr, layout.kv_indices, layout.q_lens, layout.kv_lens,
                     mask, mask_indptr)


def _metadata(qo_indptr, kv_indptr, kv_indices, q_lens: list[int], kv_lens: list[int], mask=None, mask_indptr=None
              ) -> TritonMetadata:
    """TritonMetadata of a layout (device offsets and slots; host lengths for the bounds)."""
    return TritonMetadata(
        qo_indptr=qo_indptr.to(torch.int32),
        kv_indptr=kv_indptr.to(torch.int32),
        kv_indices=kv_indices.to(torch.int32),
        mask=mask,
        mask_indptr=mask_indptr,
        max_q_len=max(q_lens, default=0),
        max_kv_len=max(kv_lens, default=0),
        max_prefix_len=max((kv - q for q, kv in zip(q_lens, kv_lens)), default=0),
        use_decode=mask is None and all(q == 1 for q in q_lens),
    )


def prefill_one_pass_min_q(device: torch.device) -> int:
    """New tokens from which a prefill request over a cached prefix runs the extend kernel's one pass
    (four of the widest KV tiles: 512 on a GPU); fewer take the plan that splits the prefix."""
    return 4 * widest_kv_tile(device)


def _plan_prefill(batch: ForwardBatch) -> PrefillMetadata:
    """The target's prefill (module docstring): a request of one new token (a cached prompt's last; every
    request of a captured one-token prefill) as a row over its own list; one of fewer than
    ``prefill_one_pass_min_q`` over a cached prefix through the extend kernel planned by such requests
    alone; the others through its one pass."""
    if batch.static_max_seq_len is not None:
        if batch.num_tokens != batch.batch_size:
            raise ValueError("triton: a captured prefill takes one new token a request")
        return PrefillMetadata(extend=None, skip=None, planned=None, rows=plan_row_kv(batch), row_tokens=None)
    device = batch.input_ids.device
    q_lens = batch.host_extend_lens()
    if all(q == 1 for q in q_lens):
        return PrefillMetadata(extend=None, skip=None, planned=None, rows=plan_row_kv(batch), row_tokens=None)
    layout = build_ragged_layout(batch)
    whole = _metadata(layout.qo_indptr, layout.kv_indptr, layout.kv_indices, q_lens, layout.kv_lens)
    min_q = prefill_one_pass_min_q(device)
    planned = [1 < q < min_q and kv > q for q, kv in zip(q_lens, layout.kv_lens)]
    if all(planned):  # (the usual such step: its layout as it is, no rows to gather)
        return PrefillMetadata(extend=None, skip=None, planned=PlannedPrefill(tokens=None, extend=whole), rows=None,
                               row_tokens=None)
    one_pass = [q > 1 and not p for q, p in zip(q_lens, planned)]
    skip = None if all(one_pass) else to_device([int(not x) for x in one_pass], torch.int8, device)
    token_starts = list(itertools.accumulate(q_lens, initial=0))
    rows = row_tokens = None
    singles = [s for s, q in enumerate(q_lens) if q == 1]
    if singles:
        row_tokens = to_device([token_starts[s] for s in singles], torch.int64, device)
        every = plan_row_kv(batch)
        rows = dataclasses.replace(every, row_list=every.row_list[row_tokens], row_lens=every.row_lens[row_tokens])
    seqs = [s for s, p in enumerate(planned) if p]
    return PrefillMetadata(extend=whole if any(one_pass) else None, skip=skip,
                           planned=_planned_prefill(layout, seqs, token_starts) if seqs else None,
                           rows=rows, row_tokens=row_tokens)


def _planned_prefill(layout, seqs: list[int], token_starts: list[int]) -> PlannedPrefill:
    """Sequences ``seqs`` of ``layout`` as a layout of their own, and their packed rows."""
    device = layout.qo_indptr.device
    kv_starts = list(itertools.accumulate(layout.kv_lens, initial=0))
    q_lens = [layout.q_lens[s] for s in seqs]
    kv_lens = [layout.kv_lens[s] for s in seqs]
    tokens = np.concatenate([np.arange(token_starts[s], token_starts[s + 1]) for s in seqs])
    entries = np.concatenate([np.arange(kv_starts[s], kv_starts[s + 1]) for s in seqs])
    md = _metadata(to_device(list(itertools.accumulate(q_lens, initial=0)), torch.int64, device),
                   to_device(list(itertools.accumulate(kv_lens, initial=0)), torch.int64, device),
                   layout.kv_indices[to_device(entries.tolist(), torch.int64, device)], q_lens, kv_lens)
    return PlannedPrefill(tokens=to_device(tokens.tolist(), torch.int64, device), extend=md)


def _prefill_attention(q3, k_buf, v_buf, out, md: PrefillMetadata, layer: AttentionLayer, window, positions) -> None:
    """``forward`` of a prefill (``_plan_prefill``): the one pass's requests, the planned ones (their rows
    gathered), then the one-token rows."""
    if md.extend is not None:
        e = md.extend
        extend_attention(q3, k_buf, v_buf, e.qo_indptr, e.kv_indptr, e.kv_indices, None, None, out,
                         sm_scale=layer.scaling, max_q_len=e.max_q_len, max_prefix_len=e.max_prefix_len,
                         window=window, positions=positions, one_plan=True, skip=md.skip)
    if md.planned is not None:
        e = md.planned.extend
        _on_rows(md.planned.tokens, q3, out, lambda q, o: extend_attention(
            q, k_buf, v_buf, e.qo_indptr, e.kv_indptr, e.kv_indices, None, None, o, sm_scale=layer.scaling,
            max_q_len=e.max_q_len, max_prefix_len=e.max_prefix_len, window=window))
    if md.rows is not None:
        r = md.rows
        _on_rows(md.row_tokens, q3, out, lambda q, o: row_attention(
            q, k_buf, v_buf, r.kv_table, r.row_list, r.row_lens, o, sm_scale=layer.scaling,
            max_kv_len=r.max_kv_len, window=window))


def _on_rows(tokens: torch.Tensor | None, q3: torch.Tensor, out: torch.Tensor, attend) -> None:
    """``attend(q, o)`` over packed rows ``tokens`` of ``q3`` into those of ``out`` (gathered and scattered
    back), or over every row in place (None)."""
    if tokens is None:
        attend(q3, out)
        return
    part = torch.empty(tokens.shape[0], *out.shape[1:], dtype=out.dtype, device=out.device)
    attend(q3[tokens], part)
    out.index_copy_(0, tokens, part)


def _same_tree_size(batch: ForwardBatch) -> bool:
    """Every request verifies as many nodes (as the workers' verify does; a batch that does not runs
    the extend kernel). Always so for a captured batch."""
    return batch.static_max_seq_len is not None or len(set(batch.host_extend_lens())) <= 1


def _plan_verify_rows(batch: ForwardBatch) -> VerifyRowsMetadata:
    """A verify batch's rows as decode steps: each over its own list (``plan_row_kv``; on the device
    alone), split as the decode batch of as many requests over the same prefixes plus one token.
    Under a CUDA graph that is the decode graph's plan (the captured bound plus one: bit for bit);
    eagerly the longest prefix plus one (the plan of the decode step after the root).

    NOTE: for a local layer ``decode.py`` sizes both plans by ``min(bound, window)`` (``window_span``)
    and cuts a row's window from its own length as the decode step's: the equality holds there too,
    as long as the bound here is the decode batch's.
    """
    if batch.static_max_seq_len is not None:
        bound = batch.static_max_seq_len
    else:
        bound = max(batch.host_prefix_lens(), default=0)
    return VerifyRowsMetadata(rows=plan_row_kv(batch), plan_seqs=batch.batch_size, plan_max_kv_len=bound + 1,
                              nodes_per_seq=batch.num_tokens // max(batch.batch_size, 1))


def _tree_mask(
    batch: ForwardBatch, q_lens: list[int] | None, *, q_len: int = 0
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """TARGET_VERIFY's [q, q] tree blocks as the extend kernel reads them, and their offsets.

    Query rows per request come from the host (``q_lens``) or are ``q_len`` for every request
    (static plans: the offsets are then computed on the device).
    """
    if batch.forward_mode != ForwardMode.TARGET_VERIFY:
        return None, None
    if batch.tree_mask is None:
        raise ValueError("TARGET_VERIFY batch needs tree_mask")
    # NOTE: a bool tensor viewed as uint8 is the same bytes; the kernel tests != 0
    mask = batch.tree_mask.contiguous().view(torch.uint8)
    if q_lens is None:
        return mask, torch.arange(batch.batch_size + 1, dtype=torch.int64, device=mask.device) * (q_len * q_len)
    sizes = torch.tensor([0] + [q * q for q in q_lens], dtype=torch.int64)
    return mask, torch.cumsum(sizes, 0).to(mask.device)
