"""Scheduler: continuous batching over the paged KV cache, with or without speculation.

Each ``step`` runs one batch: a prefill (chunks of newly admitted requests' prompts, less the
prefix the prefix cache supplies), or one decode step of every running request (plain: one token
each; EAGLE: k + 1 tokens each); with both pending the two alternate, so a long prompt stalls
decoding by at most one chunk (``specdec.engine.admission``). Requests join and leave between
steps. Admission promises a request its prompt plus an estimate of its output; when a decode step
would not fit in the KV pool (free pages plus cached pages no request uses), the scheduler
retracts requests, least progress first, until it does: a retracted request's KV goes to the
prefix cache (or is freed) and it waits to be recomputed from its prompt and output so far.

Overlap scheduling (``overlap=True``): a decode step is launched from the previous step's
device-resident outputs (lengths, last tokens) *before* the host reads that step, so the device
never idles while the host reads, applies stop conditions and prepares the next step::

    host    launch t+1 | read t, apply | launch t+2 | read t+1, apply | ...
    device  ... step t | step t+1 .................| step t+2 ........

The host cannot know a request's length while its last step is unread, so it keeps each running
request's KV slots reserved up to the longest that step could make it plus one draft tree
(``Request.kv_alloc``), and the worker reads the tree's slots from ``req_to_token`` on the device
(``slots_reserved``). A request that finishes in step t has already been launched in step t + 1:
that step's tokens for it are dropped and its KV is released once step t + 1 is read (an aborted
request's likewise). A prefill reads the step in flight first.
"""

from __future__ import annotations

import collections
import dataclasses

import torch

from specdec.eagle.output import DecodeOutput, PendingDecode, pending_one_token
from specdec.eagle.worker import sample_after_prefill
from specdec.engine.admission import KVPromise, NewTokenRatio, PrefillChunk, chunk_request, fill_ids, retract_order
from specdec.engine.batch_sampling import BatchSampling, StepLogprobs
from specdec.engine.memory import PagedKVMemory, host_to_device
from specdec.engine.model_runner import ModelRunner
from specdec.engine.prefix_cache import NoPrefixCache, RadixPrefixCache
from specdec.engine.prompt_logprobs import PromptLogprobs, cacheable_tokens
from specdec.engine.request import FinishReason, Request
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode
from specdec.host import table_slots


# a prompt this short is cheaper to prefill again than to wait a step for its twin's KV
TWIN_MIN_TOKENS = 32


@dataclasses.dataclass
class _Part:
    """One launched sub-batch of a decode step: its requests and the worker's pending result."""

    reqs: list[Request]
    pending: PendingDecode
    speculative: bool
    sampling: BatchSampling


@dataclasses.dataclass
class _Launched:
    """A decode step queued on the device whose results the host has not read yet."""

    parts: list[_Part]
    # [len(reqs)] device tensors in ``reqs`` order: lengths and last tokens after the step
    next_seq_lens: torch.Tensor
    next_tokens: torch.Tensor
    # the most KV tokens the step may add to each request (by id), for slot reservation
    growth: dict[int, int]

    @property
    def reqs(self) -> list[Request]:
        return [r for part in self.parts for r in part.reqs]


