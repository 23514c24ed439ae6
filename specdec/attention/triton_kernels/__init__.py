"""Triton attention kernels over the paged KV cache (GQA, fp32 accumulation).

* ``decode.py`` — one query row per sequence, split-KV (flash-decoding) over the sequence's slots.
* ``verify_rows.py`` — a verify tree's nodes as decode steps (``decode_attention_rows``): the decode
  kernel's arithmetic over each node's own KV list, a request's nodes sharing its prefix tiles.
* ``draft_decode.py`` — one draft step: a request's branches together over its shared prefix
  (read from the request-to-token table), then each branch's own ancestors.
* ``extend.py`` — several query rows per sequence: an unmasked prefix, then the new-token block
  causal or under an explicit mask (TARGET_VERIFY trees), optionally split over the prefix.
* ``row_attention.py`` — deterministic inference: each query row over its own KV list, in splits of a
  fixed number of positions merged in a fixed order (the result depends on the list alone).
* ``merge.py`` — combines split-KV partial outputs by their log-sum-exp (and allocates them); shared
  by the three.
* ``store_kv.py`` — writes a layer's new K and V rows into their cache slots in one kernel.

The decode and extend kernels read KV through an explicit per-sequence slot list (``kv_indptr`` /
``kv_indices`` of a ``RaggedLayout``), the draft-step kernel through the request-to-token table;
both are per token, so any page size works. Every attention kernel takes a layer's sliding
``window`` (None: a global layer) and skips the entries no query's window reaches (each module's
docstring says how). This package imports nothing else of specdec except ``specdec.kernels`` (input checks).
"""

from specdec.attention.triton_kernels.decode import decode_attention, decode_attention_ref
from specdec.attention.triton_kernels.draft_decode import draft_decode_attention, draft_decode_attention_ref
from specdec.attention.triton_kernels.extend import extend_attention, extend_attention_ref
from specdec.attention.triton_kernels.merge import (
    merge_partials,
    merge_partials_ref,
    plan_num_splits,
    triton_can_run_on,
)
from specdec.attention.triton_kernels.row_attention import row_attention, row_attention_ref
from specdec.attention.triton_kernels.store_kv import store_kv, store_kv_ref
from specdec.attention.triton_kernels.verify_rows import decode_attention_rows, decode_attention_rows_ref

__all__ = [
    "decode_attention",
    "decode_attention_ref",
    "decode_attention_rows",
    "decode_attention_rows_ref",
    "draft_decode_attention",
    "draft_decode_attention_ref",
    "extend_attention",
    "extend_attention_ref",
    "merge_partials",
    "merge_partials_ref",
    "plan_num_splits",
    "row_attention",
    "row_attention_ref",
    "store_kv",
    "store_kv_ref",
    "triton_can_run_on",
]
