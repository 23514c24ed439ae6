"""The draft head's memory: ``DraftState``, what the worker keeps between decode steps (one row per
request-pool row), and ``DraftResources``, that state with the head's KV cache.

After a request's latest draft extend, its row holds the root expansion of the next draft tree:
the draft head's top-K children of the last committed token, and the draft hidden state that
feeds the first draft step. Indexing by request-pool row means batches can change composition
every step with nothing to filter or merge.
"""

from __future__ import annotations

import dataclasses

import torch

from specdec.attention import KVCache
from specdec.attention.kv_dtype import resolve_kv_dtype
from specdec.host import KVMemory


class DraftState:
    def __init__(self, *, max_reqs: int, topk: int, hidden_size: int, dtype: torch.dtype, device) -> None:
        # one row per request-pool row, then ``pad_row``: the padding requests of a captured draft
        # extend store their (meaningless) root expansion there
        self.pad_row = max_reqs
        # [max_reqs + 1, topk] probabilities and target-vocab ids of the root's children
        self.topk_p = torch.zeros(max_reqs + 1, topk, dtype=torch.float32, device=device)
        self.topk_index = torch.zeros(max_reqs + 1, topk, dtype=torch.int64, device=device)
        # [max_reqs + 1, hidden] draft hidden state of the last committed token
        self.hidden = torch.zeros(max_reqs + 1, hidden_size, dtype=dtype, device=device)
        # [max_reqs + 1] benchmark only (a replayed trace): each request's verify steps so far, the key of
        # the trace row its next step replays (specdec.eagle.replay)
        self.replay_steps = torch.zeros(max_reqs + 1, dtype=torch.int64, device=device)

    def store(
        self,
        rows: torch.Tensor,  # [bs]
        topk_p: torch.Tensor,  # [bs, topk]
        topk_index: torch.Tensor,  # [bs, topk]
        hidden: torch.Tensor,  # [bs, hidden]
    ) -> None:
        self.topk_p[rows] = topk_p.float()
        self.topk_index[rows] = topk_index
        self.hidden[rows] = hidden.to(self.hidden.dtype)

    def load(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.topk_p[rows], self.topk_index[rows], self.hidden[rows]


@dataclasses.dataclass(frozen=True)
class DraftResources:
    """The draft head's memory, shared by every tree shape's worker of one engine (adaptive
    speculation): its KV cache — the host's slots, then a tree scratch area sized for the deepest
    and widest shape, then one padding slot, then (a standalone draft LM) one parking slot per
    request row and the pad row (``specdec.eagle.draft_inputs``) — and each request row's root
    expansion, kept at the widest topk (a narrower shape reads its first ``topk`` columns: top-k is
    sorted). A standalone draft's root expansion carries no hidden state (width 0)."""

    kv: KVCache
    state: DraftState
    pad_slot: int
    root_topk: int
    park_base: int | None = None  # parking slot of request row r: park_base + r (standalone drafts)

    @classmethod
    def build(cls, draft_model: torch.nn.Module, memory: KVMemory, *, max_running_requests: int,
              num_steps: int, topk: int, kv_cache_dtype: str = "auto") -> "DraftResources":
        """``kv_cache_dtype``: ``SpecConfig.draft_kv_cache_dtype`` ("auto": the head's dtype)."""
        dcfg, layout = draft_model.config, draft_model.kv_layout  # NOTE: this rank's KV heads
        weight = next(draft_model.parameters())
        scratch = max_running_requests * max(num_steps - 1, 0) * topk
        pad_slot = memory.capacity + scratch
        max_reqs = memory.req_to_token.shape[0]
        standalone = bool(getattr(draft_model, "standalone", False))
        parking = max_reqs + 1 if standalone else 0  # the rows and the pad row
        kv = KVCache(num_layers=layout.num_layers, num_slots=pad_slot + 1 + parking,
                     num_kv_heads=layout.num_kv_heads, head_dim=layout.head_dim, device=weight.device,
                     dtype=resolve_kv_dtype(kv_cache_dtype, weight.dtype, flag="--speculative-draft-kv-cache-dtype"))
        state = DraftState(max_reqs=max_reqs, topk=topk, hidden_size=0 if standalone else dcfg.hidden_size,
                           dtype=weight.dtype, device=weight.device)
        return cls(kv, state, pad_slot, topk, park_base=pad_slot + 1 if standalone else None)
