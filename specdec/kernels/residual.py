"""``residual_draw_ref``: the bonus draw of tree speculative sampling, with a fixed fp32 summation order.

The torch reference (``specdec.kernels.verify``) and the Triton kernel both implement this order.

The draw fixes its float summation order so that the Triton kernel and this specification pick the
same token on every device:

    residual r = relu(q - p) over V tokens, split into LANES = 128 contiguous segments of
    C = ceil(V / 128) tokens (lane l owns [l*C, (l+1)*C)). In fp32, left to right:
      I[l, c] = r[l*C] + ... + r[l*C + c]            (sequential within the lane)
      O[l]    = I[0, C-1] + ... + I[l-1, C-1]         (sequential over lanes; O[0] = 0)
      P[j]    = O[l] + I[l, c]    for j = l*C + c     (one rounding)
      total   = O[127] + I[127, C-1]
    token = the first j with r[j] > 0 and P[j] > coin * total; V - 1 if none.
For V <= 128 this is plain sequential fp32 accumulation. It is inverse-CDF sampling from r in
vocab order, so the draw is exact in distribution whatever the rounding; fixing the order only
makes Triton, the reference and every device agree token for token.

NOTE: ``torch.cumsum`` is not such an order: on CPU it accumulates in fp64, on CUDA it is a parallel
scan, so at vocab sizes of real models it picks a neighbouring token a few times in a hundred.
"""

from __future__ import annotations

import numpy as np
import torch

LANES = 128  # NOTE: part of the definition, not a tuning knob


def residual_draw_ref(residual: torch.Tensor, coin: float) -> int:
    """Specification of the bonus draw from a [V] fp32 residual (see the module docstring).

    Worked example, V = 4 (one lane per token, so plain sequential sums)::

        r = [.1, 0, 0, .1]   P = [.1, .1, .1, .2]   coin .75 -> threshold .15 -> token 3
    """
    r = residual.detach().cpu().numpy().astype(np.float32, copy=False)
    vocab = r.shape[0]
    c = max(1, -(-vocab // LANES))
    seg = np.zeros(LANES * c, dtype=np.float32)
    seg[:vocab] = r
    inner = np.cumsum(seg.reshape(LANES, c), axis=1, dtype=np.float32)  # np.cumsum is sequential
    outer = np.cumsum(inner[:, -1], dtype=np.float32)
    offsets = np.concatenate([np.zeros(1, dtype=np.float32), outer[:-1]])
    prefix = (offsets[:, None] + inner).reshape(-1)[:vocab]
    threshold = np.float32(np.float32(coin) * outer[-1])
    hit = np.flatnonzero((r > 0) & (prefix > threshold))
    return int(hit[0]) if hit.size else vocab - 1
