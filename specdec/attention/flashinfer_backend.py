"""FlashInfer attention over our KV cache: paged decode and paged prefill with a custom mask.

Our cache is token-granular (slot ``s`` holds one token's K/V, whatever the host's page_size), so
it is handed to FlashInfer as a paged cache with page_size 1: a layer's K buffer
[num_slots, num_kv_heads, head_dim] viewed as [num_pages = num_slots, 1, num_kv_heads, head_dim]
(NHD), the KV slots of a sequence as its page indices and every last page full (length 1). That is
exact for our page_size 1 and 16 alike; the ``RaggedLayout`` already lists the slots.

    DECODE, draft decode step (one branch = one sequence), one-token DRAFT_EXTEND
                     -> BatchDecodeWithPagedKVCacheWrapper
    EXTEND, DRAFT_EXTEND (causal, aligned to the end of each sequence), TARGET_VERIFY (custom mask:
    the layout's [q_s, kv_s] block per sequence, prefix columns all True)
                     -> BatchPrefillWithPagedKVCacheWrapper (backend "fa2": the one that takes a
                        custom mask, so one compiled module serves every mode)

CUDA graphs: a static forward (a batch with ``static_max_seq_len``) runs on a wrapper of its own in
FlashInfer's CUDA-graph mode, whose index buffers stay put. The graph runner calls ``plan_static``
with the host's lengths before each replay (FlashInfer's ``plan`` is host work: it cannot be
captured); inside the graph, ``init_forward_metadata`` only writes the KV slot lists into the
wrapper's index buffer, from ``req_to_token`` on the device, so the captured kernels read this
replay's slots under this replay's plan.

Eager planning: ``init_forward_metadata`` builds the int32 index arrays and calls the wrapper's ``plan``
once per forward; ``forward`` (once per layer) writes K/V and calls ``run``. ``plan`` needs the
layer's head counts, head_dim, scale and dtype, which a batch does not carry: the backend learns
them from the first layer it runs (or from ``layer=`` at construction), so only a backend's very
first forward plans inside ``forward``. A forward whose layer shape differs from the planned one,
or whose metadata is not the last planned, is re-planned before it runs (correct, just slower).

FlashInfer is imported when the backend is created. Its kernels are JIT-compiled with nvcc on
first use per (dtype, head_dim) and cached under ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``;
``build_kernels`` compiles the ones we use in one parallel ninja run.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, NamedTuple

import numpy as np
import torch

from specdec.attention.base import AttentionBackend, AttentionLayer, StaticPlan, static_plan_key
from specdec.attention.layout import RaggedLayout, build_ragged_layout, build_static_layout
from specdec.forward import ForwardBatch, ForwardMode

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
SUPPORTED_HEAD_DIMS = (64, 128, 256)
# query heads per KV head that FlashInfer's decode kernel dispatches; others decode on the prefill kernel
DECODE_GROUP_SIZES = (1, 2, 3, 4, 8)
WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's recommended float workspace (split-KV partial results)
INSTALL_HINT = "pip install flashinfer-python (0.6.0 tested; its kernels JIT-compile with nvcc on first use)"


def import_flashinfer() -> Any:
    try:
        import flashinfer
    except ImportError as e:
        raise ImportError(f"--attention-backend flashinfer needs FlashInfer, which is not importable ({e}): "
                          f"{INSTALL_HINT}") from e
    return flashinfer


def check_device(device: torch.device) -> None:
    if device.type != "cuda":
        raise RuntimeError(f"flashinfer backend needs a CUDA device, got {device}")


class PlanShape(NamedTuple):
    """What FlashInfer's ``plan`` needs from the layer (a batch does not carry it)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    dtype: torch.dtype


def plan_shape(layer: AttentionLayer, dtype: torch.dtype) -> PlanShape:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"flashinfer backend: dtype {dtype} unsupported; expected float16 or bfloat16")
    if layer.head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"flashinfer backend: head_dim {layer.head_dim} unsupported; expected one of "
                         f"{SUPPORTED_HEAD_DIMS}")
    return PlanShape(layer.num_heads, layer.num_kv_heads, layer.head_dim, float(layer.scaling), dtype)


@dataclasses.dataclass(frozen=True)
class FlashInferMetadata:
    # [num_seqs + 1] int32 query rows of sequence s: qo_indptr[s]:qo_indptr[s+1]
    qo_indptr: torch.Tensor
    # [num_seqs + 1] int32 pages (= KV slots) of sequence s: kv_indices[kv_indptr[s]:kv_indptr[s+1]]
    kv_indptr: torch.Tensor
    # [total_kv] int32 KV slots, in position order per sequence
    kv_indices: torch.Tensor
    # [num_seqs] int32 ones: with page_size 1 every sequence's last page holds one entry
    last_page_len: torch.Tensor
    # [sum_s q_s * kv_s] bool row-major [q_s, kv_s] per sequence; None = causal aligned to the end
    custom_mask: torch.Tensor | None
    # every sequence has one query row and no mask: a decode
    one_row_per_seq: bool
    # distinguishes this forward's plan from any other's
    plan_id: int
    # a static forward's CUDA-graph wrapper and plan (None: the shared eager wrappers)
    graph: "_GraphPlan | None" = None


