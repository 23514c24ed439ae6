"""KVCache: per-layer K and V buffers indexed by KV slot.

Slot ``s`` holds the K/V of one token; which request and position it belongs to is recorded in
the host's request-to-token table. Target and draft keep separate KVCache objects that share the
slot numbering (the draft's may have extra scratch slots past the host's capacity).
"""

from __future__ import annotations

import torch

from specdec.attention.kv_dtype import cast_kv
from specdec.kernels import move_kv_slots


class KVCache:
    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        # [num_layers, num_slots, num_kv_heads, head_dim]: one allocation, so ``move`` is one
        # launch for all layers
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # [num_slots, num_kv_heads, head_dim] per layer (views of the above)
        # NOTE: indexing, not unbind: in-place writes to unbind's views are refused under autograd
        self.k_buffers = [self.k[i] for i in range(num_layers)]
        self.v_buffers = [self.v[i] for i in range(num_layers)]
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype

    @property
    def num_layers(self) -> int:
        return len(self.k_buffers)

    @property
    def device(self) -> torch.device:
        return self.k.device

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in (self.k, self.v))

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def set_kv(
        self,
        layer_id: int,
        loc: torch.Tensor,  # [n]
        k: torch.Tensor,  # [n, num_kv_heads, head_dim]
        v: torch.Tensor,  # [n, num_kv_heads, head_dim]
    ) -> None:
        # NOTE: the cache stores values, never autograd history (training has its own backend)
        with torch.no_grad():
            self.k_buffers[layer_id][loc] = cast_kv(k, self.dtype)
            self.v_buffers[layer_id][loc] = cast_kv(v, self.dtype)

    def move(self, src_locs: torch.Tensor, dst_locs: torch.Tensor) -> None:
        """Copy every layer's K/V from ``src_locs`` to ``dst_locs`` ([groups, width] int64 each).

        NOTE: within a group all sources are read before any destination is written, so a group
        may move slots onto each other (a request compacting its accepted tree nodes towards the
        prefix); groups touch disjoint slots. One launch for all layers (``move_kv_slots``).
        """
        move_kv_slots(self.k, self.v, src_locs, dst_locs)
