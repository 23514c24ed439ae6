"""What the engine sizes at start-up from its flags and the device: the model dtype, the CUDA-graph
batch sizes, the running batch's bound, and the KV cache's slots."""

from __future__ import annotations

import logging

import torch

from specdec.attention.kv_dtype import resolve_kv_dtype
from specdec.cuda_graph import default_batch_sizes

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_TOKENS = 32768


def parse_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """``--dtype``: auto is bf16 on a GPU, fp32 on CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
    if dtype not in table:
        raise ValueError(f"--dtype: unknown dtype {dtype!r}; choose one of {', '.join(table)}")
    return table[dtype]


def graph_batch_sizes(device, backend, cuda_graph_max_bs: int | None, cuda_graph_bs, disable_cuda_graph: bool,
                      max_running_requests: int) -> list[int]:
    """Batch sizes to capture: every size up to --cuda-graph-max-bs (default: every batch the
    engine may run) in SGLang's steps (``default_batch_sizes``); none off CUDA, with
    --disable-cuda-graph, or on a backend that cannot plan inside a graph (torch_native)."""
    if cuda_graph_max_bs is not None and cuda_graph_max_bs < 1:
        raise ValueError(f"--cuda-graph-max-bs={cuda_graph_max_bs}: expected >= 1")
    if disable_cuda_graph or not str(device).startswith("cuda") or not backend.supports_cuda_graph:
        return []
    if cuda_graph_bs is not None:
        return list(cuda_graph_bs)
    return default_batch_sizes(min(cuda_graph_max_bs or max_running_requests, max_running_requests))


def running_cap(graph_sizes: list[int], max_running_requests: int) -> int:
    """Requests decoded at once: --max-running-requests, but never past the largest CUDA graph.

    NOTE: a batch past it would run eagerly, several times slower a step than a replay (vLLM and
    SGLang run it so; here at 80 requests over graphs of up to 64, plain decoding ran 4-5x slower
    than vLLM's): the requests past it wait for a place instead."""
    if not graph_sizes or max(graph_sizes) >= max_running_requests:
        return max_running_requests
    logger.warning("--cuda-graph-max-bs %d < --max-running-requests %d: at most %d requests decode at once",
                   max(graph_sizes), max_running_requests, max(graph_sizes))
    return max(graph_sizes)


def default_kv_tokens(device, target_model, draft_model, graph_sizes: list[int], tree: int, most_needed: int,
                      draft_kv: str = "auto", prefill_graph_tokens: int = 0) -> int:
    """KV slots: a fixed default on CPU; on a GPU what fits in 85% of the free memory after
    the weights and an estimate of the CUDA graphs' memory, at most what the requests can use.
    ``draft_kv``: the draft's KV cache dtype flag (``--speculative-draft-kv-cache-dtype``);
    ``prefill_graph_tokens``: the largest prefill captured as piecewise graphs (0: none)."""
    if not str(device).startswith("cuda"):
        return DEFAULT_CPU_KV_TOKENS
    per_token = 0
    for model, kv_dtype in ((target_model, "auto"), (draft_model, draft_kv)):
        if model is not None:  # NOTE: kv_layout counts this rank's KV heads (tensor parallelism)
            kv, weight = model.kv_layout, next(model.parameters())
            elem = resolve_kv_dtype(kv_dtype, weight.dtype, flag="--speculative-draft-kv-cache-dtype").itemsize
            per_token += 2 * kv.num_layers * kv.num_kv_heads * kv.head_dim * elem
    c = target_model.config
    rows = max(graph_sizes, default=1) * tree
    graph_bytes = 2 * rows * (4 * c.vocab_size + 2 * (3 * c.intermediate_size + 8 * c.hidden_size)) + (256 << 20)
    # piecewise prefill graphs: one layer's activations at the largest count, every count's outputs
    graph_bytes += 2 * prefill_graph_tokens * (3 * c.intermediate_size + 20 * c.hidden_size)
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    fits = int((0.85 * free - graph_bytes) // per_token)
    if fits < 1:
        raise ValueError("not enough GPU memory for a KV cache; lower --cuda-graph-max-bs or give --max-total-tokens")
    return min(fits, most_needed)
