"""Scheduler: continuous batching over the paged KV cache, with or without speculation.

Each ``step`` runs one batch: a prefill of newly admitted requests when there are any, otherwise
one decode step of every running request (plain: one token each; EAGLE: k + 1 tokens each).
Requests join and leave between steps. Admission reserves a request's worst case (prompt +
max_new_tokens + one draft tree), so a running request never runs out of KV slots mid-decode.
"""

from __future__ import annotations

import collections

import torch

from specdec.engine.memory import PagedKVMemory, host_to_device
from specdec.engine.model_runner import ModelRunner
from specdec.engine.request import FinishReason, Request
from specdec.engine.sampling import SamplingBatch, probs_from_logits, sample
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode


class BatchSampling:
    """The host's per-batch sampling settings, shaped as specdec.host.SamplingInfo.

    The per-request tensors are built on first use: an all-greedy batch needs none, and so
    copies nothing to the device.
    """

    def __init__(self, requests: list[Request], device, generator: torch.Generator | None) -> None:
        self._params = [r.params for r in requests]
        self._device = device
        self._batch: SamplingBatch | None = None
        self.is_all_greedy = all(p.is_greedy for p in self._params)
        self.generator = generator

    @property
    def batch(self) -> SamplingBatch:
        if self._batch is None:
            self._batch = SamplingBatch.from_params(self._params, self._device)
        return self._batch

    def probs(self, logits: torch.Tensor, row_to_request: torch.Tensor) -> torch.Tensor:
        return probs_from_logits(logits, self.batch, row_to_request)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        if self.is_all_greedy:
            return logits.argmax(dim=1)
        return sample(logits, self.batch, generator=self.generator)


