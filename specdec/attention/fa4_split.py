"""Split-KV for FlashAttention-4 through its varlen interface (FA4's own split-KV refuses SM90).

A paged call whose sequences all have ``q_len`` query rows, and which is not causal or has one row
per sequence, is cut into key chunks: chunk c of sequence s becomes sequence ``s * n + c`` with the
same query rows, page-table columns [c * chunk, (c + 1) * chunk) and ``clamp(len_s - c * chunk, 0,
chunk)`` keys. Every chunk attends without a mask; the chunks' outputs are merged by their
log-sum-exp (``combine_splits``). A chunk past a sequence's end has no key: its CTA exits at once
and its LSE is -inf, so plans sized for a static bound (CUDA graphs) cost little past the real length.

Worked example: key lengths [300, 40], table width 384, 3 splits of 128 columns:
    sequence   0: cols 0-127   1: 128-255   2: 256-383   3: 0-127   4: 128-255   5: 256-383
    seqused_k  128             128          44           40         0            0
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from specdec.attention.flashattention_backend import PagedCall

TILE_N = 128  # FA4's key tile on SM90 for head_dim <= 128 (chunks are whole tiles)
# query heads per KV head assumed when planning before the layer is known (Llama-3: 32 / 8)
GROUP_ESTIMATE = 4


def plan_num_splits(num_seqs: int, q_len: int, max_kv_len: int, *, num_kv_heads: int, num_sms: int,
                    waves: float = 2.0, tile_m: int = 128) -> int:
    """Key chunks per sequence: enough CTAs for ``waves`` per SM, at least one key tile per chunk.

    The grid has one CTA per (sequence, KV head, M tile of ``q_len * group`` packed query rows) and
    chunk. Example (H100, 132 SMs): decode of 32 requests, 8 KV heads, 1024 keys -> 256 CTAs
    unsplit; 2 waves want 264 -> 2 chunks of 512 keys.
    """
    m_blocks = max(num_seqs, 1) * num_kv_heads * math.ceil(max(q_len, 1) * GROUP_ESTIMATE / tile_m)
    n_blocks = math.ceil(max_kv_len / TILE_N)
    if n_blocks <= 1:
        return 1
    return max(1, min(n_blocks, math.ceil(waves * num_sms / m_blocks), 128))


@dataclasses.dataclass(frozen=True)
class SplitCall:
    # one sequence per (sequence, chunk), not causal
    part: PagedCall
    num_seqs: int
    num_splits: int
    q_len: int


def split_keys(part: PagedCall, num_splits: int) -> SplitCall:
    """``part`` cut into key chunks of whole tiles (the module's example). Device ops only."""
    num_seqs, width = part.page_table.shape
    q_len = part.max_seqlen_q
    chunk = math.ceil(math.ceil(width / num_splits) / TILE_N) * TILE_N
    n = math.ceil(width / chunk)
    device = part.page_table.device
    table = F.pad(part.page_table, (0, n * chunk - width)).view(num_seqs * n, chunk)  # [num_seqs * n, chunk]
    start = torch.arange(n, device=device, dtype=torch.int32) * chunk  # [n]
    used = (part.cache_seqlens[:, None] - start[None]).clamp(0, chunk).view(-1).to(torch.int32)  # [num_seqs * n]
    cu = torch.arange(num_seqs * n + 1, device=device, dtype=torch.int32) * q_len
    call = PagedCall(cu_seqlens_q=cu, max_seqlen_q=q_len, cache_seqlens=used, page_table=table, causal=False)
    return SplitCall(part=call, num_seqs=num_seqs, num_splits=n, q_len=q_len)


def repeat_queries(q: torch.Tensor, split: SplitCall) -> torch.Tensor:  # [num_seqs * n * q_len, h, d]
    """The query rows of each sequence once per chunk, in ``split_keys``' sequence order."""
    h, d = q.shape[1:]
    rows = q.view(split.num_seqs, 1, split.q_len, h, d)
    return rows.expand(-1, split.num_splits, -1, -1, -1).reshape(-1, h, d)


def combine_splits(
    out: torch.Tensor,  # [num_seqs * n * q_len, h, d] the chunks' outputs
    lse: torch.Tensor,  # [h, num_seqs * n * q_len] natural log, -inf for a chunk without keys
    split: SplitCall,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([num_seqs * q_len, h, d] in out's dtype, [num_seqs * q_len, h] fp32)
    """Attention over all chunks from each chunk's attention (rows without any key: 0 and -inf)."""
    s, n, q_len = split.num_seqs, split.num_splits, split.q_len
    h, d = out.shape[1:]
    parts = lse.float().transpose(0, 1).reshape(s, n, q_len, h)
    parts = torch.where(torch.isfinite(parts), parts, float("-inf"))
    peak = parts.amax(dim=1, keepdim=True)  # [s, 1, q_len, h]
    peak = torch.where(torch.isfinite(peak), peak, 0.0)
    weight = torch.exp(parts - peak)  # [s, n, q_len, h]
    total = weight.sum(dim=1)  # [s, q_len, h]
    safe = torch.where(total > 0, total, 1.0)
    # NOTE: a chunk without keys may hold garbage; its weight is 0, so mask it rather than multiply
    vals = torch.where((weight > 0)[..., None], out.float().view(s, n, q_len, h, d), 0.0)
    merged = (weight[..., None] * vals).sum(dim=1) / safe[..., None]  # [s, q_len, h, d]
    merged_lse = torch.where(total > 0, peak[:, 0] + torch.log(safe), float("-inf"))
    return merged.view(s * q_len, h, d).to(out.dtype), merged_lse.view(s * q_len, h)
