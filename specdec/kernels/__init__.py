"""sgl_kernel-compatible ops: same names, signatures, dtypes and in-place writes as sgl_kernel.

Each op validates its inputs and runs its Triton kernel (``specdec.kernels.triton``) on CUDA
tensors, and on CPU tensors when TRITON_INTERPRET=1; else its torch reference ``<op>_ref`` (the
specification, any device). ``cache_ops`` holds the KV-slot bookkeeping ops of the EAGLE worker, ``commit``
what a verified step derives from its accepted paths,
``kv_indices`` the KV lists and page tables attention reads from the request rows, ``frontier``
the draft's selections (a step's next frontier, the tree's nodes), ``simulate`` the synthetic
benchmark's drawn target predictions, ``replay`` its replay of recorded draft trees and ``row_kv``
deterministic inference's per-row KV lists and ``ngram_match`` the n-gram drafter's device lookup (all
ours, not sgl_kernel's).
"""

from specdec.kernels.cache_ops import (
    assign_req_to_token,
    assign_req_to_token_ref,
    compact_accepted_kv_locs,
    compact_accepted_kv_locs_ref,
    draft_scratch_slots,
    draft_scratch_slots_ref,
    move_kv_slots,
    move_kv_slots_ref,
)
from specdec.kernels.commit import CommitOutputs, commit_step, commit_step_ref
from specdec.kernels.common import TreeMaskMode
from specdec.kernels.dispatch import TRITON_IMPLS
from specdec.kernels.frontier import select_draft_nodes, select_draft_nodes_ref, select_frontier, select_frontier_ref
from specdec.kernels.kv_indices import (
    create_kv_indices,
    create_kv_indices_ref,
    create_kv_layout,
    create_kv_layout_ref,
    create_kv_page_indices,
    create_kv_page_indices_ref,
)
from specdec.kernels.ngram_match import ngram_match, ngram_match_ref, ngram_merge_buffer
from specdec.kernels.packbits import segment_packbits, segment_packbits_ref
from specdec.kernels.replay import (
    replay_accept_cdf,
    replay_accept_cdf_ref,
    replay_advance,
    replay_advance_ref,
    replay_root,
    replay_root_ref,
    replay_rows,
    replay_rows_ref,
)
from specdec.kernels.row_kv import build_row_kv_lists, build_row_kv_lists_ref
from specdec.kernels.simulate import simulate_target_predict, simulate_target_predict_ref
from specdec.kernels.tree_build import (
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
    "CommitOutputs",
    "TreeMaskMode",
    "assign_req_to_token",
    "assign_req_to_token_ref",
    "commit_step",
    "commit_step_ref",
    "compact_accepted_kv_locs",
    "compact_accepted_kv_locs_ref",
    "create_kv_indices",
    "create_kv_indices_ref",
    "create_kv_layout",
    "create_kv_layout_ref",
    "create_kv_page_indices",
    "create_kv_page_indices_ref",
    "draft_scratch_slots",
    "draft_scratch_slots_ref",
    "move_kv_slots",
    "move_kv_slots_ref",
    "ngram_match",
    "ngram_match_ref",
    "ngram_merge_buffer",
    "build_row_kv_lists",
    "build_row_kv_lists_ref",
    "build_tree_kernel_efficient",
    "build_tree_kernel_efficient_ref",
    "reconstruct_indices_from_tree_mask",
    "reconstruct_indices_from_tree_mask_ref",
    "replay_accept_cdf",
    "replay_accept_cdf_ref",
    "replay_advance",
    "replay_advance_ref",
    "replay_root",
    "replay_root_ref",
    "replay_rows",
    "replay_rows_ref",
    "segment_packbits",
    "segment_packbits_ref",
    "select_draft_nodes",
    "select_draft_nodes_ref",
    "select_frontier",
    "select_frontier_ref",
    "simulate_target_predict",
    "simulate_target_predict_ref",
    "tree_speculative_sampling_target_only",
    "tree_speculative_sampling_target_only_ref",
    "verify_tree_greedy",
    "verify_tree_greedy_ref",
]
