"""Scheduler: continuous batching over the paged KV cache, with or without speculation.

Each ``step`` runs one batch: a prefill (chunks of newly admitted requests' prompts, less the
prefix the prefix cache supplies), or one decode step of every running request (plain: one token
each; EAGLE: k + 1 tokens each); with both pending the two alternate, so a long prompt stalls
decoding by at most one chunk (``specdec.engine.admission``), except that new requests wait to be
prefilled together while many others decode (``_prefill_turn``). Requests join and leave between
steps. Admission promises a request its prompt plus an estimate of its output; when a decode step
would not fit in the KV pool (free pages plus cached pages no request uses), the scheduler
retracts requests, least progress first, until it does: a retracted request's KV goes to the
prefix cache (or is freed) and it waits to be recomputed from its prompt and output so far.

Overlap scheduling (``overlap=True``): a decode step is launched from the previous step's
device-resident outputs (lengths, last tokens) *before* the host reads that step, so the device
never idles while the host reads, applies stop conditions and prepares the next step::

    host    launch t+1 | read t, apply | launch t+2 | read t+1, apply | ...
    device  ... step t | step t+1 .................| step t+2 ........

The KV slots such a step needs are reserved ahead (``specdec.engine.decode``). A request that
finishes in step t has already been launched in step t + 1: that step's tokens for it are dropped
and its KV is released once step t + 1 is read (an aborted request's likewise). A prefill reads
the step in flight first.

With ``--enable-decode-admission``, a prefill of one token a request (prompts the prefix cache holds but
for their last token) while requests decode is no step of its own: those requests join the next decode
step in a part of their own (``_joins_decode``, ``Request.fresh``), which computes that token as the
prefill would.

Files: this one owns the queues (waiting, running, the chunked request, the step in flight) and
each request's admission, release and retraction; ``specdec.engine.prefill`` runs a prefill
forward, ``specdec.engine.decode`` launches and reads decode steps, ``specdec.engine.admission``
holds the admission arithmetic.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any

import torch

from specdec.attention.base import ChunkRule
from specdec.engine.admission import KVPromise, NewTokenRatio, PrefillChunk, chunk_request, fill_ids, retract_order
from specdec.engine.decode import DecodeLauncher, LaunchedStep
from specdec.engine.memory import PagedKVMemory
from specdec.engine.model_runner import ModelRunner
from specdec.engine.prefill import Prefiller
from specdec.engine.prefix_cache import NoPrefixCache, RadixPrefixCache
from specdec.engine.prompt_logprobs import cacheable_tokens, wants_prompt_logprobs
from specdec.engine.request import FinishReason, Request


# a prompt this short is cheaper to prefill again than to wait a step for its twin's KV
TWIN_MIN_TOKENS = 32


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
        waiting_served_ratio: float = 0.0,
        max_waiting_tokens: int = 0,
        decode_admission: bool = False,
        tokenizer: Any = None,
        token_table=None,
        chunk_rule: ChunkRule = ChunkRule(),
    ) -> None:
        """``prefix_cache``: default none (``NoPrefixCache``); ``chunked_prefill_size``: most
        prompt tokens per prefill step (None: no limit); ``waiting_served_ratio`` and
        ``max_waiting_tokens``: while requests decode, new ones are prefilled once they number at
        least the ratio times the decoding ones, or once the oldest has waited that many decode
        steps (``_prefill_turn``; 0 and 0: at the first chance); ``decode_admission``: requests whose
        prompt is cached but for its last token join the decode step (``_joins_decode``);
        ``tokenizer``: decodes output tails for stop strings (``specdec.engine.stop_strings``);
        ``token_table``: the requests' tokens the n-gram worker drafts from
        (``specdec.engine.ngram_setup.TokenTable``); ``chunk_rule``: where a chunked prompt is cut (the
        attention backend's ``prefill_chunk_rule``), if a full chunk can always follow it: its chunks then
        take the bits of the prompt prefilled whole."""
        self.memory = memory
        self.tokenizer = tokenizer
        self.cache = prefix_cache if prefix_cache is not None else NoPrefixCache(memory)
        self.chunked_prefill_size = chunked_prefill_size
        full = chunked_prefill_size or float("inf")
        self.chunk_rule = chunk_rule if full >= 2 * chunk_rule.least + chunk_rule.align else ChunkRule()
        self.new_token_ratio = NewTokenRatio(schedule_conservativeness)
        self.waiting_served_ratio = waiting_served_ratio
        self.max_waiting_tokens = max_waiting_tokens
        self.decode_admission = decode_admission
        self._waited_steps = 0  # decode steps run since the oldest waiting request was queued
        self.max_running_requests = max_running_requests
        # KV positions a decode step may hold beyond the committed ones (a whole draft tree)
        self.tree_tokens = tree_tokens
        self.overlap = overlap
        # the n-gram worker's cross-request cache takes each leaving request's tokens
        self._on_release = getattr(worker, "finish_request", None)
        self.prefiller = Prefiller(runner, memory, worker=worker, generator=generator)
        self.decoder = DecodeLauncher(runner, memory, worker=worker, tree_tokens=tree_tokens, overlap=overlap,
                                      generator=generator, tokenizer=tokenizer, token_table=token_table)
        self.waiting: collections.deque[Request] = collections.deque()
        # admitted and not yet released (finished ones stay while a launched step still holds them)
        self.running: list[Request] = []
        # the admitted request whose prompt is partly prefilled (chunked prefill)
        self.chunked: Request | None = None
        self.launched: LaunchedStep | None = None
        self.promise = KVPromise(step_tokens=self.worst_case_tokens(0, 0))
        self._last_was_prefill = False
        self.num_retracted = 0
        self.prefill_tokens = 0  # prompt (and recomputed output) tokens computed by prefill
        self.prefill_steps = 0  # steps that ran a prefill (each pauses the decoding requests)
        self.fresh_admissions = 0  # requests whose one-token prefill joined a decode step

    # ------------------------------------------------------------ bookkeeping
    def worst_case_tokens(self, prompt_len: int, max_new_tokens: int) -> int:
        """KV slots a request may hold at once: prompt + outputs, the tokens of one more step
        (overlap launches a step before it knows the last one finished the request), one draft
        tree, and a page of rounding."""
        page = self.memory.page_size
        need = prompt_len + max_new_tokens + self.tree_tokens
        if self.overlap:
            need += self.decoder.max_step_tokens
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
    def spec_shape_steps(self) -> collections.Counter[str]:
        """Decode steps (sub-batches) by tree shape ("SxKxN"; "plain": no draft tree), speculative engines."""
        return self.decoder.spec_shape_steps

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.launched or self.chunked)

    def flush_cache(self) -> int:
        """Drop every cached KV page no request uses; returns the pages freed."""
        return self.cache.flush()

    def _release_finished(self) -> None:
        """Free the KV and rows of finished requests that no launched step still holds."""
        done = [r for r in self.running if r.finish_reason is not None]
        if not done:
            return
        held = {id(r) for r in self.launched.reqs} if self.launched else set()
        done = [r for r in done if id(r) not in held]
        for req in done:
            self._release(req)
        gone = {id(r) for r in done}
        self.running = [r for r in self.running if id(r) not in gone]

    def _release(self, req: Request) -> None:
        """Hand a leaving request's KV to the prefix cache (which frees what it does not keep)
        and free its row."""
        if self._on_release is not None and req.finish_reason is not None:
            self._on_release(list(req.prompt_ids) + list(req.output_ids))
        self.cache.release_request(req.row, fill_ids(req), req.kv_len, req.kv_alloc)
        self.memory.free_req(req.row)
        req.row = -1
        req.kv_len = req.kv_alloc = 0
        req.fresh = False  # (retracted before its step: prefilled again when readmitted)

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
        if chunks and self._joins_decode(chunks):
            self._admit_fresh(chunks)
            chunks = []
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
        if not self.waiting:
            self._waited_steps = 0
        elif not chunks:  # a decode step while requests wait
            self._waited_steps += 1
        self._release_finished()
        return finished

    @contextlib.contextmanager
    def admitting_at_once(self):
        """Within the block new requests are prefilled at the first chance (no admission wait): for
        measurements that prefill a batch and then time its decode steps (the adaptive start-up
        profile), whose token budgets count no waiting. NOTE: this scheduler's only: under tensor
        parallelism the profile runs on every rank before rank 0's scheduler is mirrored."""
        saved = self.waiting_served_ratio, self.max_waiting_tokens
        self.waiting_served_ratio, self.max_waiting_tokens = 0.0, 0
        try:
            yield
        finally:
            self.waiting_served_ratio, self.max_waiting_tokens = saved

    def _prefill_turn(self) -> bool:
        """Prefill when there is prefill work, alternating with decode steps while requests run;
        while they do, new requests wait until they are ``waiting_served_ratio`` of the decoding
        ones or the oldest has waited ``max_waiting_tokens`` decode steps (a chunked prompt goes
        on at once).

        NOTE: a prefill step costs the host several decode steps' time however few requests it
        admits (on the H200, SmolLM2-135M at 128 requests: 11-16 ms against 1.5-3.5 ms a decode
        step), and speculation, which finishes requests in fewer steps, prefilled ~2.3 requests a
        step: at 128 requests half the wall time went to prefill steps
        (benchmarks/results/2026-11-29-h200-admission/). TGI's router waits the same way (its
        ``--waiting-served-ratio``, ``--max-waiting-tokens``)."""
        if self.chunked is None and not self.waiting:
            return False
        decoding = sum(not r.finished for r in self.running)
        if not decoding:
            return True
        if self._last_was_prefill:
            return False
        return (self.chunked is not None or len(self.waiting) >= self.waiting_served_ratio * decoding
                or self._waited_steps >= self.max_waiting_tokens)

    # ------------------------------------------------------------ admission
    def _plan_prefill(self) -> list[PrefillChunk]:
        """This step's prefill chunks: the chunked request's next one, then newly admitted
        requests while the chunk budget, the request rows and the KV promise allow."""
        budget = self.chunked_prefill_size or float("inf")
        ratio = self.new_token_ratio.value
        decoding = [r for r in self.running if not r.finished]
        # NOTE: not ``not decoding``: under overlap a finished request keeps its KV until the step
        # launched with it is read, after this plan; an engine holding it is not idle
        idle = not self.running
        # KV tokens not yet promised to anyone: reclaimable pages less the running requests' futures
        room = self.cache.reclaimable_pages() * self.memory.page_size
        room -= sum(self.promise.future_tokens(r, ratio) for r in decoding)
        if self.chunked is not None:  # promised at its admission: the rest of its prompt and its output
            rest = len(fill_ids(self.chunked)) - self.chunked.kv_len
            room -= self.promise.admission_tokens(self.chunked, rest, ratio)
        chunks: list[PrefillChunk] = []
        if self.chunked is not None:
            req = self.chunked
            chunk = chunk_request(req, fill_ids(req), req.kv_len, budget, self.chunk_rule)
            if room < 0 and not idle:
                return []  # decode first: it may finish or release requests, or retract this one
            self.chunked = req if not chunk.is_last else None
            chunks.append(chunk)
            budget -= chunk.length
        while self.chunked is None and self.waiting and budget > 0 \
                and len(self.running) + len(chunks) < self.max_running_requests:
            req = self.waiting[0]
            tokens = fill_ids(req)
            if self._twin_in(chunks, tokens):
                break  # next step it takes the twin's KV from the prefix cache
            hit = self.cache.lookup(cacheable_tokens(req, tokens))
            # NOTE: ``room`` counts cached pages no request uses as reclaimable; once this request
            # locks its prefix they are not, so they are part of what it takes
            need = self.promise.admission_tokens(req, len(tokens) - hit.tokens, ratio) \
                + hit.unlocked_pages * self.memory.page_size
            if need > room and (chunks or not idle):
                break  # wait for KV (an idle engine admits anyway: a request alone always fits)
            if chunk_request(req, tokens, hit.tokens, budget, self.chunk_rule) is None:
                break  # the budget reaches no cut the rule allows: next step
            self.waiting.popleft()
            chunk = chunk_request(req, tokens, self._admit(req, tokens), budget, self.chunk_rule)
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
        return cached

    # ------------------------------------------------------------ prefill
    def _joins_decode(self, chunks: list[PrefillChunk]) -> bool:
        """Whether this step's prefill is one token a request, each its fill ids' last (the prefix
        cache, or the request's earlier chunks, hold the rest), with requests decoding and
        ``decode_admission`` on: then those requests join the decode step instead (``_admit_fresh``),
        which costs a plain step's part of it, not a step of its own that pauses every decoding
        request. Not for requests that want prompt logprobs (every prompt position's logits).
        NOTE: off by default: through the server on the H200 (SmolLM2, 8-128 requests) it removed the
        prefill steps (70-74 a pass at 8 requests) but left throughput unchanged within the passes'
        spread and the mean time to first token 2-24 ms longer (under overlap a joined request's first
        token is read a step later; what adds the rest at 64 requests is not known;
        benchmarks/results/2026-11-30-h200-fresh-admission)."""
        return (self.decode_admission and self.decoder.admits_fresh and any(not r.finished for r in self.running)
                and all(c.length == 1 and c.is_last and not wants_prompt_logprobs(c.req) for c in chunks))

    def _admit_fresh(self, chunks: list[PrefillChunk]) -> None:
        """Admitted requests (rows and cached prefixes given) that decode their last fill token in
        the next decode step (``Request.fresh``), as its prefill would."""
        for chunk in chunks:
            chunk.req.fresh = True
            self.running.append(chunk.req)
        self.prefill_tokens += len(chunks)
        self.fresh_admissions += len(chunks)

    def _prefill(self, chunks: list[PrefillChunk]) -> None:
        """One EXTEND forward over every chunk; requests whose last chunk this is get their
        next token and start decoding."""
        starts, lens = [c.start for c in chunks], [c.length for c in chunks]
        self._make_room(self.memory.pages_needed(starts, lens))
        out_cache_loc = self.memory.alloc_extend([c.req.row for c in chunks], starts, lens)
        for chunk in chunks:  # freed by _unadmit if this step fails
            chunk.req.kv_alloc = chunk.end
        next_ids, logprobs = self.prefiller.run(chunks, out_cache_loc)
        self.prefill_tokens += sum(lens)
        self.prefill_steps += 1
        sampled = 0  # rows of logprobs: the requests whose last chunk this is
        for chunk, token in zip(chunks, next_ids):
            req = chunk.req
            req.kv_len = req.kv_alloc = chunk.end
            if chunk.is_last:
                req.append([token], logprobs.of(sampled) if logprobs is not None else None,
                           tokenizer=self.tokenizer)
                sampled += 1
                self.running.append(req)
            self.cache.cache_request(req.row, fill_ids(req), req.kv_len)

    def _make_room(self, pages: int) -> None:
        if not self.cache.make_room(pages):
            raise RuntimeError(f"KV pool: {pages} pages needed, {self.cache.reclaimable_pages()} reclaimable "
                               "(admission should have prevented this)")

    # ------------------------------------------------------------ decode
    def _decode(self) -> list[Request]:
        batch = [r for r in self.running if r.finish_reason is None]
        finished = []
        if batch and not self.cache.make_room(self.decoder.pages_needed(batch, self.launched)):
            finished = self._read_launched()  # exact lengths, and the finished requests' KV back
            self._release_finished()
            batch = self._retract_until_room()
        if batch:
            self.new_token_ratio.decay()
        # NOTE: logits processors read a request's committed tokens (penalty counts, grammar
        # state), which an unread step would leave stale: such batches run without overlap. An
        # n-gram lookup drafted on the host reads the step in flight first and is then left in
        # flight itself
        sync = not self.overlap or self.decoder.needs_processing(batch)
        if sync or self.decoder.needs_read(batch, in_flight=self.launched is not None):
            finished += self._read_launched()
            batch = [r for r in batch if not r.finished]
            if batch:
                self.launched = self.decoder.launch(batch, previous=None)
            if sync:
                finished += self._read_launched()
            return finished
        previous, self.launched = self.launched, None
        try:
            if batch:
                self.launched = self.decoder.launch(batch, previous)
        finally:  # the previous step's tokens are handed out even if this launch fails
            finished += self.decoder.read(previous) if previous is not None else []
        return finished

    def _retract_until_room(self) -> list[Request]:
        """Retract requests (the chunked one first, then ``retract_order``) until the next decode
        step fits; returns the requests left to decode. Nothing is in flight here."""
        batch = [r for r in self.running if not r.finished]
        while batch and not self.cache.make_room(self.decoder.pages_needed(batch, None)):
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
        return self.decoder.read(launched) if launched is not None else []
