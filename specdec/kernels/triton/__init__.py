"""Triton implementations of ``specdec.kernels`` ops, bit-exact with their ``*_ref`` specifications.

Importing this package does not import triton; ``load_impls`` does, and ``specdec.kernels``'
``select_impl`` calls it the first time an op runs on CUDA (or on CPU under TRITON_INTERPRET=1).
Each implementation has its reference's signature and is registered as a ``torch.library`` custom
op (``torch.ops.specdec.*``, with a fake impl) that torch.compile traces; eager calls, CUDA-graph
capture included, launch the kernel directly (the dispatcher costs tens of microseconds a call).
Malformed input is reported through an error-flag tensor:

  CPU     the implementation reads the flag after the kernel and raises ValueError like the ref;
  CUDA    no host sync: the flag is left on the device. Malformed input still cannot hang or read
          out of bounds (every walk is bounded by N, every index clamped or masked), but the outputs
          are meaningless. Callers that want the flag call the Triton function directly with
          ``error_flag=`` (a [bs] int32 tensor, 0 = fine) and check it outside the captured region.
"""

from __future__ import annotations

from typing import Callable


def load_impls() -> dict[str, Callable[..., None]]:
    """Import triton and the kernels; returns op name -> implementation. Raises ImportError."""
    from specdec.kernels.triton import (cache_ops, commit, frontier, ngram_match, packbits, replay, row_kv, simulate,
                                        tree_build, verify)

    return {**tree_build.IMPLS, **verify.IMPLS, **packbits.IMPLS, **cache_ops.IMPLS, **commit.IMPLS, **simulate.IMPLS,
            **frontier.IMPLS, **replay.IMPLS, **row_kv.IMPLS, **ngram_match.IMPLS}
