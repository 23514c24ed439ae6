"""AttentionBackend: the interface every attention implementation follows.

A model calls ``batch.attn_backend.forward(q, k, v, layer, batch)`` in each attention layer. The
backend writes the new K/V into ``batch.kv_cache`` at ``batch.out_cache_loc`` and returns the
attention output. All planning (index building, host-side lengths) happens once per forward in
``init_forward_metadata``; ``forward`` only reads ``batch.attn_metadata``.
"""

from __future__ import annotations

import abc
import dataclasses

import torch

from specdec.forward import ForwardBatch


@dataclasses.dataclass(frozen=True)
class AttentionLayer:
    """Static shape of one attention layer."""

    layer_id: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )


class AttentionBackend(abc.ABC):
    name: str = "abstract"
    # whether ``init_forward_metadata`` plans batches that carry ``static_max_seq_len`` from device
    # tensors alone, so a forward can be captured as a CUDA graph (else the engine runs eagerly)
    supports_cuda_graph: bool = False

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
