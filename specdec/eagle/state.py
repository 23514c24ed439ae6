"""DraftState: what the worker keeps between decode steps, one row per request-pool row.

After a request's latest draft extend, its row holds the root expansion of the next draft tree:
the draft head's top-K children of the last committed token, and the draft hidden state that
feeds the first draft step. Indexing by request-pool row means batches can change composition
every step with nothing to filter or merge.
"""

from __future__ import annotations

import torch


class DraftState:
    def __init__(self, *, max_reqs: int, topk: int, hidden_size: int, dtype: torch.dtype, device) -> None:
        # [max_reqs, topk] probabilities and target-vocab ids of the root's children
        self.topk_p = torch.zeros(max_reqs, topk, dtype=torch.float32, device=device)
        self.topk_index = torch.zeros(max_reqs, topk, dtype=torch.int64, device=device)
        # [max_reqs, hidden] draft hidden state of the last committed token
        self.hidden = torch.zeros(max_reqs, hidden_size, dtype=dtype, device=device)

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
