"""The prefill forward of the reference host: one target EXTEND over a step's prompt chunks (each
from its cached prefix or previous chunk on), the draft EXTEND with an EAGLE worker, and the token
after each chunk. The scheduler picks the chunks, gives them KV slots and does the bookkeeping.

The token after a chunk is known when the chunk ends inside its request's fill ids (the draft
head's input at the chunk's last position) and sampled when it ends them::

    A = p0 p1 p2 p3 p4, chunks A[0:3] then A[3:5]
    step 1  computes p0 p1 p2   next token p3 (known)
    step 2  computes p3 p4      next token sampled from the logits at p4: A's first output
"""

from __future__ import annotations

import torch

from specdec.eagle.worker import sample_after_prefill
from specdec.engine.admission import PrefillChunk
from specdec.engine.batch_sampling import BatchSampling, StepLogprobs
from specdec.engine.memory import PagedKVMemory, host_to_device
from specdec.engine.model_runner import ModelRunner
from specdec.engine.prompt_logprobs import PromptLogprobs
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode, deliberate_sync


class Prefiller:
    """Runs a prefill step's forward over chunks the scheduler admitted and gave KV slots."""

    def __init__(self, runner: ModelRunner, memory: PagedKVMemory, *, worker=None,
                 generator: torch.Generator | None) -> None:
        """``worker``: the EAGLE worker (None: target only)."""
        self.runner = runner
        self.memory = memory
        self.worker = worker
        self.generator = generator
        self.device = memory.req_to_token.device

    def run(
        self,
        chunks: list[PrefillChunk],
        out_cache_loc: torch.Tensor,  # [num_tokens] the chunks' KV slots, chunk by chunk
    ) -> tuple[list[int], StepLogprobs | None]:
        """The token after each chunk, and the output logprobs of the requests whose last chunk
        this is (in order), if any asked for them. Prompt logprobs go to the requests directly."""
        device = self.device
        starts, lens = [c.start for c in chunks], [c.length for c in chunks]
        rows = [c.req.row for c in chunks]
        columns = host_to_device(torch.tensor([rows, starts, lens], dtype=torch.int64), device)
        prompt_logprobs = PromptLogprobs.of(chunks)
        batch = ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            input_ids=host_to_device(torch.tensor([t for c in chunks for t in c.tokens[c.start:c.end]],
                                                  dtype=torch.int64), device),
            positions=torch.cat([torch.arange(c.start, c.end, device=device) for c in chunks]),
            out_cache_loc=out_cache_loc,
            req_pool_indices=columns[0],
            prefix_lens=columns[1],
            extend_lens=columns[2],
            req_to_token=self.memory.req_to_token,
            kv_cache=self.runner.kv_cache,
            attn_backend=self.runner.attn_backend,
            # every position's logits only when a request asks for prompt logprobs
            logits_mode=LogitsMode.ALL if prompt_logprobs is not None else LogitsMode.LAST,
            capture_hidden_mode=CaptureHiddenMode.FULL if self.worker else CaptureHiddenMode.NULL,
            prefix_lens_cpu=starts,
            extend_lens_cpu=lens,
        )
        next_known = [c.next_token for c in chunks]
        sampling = BatchSampling([c.req for c in chunks if c.is_last], device, self.generator, self.runner.vocab_size,
                                 prompt_logprobs=prompt_logprobs)
        if self.worker is not None:
            next_ids = self.worker.prefill(batch, sampling, next_tokens=next_known)
        else:
            logits = self.runner.forward(batch).next_token_logits
            if prompt_logprobs is not None:
                prompt_logprobs.record(logits)
                logits = logits[host_to_device(torch.tensor(lens), device).cumsum(0) - 1]
            next_ids = sample_after_prefill(logits, sampling, next_known)
        with deliberate_sync():  # the prefill's one read: the requests' next tokens
            return next_ids.tolist(), sampling.take_logprobs()
