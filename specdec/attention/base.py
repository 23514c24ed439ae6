"""AttentionBackend: the interface every attention implementation follows.

A model calls ``batch.attn_backend.forward(q, k, v, layer, batch)`` in each attention layer. The
backend writes the new K/V into ``batch.kv_cache`` at ``batch.out_cache_loc`` and returns the
attention output. All planning (index building, host-side lengths) happens once per forward in
``init_forward_metadata``; ``forward`` only reads ``batch.attn_metadata``.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import NamedTuple

import torch

from specdec.forward import ForwardBatch, ForwardMode


@dataclasses.dataclass(frozen=True)
class AttentionLayer:
    """Static shape of one attention layer."""

    layer_id: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    # keys a query sees, itself included (HF: key position > query position - window); None: all.
    # Only backends with ``supports_sliding_window`` honour it (the engine checks before building).
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window={self.sliding_window} must be >= 1 or None")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )


@dataclasses.dataclass(frozen=True)
class StaticPlan:
    """A static (CUDA-graph) forward as a host-planned backend plans it before each replay.

    The forward's sequences each have ``q_len`` query rows and ``own`` KV entries past their
    prefix (their new tokens, or a draft branch's ancestors); padding sequences have prefix 0.
    """

    forward_mode: ForwardMode
    prefix_lens: list[int]  # [num_seqs] host lengths, padding included
    q_len: int
    own: int
    max_seq_len: int  # the graph's static bound (``ForwardBatch.static_max_seq_len``)
    device: torch.device
    # TARGET_VERIFY: [num_seqs * q_len * q_len] bool tree blocks on the device (padding: True)
    tree_mask: torch.Tensor | None = None

    @property
    def key(self) -> tuple[ForwardMode, int, int, int]:
        return static_plan_key(self.forward_mode, len(self.prefix_lens), self.q_len, self.own)


def static_plan_key(mode: ForwardMode, num_seqs: int, q_len: int, own: int) -> tuple[ForwardMode, int, int, int]:
    """What tells one static forward of a backend from another (one plan each)."""
    return mode, num_seqs, q_len, own


class ChunkRule(NamedTuple):
    """Where a chunked prefill cuts a prompt (``AttentionBackend.prefill_chunk_rule``): at multiples of
    ``align`` positions, leaving a chunk and a rest of at least ``least`` tokens each."""

    align: int = 1
    least: int = 1


class AttentionBackend(abc.ABC):
    name: str = "abstract"
    # whether static forwards (batches that carry ``static_max_seq_len``) can be captured as CUDA
    # graphs (else the engine runs eagerly)
    supports_cuda_graph: bool = False
    # whether such forwards plan on the host, from host lengths, before each replay: the graph
    # runners then call ``plan_static`` first and replay only when they have the host's lengths.
    # Otherwise ``init_forward_metadata`` plans them from device tensors alone, inside the graph.
    plans_on_host: bool = False
    # whether ``AttentionLayer.sliding_window`` is honoured (Mistral, Gemma 3 local layers)
    supports_sliding_window: bool = False
    # whether the KV cache may hold FP8 values (``specdec.attention.kv_dtype``)
    supports_fp8_kv_cache: bool = False
    # whether a prefill of one new token a request plans otherwise than a decode step of the same batch
    # (a row's bits then its own request's alone): it replays prefill graphs of its own, not the decode
    # graphs (``ModelRunner``)
    prefill_apart_from_decode: bool = False

    def prefill_chunk_rule(self, device: torch.device) -> ChunkRule:
        """Where a chunked prefill cuts a prompt, where it can: a prompt prefilled in chunks so cut takes the
        bits of the same prompt prefilled whole (the default: no such promise, cut anywhere)."""
        return ChunkRule()

    def plan_static(self, plan: StaticPlan) -> None:
        """Plan a static forward before its graph is captured or replayed (host-planned backends)."""
        raise NotImplementedError(f"{self.name} backend plans static forwards inside the graph")

    @abc.abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Plan the forward: set ``batch.attn_metadata`` from the batch's attention layout."""

    @abc.abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads * head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads * head_dim]
        layer: AttentionLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
        """Store k/v at ``batch.out_cache_loc`` in layer ``layer.layer_id``, then attend."""
