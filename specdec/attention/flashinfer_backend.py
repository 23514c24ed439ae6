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

Planning: ``init_forward_metadata`` builds the int32 index arrays and calls the wrapper's ``plan``
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

import torch

from specdec.attention.base import AttentionBackend, AttentionLayer
from specdec.attention.layout import RaggedLayout, build_ragged_layout
from specdec.forward import ForwardBatch

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
    # FlashInfer's plan reads lengths on the host, so a forward cannot be planned inside a CUDA graph
    supports_cuda_graph = False

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

    def _ensure_wrappers(self, device: torch.device) -> None:
        check_device(device)
        if self._device == device:
            return
        # NOTE: one float workspace shared by both wrappers: a forward plans and runs only one of them
        workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device)
        self._decode = self._fi.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=self.use_tensor_cores, backend="fa2")
        self._prefill = self._fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        self._device, self._planned = device, None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if getattr(batch, "static_max_seq_len", None) is not None:
            raise NotImplementedError("flashinfer backend: FlashInfer plans on the host, so it cannot plan inside "
                                      "a CUDA graph; run it with --disable-cuda-graph")
        self._ensure_wrappers(batch.input_ids.device)
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
        if self._planned != (md.plan_id, shape):
            self._shape = shape
            self._plan(md, shape)
        paged = (k_buf.unsqueeze(1), v_buf.unsqueeze(1))  # [num_slots, page_size 1, hkv, d] each
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
