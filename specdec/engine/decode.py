"""Decode steps of the reference host: queued on the device (``DecodeLauncher.launch``), read back
later (``DecodeLauncher.read``), so a scheduler may launch step t + 1 before it reads step t.

A step of ``reqs`` runs as at most two sub-batches (parts): the requests that speculate (an EAGLE
worker, ``params.speculative``, at most ``batch_size_threshold`` requests) verify a draft tree and
commit k + 1 tokens each; the others decode one target token each.

Overlap (``overlap=True``): a step launched from the previous, unread step takes its lengths and
last tokens from that step's device outputs (``LaunchedStep.next_seq_lens`` / ``next_tokens``).
The host does not know a request's length then, only its bound: the length before the unread
step plus what that step may add (``growth``). So it reserves every position the new step may
write, up to that bound plus one draft tree (``Request.kv_alloc``), and the worker reads the
tree's slots from ``req_to_token`` on the device (``slots_reserved``). Worked example, a
speculating request with kv_len 10 after the last read step, max_step_tokens 4, tree_tokens 8:

    unread step t     may commit up to 4 tokens     -> kv_len after it in 11 .. 14
    launched step t+1 writes from that length on    -> positions [0, 14 + 8) reserved
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import torch

from specdec.eagle.output import DecodeOutput, PendingDecode, pending_one_token
from specdec.engine.batch_sampling import BatchSampling
from specdec.engine.memory import PagedKVMemory, host_to_device
from specdec.engine.model_runner import ModelRunner
from specdec.engine.request import Request
from specdec.forward import ForwardBatch
from specdec.host import table_slots


@dataclasses.dataclass
class DecodePart:
    """One launched sub-batch of a decode step: its requests and the worker's pending result."""

    reqs: list[Request]
    pending: PendingDecode
    sampling: BatchSampling


@dataclasses.dataclass
class LaunchedStep:
    """A decode step queued on the device whose results the host has not read yet."""

    parts: list[DecodePart]
    # [len(reqs)] device tensors in ``reqs`` order: lengths and last tokens after the step
    next_seq_lens: torch.Tensor
    next_tokens: torch.Tensor
    # the most KV tokens the step may add to each request (by id), for slot reservation
    growth: dict[int, int]

    @property
    def reqs(self) -> list[Request]:
        return [r for part in self.parts for r in part.reqs]


