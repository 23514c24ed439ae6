"""One GEMM for several ``nn.Linear`` that read the same input (q/k/v; gate/up), without changing
the Parameters a checkpoint, ``state_dict``, ``named_parameters`` or an optimizer sees.

``StackedLinear`` makes the linears' weights (and biases) consecutive row blocks of one tensor, the
GEMM's weight; each Parameter's ``.data`` is a view of its block, so in-place edits (optimizer
steps, ``load_state_dict`` copies, ``p.normal_()``) edit the GEMM weight too. ``FusedGemmModule``
(the owner's base) re-fuses wherever Parameters may be replaced: after ``_apply`` (``.to()``,
``.half()``, ``to_empty()``) and after ``load_state_dict`` (``assign=True`` swaps in new Parameters).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specdec.models.ops.gemv import linear

__all__ = ["StackedLinear", "FusedGemmModule"]


class StackedLinear:
    """Several ``nn.Linear`` reading the same input, run as one GEMM::

        weight = [q_proj.weight; k_proj.weight; v_proj.weight]   [Hq*D + 2*Hkv*D, H]

    Not a module: it owns no parameters, only the fused tensor their ``.data`` are views of. When
    the Parameters are not (or no longer) its row blocks (replaced behind the owner's back, e.g. by
    ``copy.deepcopy``), or autograd must reach them, the forward concatenates them instead:
    slower, never stale.
    """

    def __init__(self, *linears: nn.Linear) -> None:
        self.linears = linears
        self.weight: torch.Tensor | None = None  # [sum(out_features), in_features]
        self.bias: torch.Tensor | None = None  # [sum(out_features)] or None
        self.fuse_()

    def _params(self, name: str) -> list[torch.Tensor] | None:
        params = [getattr(linear, name) for linear in self.linears]
        return None if params[0] is None else params

    def fuse_(self) -> None:
        with torch.no_grad():
            self.weight = _fuse_rows_(self._params("weight"), self.weight)
            self.bias = _fuse_rows_(self._params("bias"), self.bias)

    def _stacked(self, name: str) -> torch.Tensor | None:
        params, fused = self._params(name), getattr(self, name)
        if params is None:
            return None
        if (torch.is_grad_enabled() and params[0].requires_grad) or not _are_rows_of(params, fused):
            return torch.cat(params)
        return fused

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in_features] -> [T, sum(out_features)]
        return linear(x, self._stacked("weight"), self._stacked("bias"))


def _are_rows_of(params: list[torch.Tensor], fused: torch.Tensor | None) -> bool:
    """True when ``params`` are the consecutive row blocks of ``fused`` (same memory, in order).

    NOTE: comparing addresses is sound because ``fused`` is alive: no other allocation can sit there.
    """
    if fused is None:
        return False
    ptr = fused.data_ptr()
    for p in params:
        if p.data_ptr() != ptr or p.dtype != fused.dtype or not p.is_contiguous():
            return False
        ptr += p.numel() * p.element_size()
    return ptr == fused.data_ptr() + fused.numel() * fused.element_size()


def _fuse_rows_(params: list[torch.Tensor] | None, fused: torch.Tensor | None) -> torch.Tensor | None:
    """Make ``params`` row blocks of one tensor (unless they already are ``fused``'s); returns it."""
    if params is None:
        return None
    if _are_rows_of(params, fused):
        return fused
    fused = torch.cat([p.detach() for p in params])
    start = 0
    for p in params:
        p.data = fused[start : start + p.shape[0]]
        start += p.shape[0]
    return fused


class FusedGemmModule(nn.Module):
    """A module owning ``StackedLinear`` GEMMs (named in ``_stacked_names``): re-fuses them
    whenever its Parameters may have been replaced."""

    _stacked_names: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.register_load_state_dict_post_hook(_fuse_after_load)

    def fuse_weights_(self) -> None:
        for name in self._stacked_names:
            getattr(self, name).fuse_()

    def _apply(self, fn: Any, recurse: bool = True) -> "FusedGemmModule":
        super()._apply(fn, recurse)
        self.fuse_weights_()
        return self


def _fuse_after_load(module: FusedGemmModule, incompatible_keys: Any) -> None:
    # load_state_dict(assign=True) swaps in new Parameters; a copying load keeps the views intact.
    module.fuse_weights_()