class Scheduler:
    def __init__(
        self,
        runner: ModelRunner,
        memory: PagedKVMemory,
        *,
        worker=None,
        max_running_requests: int,
        tree_tokens: int,
        generator: torch.Generator | None = None,
    ) -> None:
        self.runner = runner
        self.memory = memory
        self.worker = worker
        self.max_running_requests = max_running_requests
        # KV positions a decode step may hold beyond the committed ones (a whole draft tree)
        self.tree_tokens = tree_tokens
        self.generator = generator
        self.device = memory.req_to_token.device
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.reserved = 0

    # ------------------------------------------------------------ bookkeeping
    def worst_case_tokens(self, prompt_len: int, max_new_tokens: int) -> int:
        page = self.memory.page_size
        need = prompt_len + max_new_tokens + self.tree_tokens
        return -(-need // page) * page + page

    def add(self, req: Request) -> None:
        req.reserved_tokens = self.worst_case_tokens(len(req.prompt_ids), req.params.max_new_tokens)
        self.waiting.append(req)

    def abort(self, rid: str) -> Request | None:
        for req in list(self.waiting):
            if req.rid == rid:
                self.waiting.remove(req)
                req.finish_reason = FinishReason.ABORT
                return req
        for req in self.running:
            if req.rid == rid:
                req.finish_reason = FinishReason.ABORT
                self._release([req])
                return req
        return None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _release(self, reqs: list[Request]) -> None:
        for req in reqs:
            self.memory.free_request_tokens(req.row, req.kv_len)
            self.memory.free_req(req.row)
            self.reserved -= req.reserved_tokens
            req.row = -1
            req.kv_len = 0
        done = {id(r) for r in reqs}
        self.running = [r for r in self.running if id(r) not in done]

    def _admit(self) -> list[Request]:
        admitted = []
        while self.waiting and len(self.running) + len(admitted) < self.max_running_requests:
            req = self.waiting[0]
            if self.reserved + req.reserved_tokens > self.memory.capacity:
                break
            self.waiting.popleft()
            req.row = self.memory.alloc_req()
            self.reserved += req.reserved_tokens
            admitted.append(req)
        return admitted

    # ------------------------------------------------------------ one step
    @torch.inference_mode()
    def step(self) -> list[Request]:
        """Run one batch; returns the requests that finished in it."""
        admitted = self._admit()
        if admitted:
            self._prefill(admitted)
            batch = admitted
        elif self.running:
            batch = list(self.running)
            self._decode(batch)
        else:
            return []
        finished = [r for r in batch if r.finished]
        self._release(finished)
        return finished

    def _prefill(self, reqs: list[Request]) -> None:
        device = self.device
        lens = [len(r.prompt_ids) for r in reqs]
        rows = torch.tensor([r.row for r in reqs], dtype=torch.int64, device=device)
        zeros = torch.zeros(len(reqs), dtype=torch.int64, device=device)
        extend_lens = torch.tensor(lens, dtype=torch.int64, device=device)
        out_cache_loc = self.memory.alloc_extend(rows, zeros, extend_lens)
        batch = ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            input_ids=torch.tensor([t for r in reqs for t in r.prompt_ids], dtype=torch.int64, device=device),
            positions=torch.cat([torch.arange(n, device=device) for n in lens]),
            out_cache_loc=out_cache_loc,
            req_pool_indices=rows,
            prefix_lens=zeros,
            extend_lens=extend_lens,
            req_to_token=self.memory.req_to_token,
            kv_cache=self.runner.kv_cache,
            attn_backend=self.runner.attn_backend,
            logits_mode=LogitsMode.LAST,
            capture_hidden_mode=CaptureHiddenMode.FULL if self.worker else CaptureHiddenMode.NULL,
            prefix_lens_cpu=[0] * len(reqs),
            extend_lens_cpu=lens,
        )
        sampling = BatchSampling(reqs, device, self.generator)
        if self.worker is not None:
            next_ids = self.worker.prefill(batch, sampling)
        else:
            next_ids = sampling.sample(self.runner.forward(batch).next_token_logits)
        for req, n, token in zip(reqs, lens, next_ids.tolist()):
            req.kv_len = n
            req.append([token])
        self.running.extend(reqs)

    def _decode(self, reqs: list[Request]) -> None:
        if self.worker is None:
            self._decode_plain(reqs)
            return
        threshold = self.worker.config.batch_size_threshold
        speculate = threshold is None or len(reqs) <= threshold
        spec = [r for r in reqs if speculate and r.params.speculative]
        plain = [r for r in reqs if not (speculate and r.params.speculative)]
        if spec:
            self._decode_with_worker(spec, self.worker.decode, speculative=True)
        if plain:
            self._decode_with_worker(plain, self.worker.decode_plain, speculative=False)

    def _decode_inputs(self, reqs: list[Request]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[bs] request rows, tokens in KV, and last committed tokens (one copy to the device)."""
        columns = host_to_device(torch.tensor(
            [[r.row for r in reqs], [r.kv_len for r in reqs], [r.last_token for r in reqs]], dtype=torch.int64),
            self.device)
        return columns[0], columns[1], columns[2]

    def _decode_with_worker(self, reqs: list[Request], step, *, speculative: bool) -> None:
        rows, seq_lens, last = self._decode_inputs(reqs)
        out = step(rows, seq_lens, last, BatchSampling(reqs, self.device, self.generator),
                   seq_lens_cpu=[r.kv_len for r in reqs], rows_cpu=[r.row for r in reqs])
        for req, tokens, kv_len, k in zip(reqs, out.tokens, out.seq_lens, out.accept_lengths):
            req.kv_len = kv_len
            if speculative:
                req.spec_verify_ct += 1
                req.accept_lengths.append(k)
            req.append(tokens)

    def _decode_plain(self, reqs: list[Request]) -> None:
        rows, seq_lens, last = self._decode_inputs(reqs)
        host_lens = [r.kv_len for r in reqs]
        out_cache_loc = self.memory.alloc_extend([r.row for r in reqs], host_lens, [1] * len(reqs))
        batch = ForwardBatch.decode(
            last, seq_lens, out_cache_loc, rows,
            req_to_token=self.memory.req_to_token, kv_cache=self.runner.kv_cache,
            attn_backend=self.runner.attn_backend, seq_lens_cpu=host_lens,
        )
        next_ids = BatchSampling(reqs, self.device, self.generator).sample(self.runner.forward(batch).next_token_logits)
        for req, token in zip(reqs, next_ids.tolist()):
            req.kv_len += 1
            req.append([token])
