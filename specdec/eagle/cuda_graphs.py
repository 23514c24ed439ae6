"""The draft head's two CUDA graphs, on the generic ``specdec.cuda_graph.CudaGraphRunner``.

* ``EAGLEDraftCudaGraphRunner``: the whole multi-step draft of a decode step (S - 1 draft
  forwards, top-k selection, ancestor-slot bookkeeping, ``organize_draft_results``) as one graph.
* ``EAGLEDraftExtendCudaGraphRunner``: the draft extend after verification, over S + 1 tokens per
  request: the committed ones, then padding whose K/V goes to the draft's padding slot.

Padding requests have prefix 0 and write only the padding slot or scratch slots of rows past
the real batch (the scratch area is sized for the largest captured batch).
"""

from __future__ import annotations

import torch

from specdec.cuda_graph import CudaGraphRunner, StaticInput
from specdec.eagle.draft import DraftRunner


class EAGLEDraftCudaGraphRunner:
    def __init__(
        self,
        draft: DraftRunner,
        *,
        batch_sizes: list[int],
        hidden_size: int,
        hidden_dtype: torch.dtype,
        max_seq_len: int,
        device: torch.device,
        use_graphs: bool = True,
        pool=None,
    ) -> None:
        k = draft.topk

        def expand(root_topk_p, root_topk_index, root_hidden, req_pool_indices, seq_lens):
            return draft.expand(root_topk_p, root_topk_index, root_hidden, req_pool_indices=req_pool_indices,
                                seq_lens=seq_lens, static_max_seq_len=max_seq_len)

        self.runner = CudaGraphRunner(
            expand,
            [
                StaticInput("root_topk_p", 1, torch.float32, (k,)),
                StaticInput("root_topk_index", 1, torch.int64, (k,)),
                StaticInput("root_hidden", 1, hidden_dtype, (hidden_size,)),
                StaticInput("req_pool_indices", 1, torch.int64),
                StaticInput("seq_lens", 1, torch.int64),
            ],
            batch_sizes, device=device, use_graphs=use_graphs, pool=pool, name="draft",
        )

    def capture(self) -> int:
        self.runner.capture()
        return self.runner.memory_bytes

    def can_run(self, bs: int) -> bool:
        return self.runner.can_run(bs)

    def __call__(self, root_topk_p, root_topk_index, root_hidden, *, req_pool_indices, seq_lens):
        bs = int(req_pool_indices.shape[0])
        return self.runner(bs, root_topk_p=root_topk_p, root_topk_index=root_topk_index, root_hidden=root_hidden,
                           req_pool_indices=req_pool_indices, seq_lens=seq_lens)


class EAGLEDraftExtendCudaGraphRunner:
    def __init__(
        self,
        draft: DraftRunner,
        *,
        batch_sizes: list[int],
        num_tokens_per_req: int,
        feature_size: int,
        feature_dtype: torch.dtype,
        pad_slot: int,
        max_seq_len: int,
        device: torch.device,
        use_graphs: bool = True,
        pool=None,
    ) -> None:
        t = num_tokens_per_req

        def extend(input_ids, features, positions, out_cache_loc, req_pool_indices, seq_lens, num_committed):
            bs = req_pool_indices.shape[0]
            output_rows = torch.arange(bs, device=seq_lens.device) * t + num_committed - 1
            return draft.extend(input_ids=input_ids, features=features, positions=positions,
                                out_cache_loc=out_cache_loc, req_pool_indices=req_pool_indices, prefix_lens=seq_lens,
                                extend_lens_cpu=[t] * bs, output_rows=output_rows, static_max_seq_len=max_seq_len)

        self.runner = CudaGraphRunner(
            extend,
            [
                StaticInput("input_ids", t, torch.int64),
                StaticInput("features", t, feature_dtype, (feature_size,)),
                StaticInput("positions", t, torch.int64),
                StaticInput("out_cache_loc", t, torch.int64, pad_value=pad_slot),
                StaticInput("req_pool_indices", 1, torch.int64),
                StaticInput("seq_lens", 1, torch.int64),
                StaticInput("num_committed", 1, torch.int64, pad_value=1),
            ],
            batch_sizes, device=device, use_graphs=use_graphs, pool=pool, name="draft extend",
        )

    def capture(self) -> int:
        self.runner.capture()
        return self.runner.memory_bytes

    def can_run(self, bs: int) -> bool:
        return self.runner.can_run(bs)

    def __call__(self, **inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        bs = int(inputs["req_pool_indices"].shape[0])
        return self.runner(bs, **inputs)
