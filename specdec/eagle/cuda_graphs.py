"""The draft head's CUDA graphs, on the generic ``specdec.cuda_graph.CudaGraphRunner``.

* ``EAGLEDraftCudaGraphRunner``: the whole multi-step draft of a decode step (the requests' root
  expansions read from the ``DraftState``, S - 1 draft forwards, top-k selection, ancestor-slot
  bookkeeping, ``organize_draft_results``) as one graph.
* ``EAGLEDraftExtendCudaGraphRunner``: a draft extend over a fixed number of tokens per request;
  the new root expansions are stored into the ``DraftState`` inside the graph (padding requests:
  its pad row). The worker captures it twice: after verification over S + 1 tokens per request
  (the committed ones, then padding whose K/V goes to the draft's padding slot), and for plain
  steps over the one committed token per request (no padding rows through the draft head).

Reading and writing the state inside the graphs spares the eager gathers, scatters and input copies
between them (about ten small kernels a decode step).

Padding requests have prefix 0 and write only the padding slot or scratch slots of rows past
the real batch (the scratch area is sized for the largest captured batch). With a backend that
plans on the host (FlashInfer), every draft forward of the graph is planned from the requests'
host lengths before the replay, so the graphs replay only when the host has them.
"""

from __future__ import annotations

import torch

from specdec.attention.base import StaticPlan
from specdec.cuda_graph import CudaGraphRunner, StaticInput, padded_lengths
from specdec.eagle.draft import DraftRunner
from specdec.eagle.state import DraftState
from specdec.forward import ForwardMode


class EAGLEDraftCudaGraphRunner:
    def __init__(
        self,
        draft: DraftRunner,
        state: DraftState,
        *,
        batch_sizes: list[int],
        max_seq_len: int,
        device: torch.device,
        use_graphs: bool = True,
        pool=None,
    ) -> None:
        k = draft.topk
        backend = draft.attn_backend
        self.needs_host_lengths = backend.plans_on_host

        def plan(padded: int, views, seq_lens_cpu: list[int] | None) -> None:
            # draft step i: one sequence per branch, its prefix plus i + 1 ancestors
            branches = [p for p in padded_lengths(seq_lens_cpu, padded) for _ in range(k)]
            for step in range(draft.num_steps - 1):
                backend.plan_static(StaticPlan(ForwardMode.DECODE, branches, q_len=1, own=step + 1,
                                               max_seq_len=max_seq_len, device=device))

        def expand(req_pool_indices, seq_lens):
            topk_p, topk_index, hidden = state.load(req_pool_indices)  # padding requests read row 0
            return draft.expand(topk_p[:, :k], topk_index[:, :k], hidden, req_pool_indices=req_pool_indices,
                                seq_lens=seq_lens, static_max_seq_len=max_seq_len)

        self.runner = CudaGraphRunner(
            expand,
            [
                StaticInput("req_pool_indices", 1, torch.int64),
                StaticInput("seq_lens", 1, torch.int64),
            ],
            batch_sizes, device=device, use_graphs=use_graphs, pool=pool, name="draft",
            prepare=plan if self.needs_host_lengths else None,
        )

    def capture(self) -> int:
        self.runner.capture()
        return self.runner.memory_bytes

    def can_run(self, bs: int, seq_lens_cpu: list[int] | None = None) -> bool:
        return self.runner.can_run(bs) and (seq_lens_cpu is not None or not self.needs_host_lengths)

    def __call__(self, *, req_pool_indices, seq_lens, seq_lens_cpu: list[int] | None = None):
        """The draft tree of each request from its stored root expansion: ``DraftRunner.expand``'s lists."""
        bs = int(req_pool_indices.shape[0])
        return self.runner(bs, host=seq_lens_cpu, req_pool_indices=req_pool_indices, seq_lens=seq_lens)


class EAGLEDraftExtendCudaGraphRunner:
    def __init__(
        self,
        draft: DraftRunner,
        state: DraftState,
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
        name: str = "draft extend",
    ) -> None:
        """``num_tokens_per_req`` t: each request's tokens, its committed ones first (the input
        ``num_committed`` says how many; with t = 1 there is no such input: the one token is)."""
        t = num_tokens_per_req
        backend = draft.attn_backend
        self.needs_host_lengths = backend.plans_on_host
        self.num_tokens_per_req = t

        def plan(padded: int, views, seq_lens_cpu: list[int] | None) -> None:
            backend.plan_static(StaticPlan(ForwardMode.DRAFT_EXTEND, padded_lengths(seq_lens_cpu, padded), q_len=t, own=t,
                                           max_seq_len=max_seq_len, device=device))

        def extend(input_ids, features, positions, out_cache_loc, req_pool_indices, seq_lens, state_rows,
                   num_committed=None):
            bs = req_pool_indices.shape[0]
            output_rows = None  # t = 1: each row is its request's committed token
            if num_committed is not None:  # the root expansion at each request's last committed token
                output_rows = torch.arange(bs, device=seq_lens.device) * t + num_committed - 1
            root = draft.extend(input_ids=input_ids, features=features, positions=positions,
                                out_cache_loc=out_cache_loc, req_pool_indices=req_pool_indices, prefix_lens=seq_lens,
                                extend_lens_cpu=[t] * bs, output_rows=output_rows, static_max_seq_len=max_seq_len)
            state.store(state_rows, *root)
            return root

        committed = [StaticInput("num_committed", 1, torch.int64, pad_value=1)] if t > 1 else []
        self.runner = CudaGraphRunner(
            extend,
            [
                StaticInput("input_ids", t, torch.int64),
                StaticInput("features", t, feature_dtype, (feature_size,)),
                StaticInput("positions", t, torch.int64),
                StaticInput("out_cache_loc", t, torch.int64, pad_value=pad_slot),
                StaticInput("req_pool_indices", 1, torch.int64),
                StaticInput("seq_lens", 1, torch.int64),
                *committed,
                StaticInput("state_rows", 1, torch.int64, pad_value=state.pad_row),
            ],
            batch_sizes, device=device, use_graphs=use_graphs, pool=pool, name=name,
            prepare=plan if self.needs_host_lengths else None,
        )

    def capture(self) -> int:
        self.runner.capture()
        return self.runner.memory_bytes

    def can_run(self, bs: int, seq_lens_cpu: list[int] | None = None) -> bool:
        return self.runner.can_run(bs) and (seq_lens_cpu is not None or not self.needs_host_lengths)

    def __call__(self, *, seq_lens_cpu: list[int] | None = None,
                 **inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The draft extend, the root expansions stored (``state_rows``: the requests' state rows);
        returns them too. Inputs are tensors or writers of their rows (``CudaGraphRunner``)."""
        bs = int(inputs["req_pool_indices"].shape[0])
        return self.runner(bs, host=seq_lens_cpu, **inputs)