class DecodeLauncher:
    """Launches the decode steps of running requests and reads them back into the requests."""

    def __init__(
        self,
        runner: ModelRunner,
        memory: PagedKVMemory,
        *,
        worker=None,
        tree_tokens: int,
        overlap: bool,
        generator: torch.Generator | None,
        tokenizer: Any = None,
        token_table=None,
    ) -> None:
        """``worker``: the speculative worker (None: plain decoding); ``tree_tokens``: KV positions a
        step may hold past the committed ones (a whole draft tree); ``tokenizer``: for stop strings;
        ``token_table``: brought up to date before each speculative launch (n-gram drafting)."""
        self.runner = runner
        self.memory = memory
        self.worker = worker
        self.tree_tokens = tree_tokens
        # most tokens one decode step commits per request (the accepted drafts + bonus)
        self.max_step_tokens = worker.config.num_steps + 1 if worker is not None else 1
        self.overlap = overlap
        self.generator = generator
        self.tokenizer = tokenizer
        self.token_table = token_table
        self.device = memory.req_to_token.device
        # decode steps (sub-batches) by tree shape ("SxKxN"; "plain": no draft tree), speculative engines
        self.spec_shape_steps: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------ KV
    def pages_needed(self, reqs: list[Request], previous: LaunchedStep | None) -> int:
        """Fresh KV pages the next decode step of ``reqs`` may take: a whole draft tree past each
        request's length (plus, under overlap, what the unread ``previous`` step may add)."""
        growth = previous.growth if previous is not None else {}
        tokens = self.tree_tokens if self.worker is not None else 1
        if self.overlap:  # _reserve extends each request's reservation from kv_alloc
            ends = [r.kv_len + growth.get(id(r), 0) + tokens for r in reqs]
            starts = [r.kv_alloc for r in reqs]
            return self.memory.pages_needed(starts, [max(e - s, 0) for e, s in zip(ends, starts)])
        return self.memory.pages_needed([r.kv_len for r in reqs], [tokens] * len(reqs))

    def _reserve(self, reqs: list[Request], ends: list[int]) -> None:
        """Give positions up to ``ends`` (exclusive) of each request KV slots (overlap only)."""
        grow = [(r, end) for r, end in zip(reqs, ends) if end > r.kv_alloc]
        if not grow:
            return
        self.memory.alloc_extend([r.row for r, _ in grow], [r.kv_alloc for r, _ in grow],
                                 [end - r.kv_alloc for r, end in grow])
        for req, end in grow:
            req.kv_alloc = end

    # ------------------------------------------------------------ launch
    def launch(self, reqs: list[Request], previous: LaunchedStep | None) -> LaunchedStep:
        """Queue one decode step of ``reqs``, after the unread ``previous`` step (overlap) or
        after the host's values (None)."""
        if self.worker is None:
            groups = [(reqs, False)]
        else:
            threshold = self.worker.config.batch_size_threshold
            speculate = threshold is None or len(reqs) <= threshold
            spec = [r for r in reqs if speculate and r.params.speculative]
            plain = [r for r in reqs if not (speculate and r.params.speculative)]
            groups = [(g, is_spec) for g, is_spec in ((spec, True), (plain, False)) if g]
        parts, growth = [], {}
        for group, speculative in groups:
            step_tokens = self.max_step_tokens if speculative else 1
            parts.append(self._launch_part(group, previous, speculative))
            growth.update((id(r), step_tokens) for r in group)
        return LaunchedStep(
            parts=parts,
            next_seq_lens=torch.cat([p.pending.next_seq_lens for p in parts]),
            next_tokens=torch.cat([p.pending.next_tokens for p in parts]),
            growth=growth,
        )

    def _launch_part(self, reqs: list[Request], previous: LaunchedStep | None, speculative: bool) -> DecodePart:
        rows_cpu = [r.row for r in reqs]
        # the host knows the lengths unless the unread step speculated for one of these requests
        growth = previous.growth if previous is not None else {}
        exact = all(growth.get(id(r), 0) <= 1 for r in reqs)  # a plain step adds exactly one token
        seq_lens_cpu = [r.kv_len + growth.get(id(r), 0) for r in reqs] if exact else None
        rows, seq_lens, last = self._inputs(reqs, previous)
        if self.overlap:
            # the step writes positions seq_len .. seq_len + tokens - 1, seq_len at most the
            # request's length before the unread step plus what that step may add
            tokens = self.tree_tokens if speculative else 1
            self._reserve(reqs, [r.kv_len + growth.get(id(r), 0) + tokens for r in reqs])
        sampling = BatchSampling(reqs, self.device, self.generator, self.runner.vocab_size)
        if speculative and self.token_table is not None:
            self.token_table.sync(reqs)
        kw = dict(seq_lens_cpu=seq_lens_cpu, rows_cpu=rows_cpu)
        if self.worker is None:
            pending = self._launch_plain(rows, seq_lens, last, sampling, **kw)
        else:
            launch = self.worker.launch_decode if speculative else self.worker.launch_decode_plain
            pending = launch(rows, seq_lens, last, sampling, slots_reserved=self.overlap, **kw)
        return DecodePart(reqs, pending, sampling)

    def _inputs(
        self, reqs: list[Request], previous: LaunchedStep | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[bs] request rows, tokens in KV, and last committed tokens on the device: from the
        host's values (one copy), or the lengths and tokens from the unread ``previous`` step."""
        if previous is None:
            columns = host_to_device(torch.tensor(
                [[r.row for r in reqs], [r.kv_len for r in reqs], [r.last_token for r in reqs]], dtype=torch.int64),
                self.device)
            return columns[0], columns[1], columns[2]
        where = {id(r): i for i, r in enumerate(previous.reqs)}
        index = [where[id(r)] for r in reqs]
        columns = host_to_device(torch.tensor([[r.row for r in reqs], index], dtype=torch.int64), self.device)
        return columns[0], previous.next_seq_lens[columns[1]], previous.next_tokens[columns[1]]

    def _launch_plain(self, rows, seq_lens, last, sampling: BatchSampling, *, seq_lens_cpu, rows_cpu) -> PendingDecode:
        """One target token per request (no speculation configured)."""
        if self.overlap:  # reserved by _reserve
            out_cache_loc = table_slots(self.memory.req_to_token, rows, seq_lens, 1)
        else:
            out_cache_loc = self.memory.alloc_extend(rows_cpu, seq_lens_cpu, [1] * len(rows_cpu))
        batch = ForwardBatch.decode(
            last, seq_lens, out_cache_loc, rows,
            req_to_token=self.memory.req_to_token, kv_cache=self.runner.kv_cache,
            attn_backend=self.runner.attn_backend, seq_lens_cpu=seq_lens_cpu,
        )
        next_ids = sampling.sample(self.runner.forward(batch).next_token_logits)  # [bs]
        return pending_one_token(seq_lens, next_ids)

    # ------------------------------------------------------------ read
    def read(self, launched: LaunchedStep) -> list[Request]:
        """Wait for a launched step and hand its tokens to the requests; returns those it finished.
        Requests that finished before (their step was launched ahead) ignore their tokens."""
        finished = []
        for part in launched.parts:
            out: DecodeOutput = part.pending.result()
            if self.worker is not None:
                self.spec_shape_steps[out.shape or "plain"] += 1
            logprobs = part.sampling.take_logprobs()
            for i, (req, tokens, kv_len, k) in enumerate(zip(part.reqs, out.tokens, out.seq_lens,
                                                             out.accept_lengths)):
                if req.finished:
                    continue
                req.kv_len = kv_len
                if out.shape is not None:  # a verify step (adaptive speculation may decode plainly)
                    req.spec_verify_ct += 1
                    req.accept_lengths.append(k)
                if self.worker is not None:
                    shape = out.shape or "plain"
                    req.spec_shapes[shape] = req.spec_shapes.get(shape, 0) + 1
                req.append(tokens, logprobs.of(i) if logprobs is not None else None, tokenizer=self.tokenizer)
                if req.finished:
                    finished.append(req)
        return finished
