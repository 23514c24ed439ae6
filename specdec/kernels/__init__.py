"""sgl_kernel-compatible ops: same names, signatures, dtypes and in-place writes as sgl_kernel.

Each op validates its inputs and runs a Triton kernel on CUDA tensors when one is registered in
``TRITON_IMPLS``, else its torch reference ``<op>_ref`` (the specification, any device).
"""

from specdec.kernels.packbits import segment_packbits, segment_packbits_ref
from specdec.kernels.tree_build import (
    TRITON_IMPLS,
    TreeMaskMode,
    build_tree_kernel_efficient,
    build_tree_kernel_efficient_ref,
    reconstruct_indices_from_tree_mask,
    reconstruct_indices_from_tree_mask_ref,
)
from specdec.kernels.verify import (
    tree_speculative_sampling_target_only,
    tree_speculative_sampling_target_only_ref,
    verify_tree_greedy,
    verify_tree_greedy_ref,
)

__all__ = [
    "TRITON_IMPLS",
    "TreeMaskMode",
    "build_tree_kernel_efficient",
    "build_tree_kernel_efficient_ref",
    "reconstruct_indices_from_tree_mask",
    "reconstruct_indices_from_tree_mask_ref",
    "segment_packbits",
    "segment_packbits_ref",
    "tree_speculative_sampling_target_only",
    "tree_speculative_sampling_target_only_ref",
    "verify_tree_greedy",
    "verify_tree_greedy_ref",
]
