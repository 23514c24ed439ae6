"""The tree mask of TARGET_VERIFY as a FlashAttention-4 ``mask_mod``, and its torch reference.

FA4 calls ``mask_mod(batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors)`` for the
score tiles it masks (inside the kernel, CuTe DSL); indices are within the sequence, and
``seqlen_info`` carries the sequence's ``seqlen_q`` (N tree rows) and ``seqlen_k`` (prefix + N).
Rule: a key before the tree (column < seqlen_k - seqlen_q) is visible; tree column j is visible to
row i iff ``tree[batch_idx, i, j]`` (aux tensor 0, int32 [num_seqs, N, N]).

Worked example, prefix 2 and tree 0 -> {1, 2} (seqlen_q 3, seqlen_k 5):
    kv_idx:      0  1  2  3  4
    q_idx 0:     1  1  1  0  0
    q_idx 1:     1  1  1  1  0
    q_idx 2:     1  1  1  0  1

``tree_mask_mod_ref`` is the same rule over torch tensors: the CPU model of the kernel calls it
where the real kernel would call the CuTe function.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch


def tree_mask_mod_ref(
    batch_idx: torch.Tensor,  # [...] int64 sequence of each score
    q_idx: torch.Tensor,  # [...] row within the sequence
    kv_idx: torch.Tensor,  # [...] key within the sequence
    seqlen_q: torch.Tensor,  # [...]
    seqlen_k: torch.Tensor,  # [...]
    tree: torch.Tensor,  # [num_seqs, N, N] int32
) -> torch.Tensor:  # [...] bool, True = visible
    col = kv_idx - (seqlen_k - seqlen_q)
    n = tree.shape[1]
    seen = tree[batch_idx, q_idx.clamp(0, n - 1), col.clamp(0, n - 1)] != 0
    return (col < 0) | seen


@functools.cache
def tree_mask_mod() -> Callable[..., object]:
    """The CuTe DSL function (built once: FA4 keys its compile cache on the callable)."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    @cute.jit
    def specdec_tree_mask_mod(batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        tree = aux_tensors[0]
        col = kv_idx[0] - (seqlen_info.seqlen_k - seqlen_info.seqlen_q)
        seen = cutlass.Int32(1)
        if col >= 0:
            seen = cutlass.Int32(tree[batch_idx[0], q_idx[0], col])
        return utils.scalar_to_ssa(seen, cutlass.Int32) != utils.scalar_to_ssa(cutlass.Int32(0), cutlass.Int32)

    return specdec_tree_mask_mod
