"""``residual_draw_ref``: the bonus draw of tree speculative sampling, in integer fixed point.

Both implementations use this definition: the torch reference op
(``specdec.kernels.verify``) and the Triton kernels (``specdec.kernels.triton.verify``).

Glossary: q = target probs at the request's last accepted node; p = draft_probs at that node
(the rejected children's target probs, written by the walk), or 0 after a full path; coin = the
request's ``uniform_samples_for_final_sampling``; V = vocab.

Why integers: the reference and the kernel must pick the same token (tests use ``torch.equal``),
and float prefix sums depend on the summation order (``torch.cumsum`` accumulates in fp64 on CPU
and as a parallel scan on CUDA; a GPU block scan has a tree order of its own). Integer addition
is associative, so every order (the sequential cumsum here, the kernel's per-block ``tl.sum``
over a vocab split across many programs, then ``tl.cumsum``) gives the same sums bit for bit.

Definition, per request (every step is exact; fp32 only in d = q - p):

    w[j]  = floor(min(d[j], 1) * 2**40) if d[j] > 0 else 0,  d = q - p in fp32     int64 weights
    if sum(w) == 0: w = the same with d = q           (fallback: draw from the target itself)
    T     = sum(w);  if T == 0 the token is V - 1     (q quantizes to all zeros too)
    u24   = clamp(floor(coin * 2**24), 0, 2**24 - 1)  (the coin as a 24-bit integer, < 1)
    t     = floor(u24 * T / 2**24)                    (so 0 <= t < T)
    token = the first j with w[0] + ... + w[j] > t    (then w[token] > 0)

This is inverse-CDF sampling from w / T in vocab order. Error bounds, for the fp32 residual
r = relu(q - p) <= 1 with mass R = sum(r): each w[j] / 2**40 lies in (r[j] - 2**-40, r[j]], so the
total variation distance between w / T and r / R is at most V * 2**-40 / R (1.2e-7 / R at
V = 128256; tokens with r[j] < 2**-40 ~ 9.1e-13 are never drawn). A coin uniform on the 2**24-point
grid (like ``torch.rand``'s fp32 output) picks token j with probability within 2**-24 of w[j] / T.
Overflow: w[j] <= 2**40, so T < 2**63 for any V < 2**23, whatever the inputs (NaN counts as 0).
"""

from __future__ import annotations

import torch

FIXED_POINT_BITS = 40  # NOTE: part of the definition (w's resolution), not a tuning knob
COIN_BITS = 24  # the coin's resolution (an fp32 in [0.5, 1) has 24 significant bits)


def residual_weights(d: torch.Tensor) -> torch.Tensor:
    """[..., V] fp32 -> int64 weights floor(min(d, 1) * 2**40) where d > 0, else 0 (NaN -> 0)."""
    scaled = (d.clamp(max=1.0) * float(2**FIXED_POINT_BITS)).to(torch.int64)  # exact, then truncated
    return torch.where(d > 0, scaled, 0)


def coin_threshold(coin: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """t = floor(u24 * total / 2**24) with u24 = the coin on the 2**24 grid, clamped below 1.

    NOTE: u24 * total can pass 2**63 (total reaches 2**40 at R = 1), so total is split at bit
    24: t = (total >> 24) * u24 + ((total mod 2**24) * u24 >> 24), exact, and each term is at most
    t < total, so nothing overflows (the Triton kernel computes it the same way).
    """
    one = 2**COIN_BITS
    u24 = (coin.double() * one).floor().clamp(0, one - 1).to(torch.int64)
    return (total >> COIN_BITS) * u24 + (((total & (one - 1)) * u24) >> COIN_BITS)


def residual_draw_ref(
    q: torch.Tensor,  # [bs, V] fp32 target probs at each request's last accepted node
    p: torch.Tensor,  # [bs, V] fp32 draft_probs there (zeros after a full path)
    coins: torch.Tensor,  # [bs] fp32 uniform_samples_for_final_sampling
) -> torch.Tensor:  # [bs] int64 bonus tokens
    """Specification of the bonus draw (see the module docstring). Worked example, V = 4::

        q = [.1 .5 .3 .1]  p = [0 .5 .3 0]  ->  w = [.1  0  0 .1] * 2**40 (floored), T = .2 * 2**40
        coin .75 -> t = .15 * 2**40; prefix sums [.1 .1 .1 .2] * 2**40 -> first above t: token 3
        p = q (nothing left): w = 0 -> fallback to q: prefix [.1 .6 .9 1] * 2**40 -> token 2
    """
    vocab = q.shape[-1]
    w = residual_weights(q - p)
    empty = w.sum(-1) == 0
    w = torch.where(empty[:, None], residual_weights(q), w)  # the all-zero-residual fallback
    total = w.sum(-1)  # [bs]
    threshold = coin_threshold(coins, total)  # [bs], < total where total > 0
    prefix = w.cumsum(-1)  # [bs, V] int64: exact in any summation order
    token = torch.searchsorted(prefix, threshold[:, None], right=True)[:, 0]  # first prefix > t
    return torch.where(total > 0, token, vocab - 1)
