"""The synthetic benchmark's common random numbers: a uniform per (seed, batch row, position).

A fixed integer hash, shared bit for bit by ``simulate_target_predict``'s reference (below) and its
Triton kernel (the constants).
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
# the integer hash of ``position_uniforms`` ("lowbias32", C. Wellons' hash prospector): keys, rounds
HASH_POSITION, HASH_ROW, HASH_SEED = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
HASH_ROUNDS = ((16, 0x7FEB352D), (15, 0x846CA68B))


def seed_term(seed: int) -> int:
    """The seed's share of every node's hash key (a 32-bit integer)."""
    return (seed & _MASK32) * HASH_SEED & _MASK32


def hash_key(positions: torch.Tensor, seed: int) -> torch.Tensor:  # [bs, ...] int64 -> same shape int64
    """Every (seed, batch row, absolute position)'s key, before masking: odd multipliers, so one
    row's positions key apart. NOTE: products may wrap past int64; the low bits, all any user
    keeps, are still exact."""
    rows = torch.arange(positions.shape[0], device=positions.device).view(-1, *[1] * (positions.dim() - 1))
    return positions.long() * HASH_POSITION + rows * HASH_ROW + seed_term(seed)


def position_uniforms(positions: torch.Tensor, seed: int) -> torch.Tensor:  # [bs, N] int64 -> [bs, N] fp32
    """A uniform in [0, 1) per (seed, batch row, absolute position): a fixed integer hash (two
    multiply-xorshift rounds on 32 bits of ``hash_key``), so a row's draw at a position never
    depends on the shape."""
    x = hash_key(positions, seed) & _MASK32
    for shift, mult in HASH_ROUNDS:
        x = ((x ^ (x >> shift)) * mult) & _MASK32
    x = x ^ (x >> 16)
    return (x >> 8).float() / float(1 << 24)