class Scheduler:
    def __init__(
        self,
        runner: ModelRunner,
        memory: PagedKVMemory,
        *,
        worker=None,
        max_running_requests: int,
        tree_tokens: int,
        overlap: bool = False,
        generator: torch.Generator | None = None,
        prefix_cache: RadixPrefixCache | NoPrefixCache | None = None,
        chunked_prefill_size: int | None = None,
        schedule_conservativeness: float = 1.0,
    ) -> None:
        """``prefix_cache``: default none (``NoPrefixCache``); ``chunked_prefill_size``: most
        prompt tokens per prefill step (None: no limit)."""
        self.runner = runner
        self.memory = memory
        self.cache = prefix_cache if prefix_cache is not None else NoPrefixCache(memory)
        self.chunked_prefill_size = chunked_prefill_size
        self.new_token_ratio = NewTokenRatio(schedule_conservativeness)
        self.worker = worker
        self.max_running_requests = max_running_requests
        # KV positions a decode step may hold beyond the committed ones (a whole draft tree)
        self.tree_tokens = tree_tokens
        # most tokens one decode step commits per request (the accepted drafts + bonus)
        self.max_step_tokens = worker.config.num_steps + 1 if worker is not None else 1
        self.overlap = overlap
        self.generator = generator
        self.device = memory.req_to_token.device
        self.waiting: collections.deque[Request] = collections.deque()
        # admitted and not yet released (finished ones stay while a launched step still holds them)
        self.running: list[Request] = []
        # the admitted request whose prompt is partly prefilled (chunked prefill)
        self.chunked: Request | None = None
        self.launched: _Launched | None = None
        self.promise = KVPromise(step_tokens=self.worst_case_tokens(0, 0))
        self._last_was_prefill = False
        self.num_retracted = 0
        # prefill work: tokens computed, and tokens the prefix cache supplied instead
        self.prefill_tokens = 0
        self.cached_prefill_tokens = 0
        # decode steps (sub-batches) by tree shape ("SxKxN"; "plain": no draft tree), speculative engines
        self.spec_shape_steps: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------ bookkeeping
    def worst_case_tokens(self, prompt_len: int, max_new_tokens: int) -> int:
        """KV slots a request may hold at once: prompt + outputs, the tokens of one more step
        (overlap launches a step before it knows the last one finished the request), one draft
        tree, and a page of rounding."""
        page = self.memory.page_size
        need = prompt_len + max_new_tokens + self.tree_tokens
        if self.overlap:
            need += self.max_step_tokens
        return -(-need // page) * page + page

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def abort(self, rid: str) -> Request | None:
        for req in list(self.waiting):
            if req.rid == rid:
                self.waiting.remove(req)
                req.finish_reason = FinishReason.ABORT
                return req
        for req in self.running:
            if req.rid == rid:
                if not req.finished:
                    req.finish_reason = FinishReason.ABORT
                self._release_finished()
                return req
        if self.chunked is not None and self.chunked.rid == rid:
            req, self.chunked = self.chunked, None
            req.finish_reason = FinishReason.ABORT
            self._release(req)
            return req
        return None

    def drain(self) -> list[Request]:
        """Read the step in flight, if any; returns the requests that finished in it."""
        finished = self._read_launched()
        self._release_finished()
        return finished

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.launched or self.chunked)

    def flush_cache(self) -> int:
        """Drop every cached KV page no request uses; returns the pages freed."""
        return self.cache.flush()

    def _release_finished(self) -> None:
        """Free the KV and rows of finished requests that no launched step still holds."""
        held = {id(r) for r in self.launched.reqs} if self.launched else set()
        done = [r for r in self.running if r.finished and id(r) not in held]
        for req in done:
            self._release(req)
        gone = {id(r) for r in done}
        self.running = [r for r in self.running if id(r) not in gone]

    def _release(self, req: Request) -> None:
        """Hand a leaving request's KV to the prefix cache (which frees what it does not keep)
        and free its row."""
        self.cache.release_request(req.row, fill_ids(req), req.kv_len, req.kv_alloc)
        self.memory.free_req(req.row)
        req.row = -1
        req.kv_len = req.kv_alloc = 0

    def _unadmit(self, chunks: list[PrefillChunk]) -> None:
        """Abort the requests of a prefill step that failed, giving back their rows and KV."""
        for chunk in chunks:
            req = chunk.req
            if req.row < 0 or any(r is req for r in self.running):
                continue
            if self.chunked is req:
                self.chunked = None
            req.finish_reason = FinishReason.ABORT
            self._release(req)

    # ------------------------------------------------------------ one step
    @torch.inference_mode()
    def step(self) -> list[Request]:
        """Run one batch; returns the requests found finished in it.

        With overlap, a decode ``step`` launches the next decode step and then reads the one
        launched by the previous ``step``: the tokens it hands out are one step behind.
        """
        chunks = self._plan_prefill() if self._prefill_turn() else []
        if chunks:
            finished = self._read_launched()  # the prefill needs the device's lengths settled
            try:
                self._prefill(chunks)
            except BaseException:
                self._unadmit(chunks)
                raise
            finished += [c.req for c in chunks if c.req.finished]
        else:
            finished = self._decode()
        self._last_was_prefill = bool(chunks)
        self._release_finished()
        return finished

    def _prefill_turn(self) -> bool:
        """Prefill when there is prefill work, alternating with decode steps while requests run."""
        if self.chunked is None and not self.waiting:
            return False
        decoding = any(not r.finished for r in self.running)
        return not (decoding and self._last_was_prefill)

    # ------------------------------------------------------------ admission
    def _plan_prefill(self) -> list[PrefillChunk]:
        """This step's prefill chunks: the chunked request's next one, then newly admitted
        requests while the chunk budget, the request rows and the KV promise allow."""
        budget = self.chunked_prefill_size or float("inf")
        ratio = self.new_token_ratio.value
        decoding = [r for r in self.running if not r.finished]
        # KV tokens not yet promised to anyone: reclaimable pages less the running requests' futures
        room = self.cache.reclaimable_pages() * self.memory.page_size
        room -= sum(self.promise.future_tokens(r, ratio) for r in decoding)
        if self.chunked is not None:  # promised at its admission: the rest of its prompt and its output
            rest = len(fill_ids(self.chunked)) - self.chunked.kv_len
            room -= self.promise.admission_tokens(self.chunked, rest, ratio)
        chunks: list[PrefillChunk] = []
        if self.chunked is not None:
            req = self.chunked
            chunk = chunk_request(req, fill_ids(req), req.kv_len, budget)
            if room < 0 and decoding:
                return []  # decode first: it may finish requests or retract this one
            self.chunked = req if not chunk.is_last else None
            chunks.append(chunk)
            budget -= chunk.length
        while self.chunked is None and self.waiting and budget > 0 \
                and len(self.running) + len(chunks) < self.max_running_requests:
            req = self.waiting[0]
            tokens = fill_ids(req)
            if self._twin_in(chunks, tokens):
                break  # next step it takes the twin's KV from the prefix cache
            extend = len(tokens) - self.cache.lookup(cacheable_tokens(req, tokens))
            need = self.promise.admission_tokens(req, extend, ratio)
            if need > room and (decoding or chunks):
                break  # wait for KV (an idle engine admits anyway: a request alone always fits)
            self.waiting.popleft()
            chunk = chunk_request(req, tokens, self._admit(req, tokens), budget)
            self.chunked = req if not chunk.is_last else None
            chunks.append(chunk)
            budget -= chunk.length
            room -= need
        return chunks

    def _twin_in(self, chunks: list[PrefillChunk], tokens: list[int]) -> bool:
        """Whether a request with these very tokens is prefilled in this step (``n > 1``: parallel
        samples of one prompt). With a prefix cache the twin waits one step and shares the KV."""
        return self.cache.enabled and len(tokens) >= max(TWIN_MIN_TOKENS, 2 * self.memory.page_size) \
            and any(c.start == 0 and c.tokens == tokens for c in chunks)

    def _admit(self, req: Request, tokens: list[int]) -> int:
        """Give ``req`` a row and its cached prefix; returns the positions the cache supplied."""
        req.row = self.memory.alloc_req()
        cached = self.cache.acquire(req.row, cacheable_tokens(req, tokens))  # prompt logprobs need logits
        if not req.output_ids:  # a first admission (not a recompute after retraction)
            req.cached_tokens = cached
        req.kv_len = req.kv_alloc = cached
        self.cached_prefill_tokens += cached
        return cached

    # ------------------------------------------------------------ prefill
    def _prefill(self, chunks: list[PrefillChunk]) -> None:
        """One EXTEND forward over every chunk; requests whose last chunk this is get their
        next token and start decoding."""
        device = self.device
        reqs = [c.req for c in chunks]
        starts, lens = [c.start for c in chunks], [c.length for c in chunks]
        rows_cpu = [r.row for r in reqs]
        self._make_room(self.memory.pages_needed(starts, lens))
        out_cache_loc = self.memory.alloc_extend(rows_cpu, starts, lens)
        for chunk in chunks:  # freed by _unadmit if this step fails
            chunk.req.kv_alloc = chunk.end
        columns = host_to_device(torch.tensor([rows_cpu, starts, lens], dtype=torch.int64), device)
        prompt_logprobs = PromptLogprobs.of(chunks)
        batch = ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            input_ids=torch.tensor([t for c in chunks for t in c.tokens[c.start:c.end]], dtype=torch.int64,
                                   device=device),
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
        # the token after each chunk: known inside a prompt, sampled after the last chunk
        next_known = [c.next_token for c in chunks]
        sampling = BatchSampling([c.req for c in chunks if c.is_last], device, self.generator, self.runner.vocab_size,
                                 prompt_logprobs=prompt_logprobs)
        if self.worker is not None:
            next_ids = self.worker.prefill(batch, sampling, next_tokens=next_known)
        else:
            logits = self.runner.forward(batch).next_token_logits
            if prompt_logprobs is not None:
                prompt_logprobs.record(logits)
                logits = logits[torch.tensor(lens, device=device).cumsum(0) - 1]
            next_ids = sample_after_prefill(logits, sampling, next_known)
        self.prefill_tokens += sum(lens)
        logprobs, sampled = sampling.take_logprobs(), 0  # rows of the sampled (last-chunk) requests
        for chunk, token in zip(chunks, next_ids.tolist()):
            req = chunk.req
            req.kv_len = req.kv_alloc = chunk.end
            if chunk.is_last:
                req.append([token], _logprobs_of(logprobs, sampled))
                sampled += 1
                self.running.append(req)
            self.cache.cache_request(req.row, fill_ids(req), req.kv_len)

    def _make_room(self, pages: int) -> None:
        if not self.cache.make_room(pages):
            raise RuntimeError(f"KV pool: {pages} pages needed, {self.cache.reclaimable_pages()} reclaimable "
                               "(admission should have prevented this)")

    # ------------------------------------------------------------ decode
    def _decode(self) -> list[Request]:
        batch = [r for r in self.running if not r.finished]
        finished = []
        if batch and not self.cache.make_room(self._decode_pages(batch, self.launched)):
            finished = self._read_launched()  # exact lengths, and the finished requests' KV back
            self._release_finished()
            batch = self._retract_until_room()
        if batch:
            self.new_token_ratio.decay()
        # NOTE: logits processors read a request's committed tokens (penalty counts, grammar
        # state), which an unread step would leave stale: such batches run without overlap
        if not self.overlap or any(r.params.needs_processing for r in batch):
            finished += self._read_launched()
            batch = [r for r in batch if not r.finished]
            if batch:
                self.launched = self._launch(batch, previous=None)
                finished += self._read_launched()
            return finished
        previous, self.launched = self.launched, None
        try:
            if batch:
                self.launched = self._launch(batch, previous)
        finally:  # the previous step's tokens are handed out even if this launch fails
            finished += self._apply(previous) if previous is not None else []
        return finished

    def _decode_pages(self, reqs: list[Request], previous: _Launched | None) -> int:
        """Fresh KV pages the next decode step of ``reqs`` may take: a whole draft tree past each
        request's length (plus, under overlap, what the unread step may add)."""
        growth = previous.growth if previous is not None else {}
        tokens = self.tree_tokens if self.worker is not None else 1
        if self.overlap:  # _reserve extends each request's reservation from kv_alloc
            ends = [r.kv_len + growth.get(id(r), 0) + tokens for r in reqs]
            starts = [r.kv_alloc for r in reqs]
            return self.memory.pages_needed(starts, [max(e - s, 0) for e, s in zip(ends, starts)])
        return self.memory.pages_needed([r.kv_len for r in reqs], [tokens] * len(reqs))

    def _retract_until_room(self) -> list[Request]:
        """Retract requests (the chunked one first, then ``retract_order``) until the next decode
        step fits; returns the requests left to decode. Nothing is in flight here."""
        batch = [r for r in self.running if not r.finished]
        while batch and not self.cache.make_room(self._decode_pages(batch, None)):
            if self.chunked is not None:
                victim, self.chunked = self.chunked, None
            elif len(batch) > 1:
                victim = retract_order(batch)[0]
                batch.remove(victim)
                self.running.remove(victim)
            else:
                raise RuntimeError("KV pool: one request's decode step does not fit (admission should have "
                                   "refused it)")
            self._release(victim)
            self.waiting.appendleft(victim)
            self.num_retracted += 1
            self.new_token_ratio.on_retract()
        return batch

    def _read_launched(self) -> list[Request]:
        launched, self.launched = self.launched, None
        return self._apply(launched) if launched is not None else []

    def _apply(self, launched: _Launched) -> list[Request]:
        """Read a launched step and hand its tokens to the requests; returns those it finished.
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
                req.append(tokens, _logprobs_of(logprobs, i))
                if req.finished:
                    finished.append(req)
        return finished

    def _launch(self, reqs: list[Request], previous: _Launched | None) -> _Launched:
        """Queue one decode step of ``reqs``: speculative and plain sub-batches as configured."""
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
        return _Launched(
            parts=parts,
            next_seq_lens=torch.cat([p.pending.next_seq_lens for p in parts]),
            next_tokens=torch.cat([p.pending.next_tokens for p in parts]),
            growth=growth,
        )

    def _launch_part(self, reqs: list[Request], previous: _Launched | None, speculative: bool) -> _Part:
        rows_cpu = [r.row for r in reqs]
        # the host knows the lengths unless the unread step speculated for one of these requests
        growth = previous.growth if previous is not None else {}
        exact = all(growth.get(id(r), 0) <= 1 for r in reqs)  # a plain step adds exactly one token
        seq_lens_cpu = [r.kv_len + growth.get(id(r), 0) for r in reqs] if exact else None
        rows, seq_lens, last = self._decode_inputs(reqs, previous)
        if self.overlap:
            # the step writes positions seq_len .. seq_len + tokens - 1, seq_len at most the
            # request's length before the unread step plus what that step may add
            tokens = self.tree_tokens if speculative else 1
            self._reserve(reqs, [r.kv_len + growth.get(id(r), 0) + tokens for r in reqs])
        sampling = BatchSampling(reqs, self.device, self.generator, self.runner.vocab_size)
        kw = dict(seq_lens_cpu=seq_lens_cpu, rows_cpu=rows_cpu)
        if self.worker is None:
            pending = self._launch_plain(rows, seq_lens, last, sampling, **kw)
        else:
            launch = self.worker.launch_decode if speculative else self.worker.launch_decode_plain
            pending = launch(rows, seq_lens, last, sampling, slots_reserved=self.overlap, **kw)
        return _Part(reqs, pending, speculative, sampling)

    def _reserve(self, reqs: list[Request], ends: list[int]) -> None:
        """Give positions up to ``ends`` (exclusive) of each request KV slots (overlap only)."""
        grow = [(r, end) for r, end in zip(reqs, ends) if end > r.kv_alloc]
        if not grow:
            return
        self.memory.alloc_extend([r.row for r, _ in grow], [r.kv_alloc for r, _ in grow],
                                 [end - r.kv_alloc for r, end in grow])
        for req, end in grow:
            req.kv_alloc = end

    def _decode_inputs(
        self, reqs: list[Request], previous: _Launched | None
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


def _logprobs_of(logprobs: StepLogprobs | None, i: int) -> tuple[list[float], list[list]] | None:
    return None if logprobs is None else (logprobs.token[i], logprobs.top[i])