@dataclasses.dataclass
class _GraphPlan:
    """A static forward's wrapper in FlashInfer's CUDA-graph mode, with the buffers it reads."""

    request: StaticPlan  # the last plan asked for
    indptr: torch.Tensor  # [num_seqs + 1] int32
    indices: torch.Tensor  # [num_seqs * (max_seq_len + own)] int32, written inside the graph
    last_page_len: torch.Tensor  # [num_seqs] int32 ones
    qo_indptr: torch.Tensor  # [num_seqs + 1] int32
    mask: torch.Tensor | None  # packed TARGET_VERIFY mask (uint8) and its byte offsets
    mask_indptr: torch.Tensor | None
    wrapper: Any = None  # made at the first plan that knows the layer shape
    decode: bool = False
    planned: PlanShape | None = None  # the shape ``request`` was planned with, None = not yet


def flashinfer_metadata(layout: RaggedLayout, plan_id: int) -> FlashInferMetadata:
    """The layout in FlashInfer's paged form with page_size 1 (pure torch: runs on any device)."""
    device = layout.kv_indices.device
    return FlashInferMetadata(
        qo_indptr=layout.qo_indptr.to(torch.int32),
        kv_indptr=layout.kv_indptr.to(torch.int32),
        kv_indices=layout.kv_indices.to(torch.int32),
        last_page_len=torch.ones(layout.num_seqs, dtype=torch.int32, device=device),
        custom_mask=layout.mask.contiguous() if layout.mask is not None else None,
        one_row_per_seq=layout.mask is None and all(q == 1 for q in layout.q_lens),
        plan_id=plan_id,
    )


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"
    # FlashInfer's plan reads lengths on the host: static forwards are planned before each replay
    supports_cuda_graph = True
    plans_on_host = True

    def __init__(self, *, layer: AttentionLayer | None = None, dtype: torch.dtype | None = None,
                 use_tensor_cores: bool = False, workspace_bytes: int = WORKSPACE_BYTES) -> None:
        """``layer`` / ``dtype``: plan the first forward ahead too; ``use_tensor_cores``: decode on
        the prefill kernel (FlashInfer's advice for large GQA groups)."""
        self._fi = import_flashinfer()
        self.use_tensor_cores = use_tensor_cores
        self.workspace_bytes = workspace_bytes
        self._shape = plan_shape(layer, dtype) if layer is not None and dtype is not None else None
        self._device: torch.device | None = None
        self._decode = self._prefill = None
        self._plan_ids = itertools.count()
        self._planned: tuple[int, PlanShape] | None = None  # (plan_id, shape) the wrappers hold now
        self._use_decode_wrapper = False
        self._workspace: torch.Tensor | None = None
        # static forwards (CUDA graphs): one wrapper each, by ``StaticPlan.key``
        self._graphs: dict[tuple, _GraphPlan] = {}

    def _ensure_wrappers(self, device: torch.device) -> None:
        check_device(device)
        if self._device == device:
            return
        # NOTE: one float workspace shared by both wrappers: a forward plans and runs only one of them
        workspace = self._workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device)
        self._decode = self._fi.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=self.use_tensor_cores, backend="fa2")
        self._prefill = self._fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        self._device, self._planned = device, None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._ensure_wrappers(batch.input_ids.device)
        if batch.static_max_seq_len is not None:
            batch.attn_metadata = self._static_metadata(batch)
            return
        md = flashinfer_metadata(build_ragged_layout(batch), next(self._plan_ids))
        batch.attn_metadata = md
        if self._shape is not None and batch.num_tokens > 0:
            self._plan(md, self._shape)

    def _plan(self, md: FlashInferMetadata, shape: PlanShape) -> None:
        hq, hkv, d, scale, dtype = shape
        common = dict(q_data_type=dtype, kv_data_type=dtype, sm_scale=scale)
        self._use_decode_wrapper = md.one_row_per_seq and (self.use_tensor_cores or hq // hkv in DECODE_GROUP_SIZES)
        if self._use_decode_wrapper:
            self._decode.plan(md.kv_indptr, md.kv_indices, md.last_page_len, hq, hkv, d, 1,
                              pos_encoding_mode="NONE", **common)
        else:
            # NOTE: the bool mask, not ``packed_custom_mask``: with a packed mask FlashInfer (<= 0.7.2)
            # derives per-sequence offsets in bits where its kernel reads bytes, wrong past one sequence.
            self._prefill.plan(md.qo_indptr, md.kv_indptr, md.kv_indices, md.last_page_len, hq, hkv, d, 1,
                               custom_mask=md.custom_mask, causal=md.custom_mask is None, **common)
        self._planned = (md.plan_id, shape)

    # ------------------------------------------------------------ CUDA graphs
    def plan_static(self, plan: StaticPlan) -> None:
        """Plan a static forward from host lengths, before its graph is captured or replayed."""
        gp = self._graphs.get(plan.key)
        if gp is None:
            gp = self._graphs[plan.key] = self._new_graph_plan(plan)
        gp.request = plan
        gp.planned = None
        if self._shape is not None:
            self._plan_graph(gp, self._shape)

    def _new_graph_plan(self, plan: StaticPlan) -> _GraphPlan:
        device = plan.device
        self._ensure_wrappers(device)
        n = len(plan.prefix_lens)
        width = plan.max_seq_len + plan.own
        int32 = dict(dtype=torch.int32, device=device)
        verify = plan.forward_mode == ForwardMode.TARGET_VERIFY
        return _GraphPlan(
            request=plan,
            indptr=torch.zeros(n + 1, **int32),
            indices=torch.zeros(n * width, **int32),
            last_page_len=torch.ones(n, **int32),
            qo_indptr=torch.zeros(n + 1, **int32),
            mask=torch.zeros(n * -(-plan.q_len * width // 8), dtype=torch.uint8, device=device) if verify else None,
            mask_indptr=torch.zeros(n + 1, **int32) if verify else None,
        )

    def _plan_graph(self, gp: _GraphPlan, shape: PlanShape) -> None:
        hq, hkv, d, scale, dtype = shape
        plan = gp.request
        n, q = len(plan.prefix_lens), plan.q_len
        kv_lens = np.asarray(plan.prefix_lens, dtype=np.int64) + plan.own
        kv_indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32))
        last_page_len = torch.ones(n, dtype=torch.int32)
        no_indices = gp.indices[:0]  # the graph writes them (``_static_metadata``)
        common = dict(q_data_type=dtype, kv_data_type=dtype, sm_scale=scale)
        if gp.wrapper is None:
            gp.decode = (q == 1 and plan.tree_mask is None
                         and (self.use_tensor_cores or hq // hkv in DECODE_GROUP_SIZES))
            gp.wrapper = self._graph_wrapper(gp)
        if gp.decode:
            gp.wrapper.plan(kv_indptr, no_indices, last_page_len, hq, hkv, d, 1, pos_encoding_mode="NONE", **common)
        else:
            qo_indptr = torch.arange(n + 1, dtype=torch.int32) * q
            packed = byte_indptr = None
            if plan.tree_mask is not None:
                packed, byte_indptr = self._packed_verify_mask(plan, kv_lens)
            gp.wrapper.plan(qo_indptr, kv_indptr, no_indices, last_page_len, hq, hkv, d, 1,
                            packed_custom_mask=packed, causal=packed is None, **common)
            if byte_indptr is not None:
                # NOTE: given a packed mask, FlashInfer's plan (0.6.0) stores the segments' offsets in
                # bits, where its kernel reads bytes: put the byte offsets in the buffer it reads
                gp.mask_indptr.copy_(byte_indptr, non_blocking=True)
        gp.planned = shape

    def _graph_wrapper(self, gp: _GraphPlan) -> Any:
        if gp.decode:
            return self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self.use_tensor_cores,
                paged_kv_indptr_buffer=gp.indptr, paged_kv_indices_buffer=gp.indices,
                paged_kv_last_page_len_buffer=gp.last_page_len, backend="fa2")
        return self._fi.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=gp.qo_indptr, paged_kv_indptr_buf=gp.indptr,
            paged_kv_indices_buf=gp.indices, paged_kv_last_page_len_buf=gp.last_page_len,
            custom_mask_buf=gp.mask, mask_indptr_buf=gp.mask_indptr, backend="fa2")

    def _packed_verify_mask(self, plan: StaticPlan, kv_lens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """TARGET_VERIFY's [q, prefix + q] blocks (prefix columns True), bit-packed per sequence
        (little bit order, each sequence from a byte boundary), and the blocks' byte offsets."""
        q, device = plan.q_len, plan.tree_mask.device
        bits = q * kv_lens  # [n] mask bits per sequence
        bit_start = np.concatenate([[0], np.cumsum(bits)])
        byte_start = np.concatenate([[0], np.cumsum((bits + 7) // 8)])
        # tree entry (i, j) of sequence s sits at row i, column prefix_s + j of its block
        prefix = np.asarray(plan.prefix_lens, dtype=np.int64)[:, None, None]
        i, j = np.arange(q)[None, :, None], np.arange(q)[None, None, :]
        where = (bit_start[:-1, None, None] + i * (prefix + q) + prefix + j).reshape(-1)
        full = torch.ones(int(bit_start[-1]), dtype=torch.bool, device=device)
        full[torch.from_numpy(where).to(device, non_blocking=True)] = plan.tree_mask.view(-1).to(torch.bool)
        packed = torch.empty(int(byte_start[-1]), dtype=torch.uint8, device=device)
        bit_indptr = torch.from_numpy(bit_start.astype(np.int32)).to(device, non_blocking=True)
        byte_indptr = torch.from_numpy(byte_start.astype(np.int32)).to(device, non_blocking=True)
        # NOTE: the packing kernel itself: flashinfer.segment_packbits reads the output size on the host
        self._fi.quantization.get_quantization_module().segment_packbits(full, bit_indptr, byte_indptr, "little",
                                                                          packed)
        return packed, byte_indptr

    def _static_metadata(self, batch: ForwardBatch) -> FlashInferMetadata:
        """Inside the graph: this forward's KV slot lists, into its planned wrapper's index buffer."""
        layout = build_static_layout(batch)
        key = static_plan_key(batch.forward_mode, layout.kv_indptr.shape[0] - 1, layout.q_len,
                              layout.max_kv_len - layout.max_prefix_len)
        gp = self._graphs.get(key)
        if gp is None:
            raise RuntimeError(f"flashinfer backend: static forward {key} was not planned; the graph runner must "
                               "call plan_static before capturing or replaying it")
        gp.indices.copy_(layout.kv_indices)
        return FlashInferMetadata(
            qo_indptr=layout.qo_indptr, kv_indptr=layout.kv_indptr, kv_indices=gp.indices,
            last_page_len=gp.last_page_len, custom_mask=None, one_row_per_seq=gp.decode, plan_id=-1, graph=gp)

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads * head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        layer: AttentionLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
        md: FlashInferMetadata = batch.attn_metadata
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        batch.kv_cache.set_kv(layer.layer_id, batch.out_cache_loc, k.view(-1, hkv, d), v.view(-1, hkv, d))
        k_buf, v_buf = batch.kv_cache.get_kv(layer.layer_id)
        if q.shape[0] == 0:
            return torch.empty_like(q)
        if q.dtype != k_buf.dtype:
            raise ValueError(f"flashinfer backend: q dtype {q.dtype} differs from the KV cache's {k_buf.dtype}")
        shape = plan_shape(layer, k_buf.dtype)
        paged = (k_buf.unsqueeze(1), v_buf.unsqueeze(1))  # [num_slots, page_size 1, hkv, d] each
        if md.graph is not None:
            if md.graph.planned != shape:  # a warm-up run before capture: the first to know the shape
                self._shape = shape
                self._plan_graph(md.graph, shape)
            out = md.graph.wrapper.run(q.reshape(-1, hq, d).contiguous(), paged)
            return out.view(-1, hq * d)
        if self._planned != (md.plan_id, shape):
            self._shape = shape
            self._plan(md, shape)
        wrapper = self._decode if self._use_decode_wrapper else self._prefill
        out = wrapper.run(q.reshape(-1, hq, d).contiguous(), paged)
        return out.view(-1, hq * d)


def build_kernels(dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES, head_dims: tuple[int, ...] = (128, 64),
                  *, verbose: bool = False) -> list[str]:
    """JIT-compile, in one parallel ninja run, the FlashInfer modules this backend uses.

    Per (dtype, head_dim): the decode module and the fa2 prefill module (every mask mode); plus the
    bit-packing module ``plan`` uses for a custom mask. Modules are listed head_dim first, so a run
    cut short has finished the first head_dim's. Returns the module names. Parallelism follows
    ``MAX_JOBS``; the target follows ``FLASHINFER_CUDA_ARCH_LIST`` (e.g. "9.0a").
    """
    import_flashinfer()  # the clear error first
    from flashinfer.jit import build_jit_specs, gen_batch_decode_module, gen_batch_prefill_module
    from flashinfer.jit.quantization import gen_quantization_module

    specs = [gen_quantization_module()]
    for d, dtype in itertools.product(head_dims, dtypes):
        # (dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo, pos_encoding NONE, no
        # sliding window, no logits soft cap): what the wrappers' plan asks for with our arguments
        args = (dtype, dtype, dtype, torch.int32, d, d, 0, False, False)
        specs.append(gen_batch_decode_module(*args))
        specs.append(gen_batch_prefill_module("fa2", *args, False))
    build_jit_specs(specs, verbose=verbose)
    return [spec.name for spec in specs]
