"""Decode steps of the reference host: queued on the device (``DecodeLauncher.launch``), read back
later (``DecodeLauncher.read``), so a scheduler may launch step t + 1 before it reads step t.

A step of ``reqs`` runs as at most three sub-batches (parts): the requests that speculate (an EAGLE
worker, ``params.speculative``, at most ``batch_size_threshold`` requests) verify a draft tree and
commit k + 1 tokens each; the others decode one target token each; and requests admitted into
this step (``Request.fresh``: their prompt's KV cached but for its last token, which a plain step
computes, as the prefill of that one token would, ``admits_fresh``) decode one token each in a part of
their own, from the host's values (they are not in the unread step).

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

from specdec.eagle.output import DecodeOutput, PendingDecode, pending_one_token, sample_next
from specdec.engine.batch_flags import BatchStatics, Memo
from specdec.engine.batch_sampling import BatchSampling
from specdec.engine.memory import PagedKVMemory, host_to_device
from specdec.engine.model_runner import ModelRunner
from specdec.engine.request import Request
from specdec.forward import ForwardBatch
from specdec.host import step_slots


# under overlap a request's reservation grows at least this many positions at a time (whole pages
# where a page is larger): each growth is an ``alloc_extend`` (numpy work, a host-to-device copy and
# an index_put), 0.29 ms of host time on an H200 machine's host when it ran every step (SmolLM2-135M,
# one request: its decode step was 1.27 ms).
RESERVE_CHUNK = 16
# ... and when one request's must grow, every request of the step whose reservation ends within this many
# positions of what the step may write grows with it, through this many past it: growths of many requests
# share one ``alloc_extend`` instead of one a step (at 32 requests an EAGLE-3 server ran 287 of them in
# 323 steps, 0.37 ms each under cProfile on an H200's host). A request holds at most RESERVE_AHEAD +
# RESERVE_CHUNK - 1 positions more than it needs (page size 1); a full pool falls back to exact ends.
RESERVE_AHEAD = 32


@dataclasses.dataclass
class DecodePart:
    """One launched sub-batch of a decode step: its requests and the worker's pending result."""

    reqs: list[Request]
    pending: PendingDecode
    sampling: BatchSampling


@dataclasses.dataclass(frozen=True)
class PartPlan:
    """One sub-batch of a step plan: its requests, whether they speculate, their sampling statics."""

    reqs: list[Request]
    speculative: bool
    statics: BatchStatics
    # where the part's requests start in the step's request order (``StepPlan.reqs``)
    offset: int
    # the most KV tokens a step of this part adds to each of its requests
    step_tokens: int
    # [bs] the requests' rows of req_to_token, on the host and (copied once per plan) on the device:
    # a request keeps its row while it runs
    rows: list[int]
    rows_device: torch.Tensor
    # requests admitted into this step (``Request.fresh``): inputs from the host, a plain step
    fresh: bool = False


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How a decode step of a given set of running requests is split and sampled. It depends only
    on what stays fixed while the requests run, so one plan serves every step until a request
    joins or leaves (``DecodeLauncher.plan``)."""

    parts: list[PartPlan]
    # the step's request order: the parts' requests one part after the other
    reqs: list[Request]
    # the most KV tokens the step may add to each request (by id), for slot reservation
    growth: dict[int, int]
    # some request runs logits processors (they read its committed tokens: no overlap)
    needs_processing: bool


@dataclasses.dataclass
class LaunchedStep:
    """A decode step queued on the device whose results the host has not read yet."""

    parts: list[DecodePart]
    # [len(reqs)] device tensors in ``reqs`` order: lengths and last tokens after the step
    next_seq_lens: torch.Tensor
    next_tokens: torch.Tensor
    plan: StepPlan

    @property
    def reqs(self) -> list[Request]:
        return self.plan.reqs

    @property
    def growth(self) -> dict[int, int]:
        return self.plan.growth


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
        self.last_shape: str | None = None  # the shape of the last step read (benchmarks name slow steps by it)
        # the step plan of the running requests, rebuilt only when they change
        self.plan: Memo[StepPlan] = Memo(self._plan)
        # n-gram drafting under overlap: whether the next launch's choice reads the last step
        # first (``needs_read``); None: not asked since the last launch
        self._read_first: bool | None = None

    # ------------------------------------------------------------ plan
    @property
    def admits_fresh(self) -> bool:
        """Whether a request whose prompt's KV is cached but for its last token may join a decode
        step (``Request.fresh``) instead of a prefill step: plain decoding, or a worker whose plain
        step does what such a prefill does (EAGLE's: ``plain_step_prefills``)."""
        return self.worker is None or getattr(self.worker, "plain_step_prefills", False)

    def _plan(self, reqs: list[Request]) -> StepPlan:
        """Split ``reqs`` into the requests that speculate (an EAGLE worker, ``params.speculative``,
        at most ``batch_size_threshold`` requests), the others, and the fresh ones, each part with
        its statics."""
        fresh = [r for r in reqs if r.fresh]
        running = [r for r in reqs if not r.fresh] if fresh else reqs
        if self.worker is None:
            groups = [(running, False)]
        else:
            threshold = self.worker.config.batch_size_threshold
            speculate = threshold is None or len(reqs) <= threshold
            spec = [r for r in running if speculate and r.params.speculative]
            plain = [r for r in running if not (speculate and r.params.speculative)]
            groups = [(spec, True), (plain, False)]
        parts, order, growth = [], [], {}
        for group, speculative, is_fresh in [(g, s, False) for g, s in groups] + [(fresh, False, True)]:
            if not group:
                continue
            step_tokens = self.max_step_tokens if speculative else 1
            rows = [r.row for r in group]
            rows_device = host_to_device(torch.tensor(rows, dtype=torch.int64), self.device)
            parts.append(PartPlan(group, speculative, BatchStatics(group), len(order), step_tokens, rows, rows_device,
                                  fresh=is_fresh))
            order += group
            growth.update((id(r), step_tokens) for r in group)
        return StepPlan(parts, order, growth, needs_processing=any(p.statics.flags.needs_processing for p in parts))

    def needs_processing(self, reqs: list[Request]) -> bool:
        """Whether a request of ``reqs`` runs logits processors (no overlap for such a step)."""
        return self.plan(reqs).needs_processing

    def needs_read(self, reqs: list[Request], *, in_flight: bool = True) -> bool:
        """Whether the next step of ``reqs`` must wait until the step in flight is read: an n-gram
        worker's host lookup drafts from the tokens it commits; its plain steps and device lookups
        need nothing of it on the host. NOTE: this makes the n-gram step's choice (once), which the
        next ``launch`` takes.
        ``in_flight``: whether a step is in flight (False: the host has every token)."""
        if self.token_table is None:
            return False
        spec = [part for part in self.plan(reqs).parts if part.speculative]
        if not spec:
            self._read_first = False
            return False
        part = spec[0]  # NOTE: the choice may look up the tokens read so far (its reach): synced on demand
        self._read_first = self.worker.needs_last_step_read(
            part.rows, in_flight=in_flight, sync_history=lambda: self.token_table.sync(part.reqs))
        return self._read_first

    # ------------------------------------------------------------ KV
    def pages_needed(self, reqs: list[Request], previous: LaunchedStep | None) -> int:
        """Fresh KV pages the next decode step of ``reqs`` may take: a whole draft tree past each
        request's length (plus, under overlap, what the unread ``previous`` step may add)."""
        tokens = self.tree_tokens if self.worker is not None else 1
        if not self.overlap:
            return self.memory.pages_needed([r.kv_len for r in reqs], [tokens] * len(reqs))
        plan = self.plan(reqs)
        starts, ends = [], []
        for part in plan.parts:  # (the pages are summed: the parts' order does not matter)
            starts += [r.kv_alloc for r in part.reqs]  # _reserve extends each reservation from kv_alloc
            ends += _grown_lens(part, plan, previous, extra=tokens)
        return self.memory.pages_needed(starts, [max(e - s, 0) for e, s in zip(ends, starts)])

    def _chunked(self, end: int) -> int:
        """A reservation's end grown to whole RESERVE_CHUNKs (or pages), within the context."""
        chunk = max(RESERVE_CHUNK, self.memory.page_size)
        return min(-(-end // chunk) * chunk, self.memory.max_context_len)

    def _reserve(self, reqs: list[Request], ends: list[int]) -> None:
        """Give positions up to ``ends`` (exclusive) of each request KV slots (overlap only): where one
        request's must grow, every request within RESERVE_AHEAD of its end grows through RESERVE_AHEAD past
        it, in RESERVE_CHUNKs, where the pool has the pages; else the requests that must grow, to whole
        chunks or, in a full pool, to their exact ends (``pages_needed`` counts the exact ends only, so a
        full pool still takes the step)."""
        due = [(r, end) for r, end in zip(reqs, ends) if end > r.kv_alloc]
        if not due:
            return
        ahead = [(r, self._chunked(end + RESERVE_AHEAD)) for r, end in zip(reqs, ends)]
        ahead = [(r, end) for r, end in ahead if end > r.kv_alloc]  # (a reservation at the context's end stays)
        chunked = [(r, self._chunked(end)) for r, end in due]
        # the first the pool can hold; the exact ends whatever it holds (``pages_needed`` counted them)
        grow = next((g for g in (ahead, chunked) if self.memory.can_alloc(*_growth(g)[1:])), due)
        self.memory.alloc_extend(*_growth(grow))
        for req, end in grow:
            req.kv_alloc = end

    # ------------------------------------------------------------ launch
    def launch(self, reqs: list[Request], previous: LaunchedStep | None) -> LaunchedStep:
        """Queue one decode step of ``reqs``, after the unread ``previous`` step (overlap) or
        after the host's values (None)."""
        plan = self.plan(reqs)
        parts = []
        for i, part in enumerate(plan.parts):
            launched = self._launch_part(part, plan, previous)
            if i + 1 < len(plan.parts):
                # NOTE: a part's tokens and lengths may be a graph's outputs (greedy ids), memory that the
                # next part's replay overwrites (the same graph at the same padded size; one memory pool)
                pending = launched.pending
                pending.next_tokens, pending.next_seq_lens = pending.next_tokens.clone(), pending.next_seq_lens.clone()
            parts.append(launched)
        if any(part.fresh for part in plan.parts):  # launched: from now on they decode as the others
            for req in reqs:
                req.fresh = False
            self.plan.clear()
        if len(parts) == 1:
            next_seq_lens, next_tokens = parts[0].pending.next_seq_lens, parts[0].pending.next_tokens
        else:
            next_seq_lens = torch.cat([p.pending.next_seq_lens for p in parts])
            next_tokens = torch.cat([p.pending.next_tokens for p in parts])
        return LaunchedStep(parts=parts, next_seq_lens=next_seq_lens, next_tokens=next_tokens, plan=plan)

    def _launch_part(self, part: PartPlan, plan: StepPlan, previous: LaunchedStep | None) -> DecodePart:
        reqs, speculative = part.reqs, part.speculative
        rows_cpu = part.rows
        # the host knows the lengths unless the unread step speculated for one of these requests
        seq_lens_cpu = _grown_lens(part, plan, previous) if _exact(part, plan, previous) else None
        rows, seq_lens, last = self._inputs(part, plan, previous)
        if self.overlap:
            # the step writes positions seq_len .. seq_len + tokens - 1, seq_len at most the
            # request's length before the unread step plus what that step may add
            tokens = self.tree_tokens if speculative else 1
            self._reserve(reqs, _grown_lens(part, plan, previous, extra=tokens))
        sampling = BatchSampling(reqs, self.device, self.generator, self.runner.vocab_size, statics=part.statics)
        if speculative and self.token_table is not None:
            if previous is None:
                self.token_table.sync(reqs)
            elif self._read_first is not False:  # NOTE: a host lookup must not launch past an unread step
                raise RuntimeError("an n-gram step launched past an unread step without a choice that may "
                                   "(needs_read)")
            self._read_first = None
        kw = dict(seq_lens_cpu=seq_lens_cpu, rows_cpu=rows_cpu)
        if self.worker is None:
            pending = self._launch_plain(rows, seq_lens, last, sampling, **kw)
        else:
            launch = self.worker.launch_decode if speculative else self.worker.launch_decode_plain
            pending = launch(rows, seq_lens, last, sampling, slots_reserved=self.overlap, **kw)
        return DecodePart(reqs, pending, sampling)

    def _inputs(
        self, part: PartPlan, plan: StepPlan, previous: LaunchedStep | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[bs] request rows, tokens in KV, and last committed tokens on the device: from the
        host's values (one copy), or the lengths and tokens from the unread ``previous`` step."""
        reqs = part.reqs
        if previous is None or part.fresh:  # (a fresh request is not in the unread step)
            columns = host_to_device(torch.tensor(
                [part.rows, [r.kv_len for r in reqs], [r.last_token for r in reqs]], dtype=torch.int64),
                self.device)
            return columns[0], columns[1], columns[2]
        if previous.plan is plan:  # the same requests in the same order: the part's own rows
            end = part.offset + len(reqs)
            return part.rows_device, previous.next_seq_lens[part.offset:end], previous.next_tokens[part.offset:end]
        where = {id(r): i for i, r in enumerate(previous.reqs)}
        index = [where[id(r)] for r in reqs]
        index = host_to_device(torch.tensor(index, dtype=torch.int64), self.device)
        return part.rows_device, previous.next_seq_lens[index], previous.next_tokens[index]

    def _launch_plain(self, rows, seq_lens, last, sampling: BatchSampling, *, seq_lens_cpu, rows_cpu) -> PendingDecode:
        """One target token per request (no speculation configured)."""
        out_cache_loc = step_slots(self.memory, rows, seq_lens, 1, seq_lens_cpu=seq_lens_cpu, rows_cpu=rows_cpu,
                                   reserved=self.overlap)  # under overlap reserved by _reserve
        batch = ForwardBatch.decode(
            last, seq_lens, out_cache_loc, rows,
            req_to_token=self.memory.req_to_token, kv_cache=self.runner.kv_cache,
            attn_backend=self.runner.attn_backend, seq_lens_cpu=seq_lens_cpu,
        )
        next_ids = sample_next(self.runner.forward(batch), sampling)  # [bs]
        return pending_one_token(seq_lens, next_ids, seq_lens_cpu)

    # ------------------------------------------------------------ read
    def read(self, launched: LaunchedStep) -> list[Request]:
        """Wait for a launched step and hand its tokens to the requests; returns those it finished.
        Requests that finished before (their step was launched ahead) ignore their tokens."""
        finished = []
        for part, planned in zip(launched.parts, launched.plan.parts):
            out: DecodeOutput = part.pending.result()
            # a verify step (adaptive speculation may decode plainly), and the tree shape to count;
            # a fresh part is its requests' prefill (one token each), counted as none
            verify, shape = out.shape is not None, out.shape or "plain"
            counted = self.worker is not None and not planned.fresh
            if counted:
                self.spec_shape_steps[shape] += 1
                self.last_shape = shape
            logprobs = part.sampling.take_logprobs()
            for i, (req, tokens, kv_len) in enumerate(zip(part.reqs, out.tokens, out.seq_lens)):
                if req.finish_reason is not None:  # finished before: this step ran ahead of it
                    continue
                req.kv_len = kv_len
                if verify:
                    req.spec_verify_ct += 1
                    req.accept_lengths.append(out.accept_lengths[i])
                if counted:
                    req.spec_shapes[shape] = req.spec_shapes.get(shape, 0) + 1
                req.append(tokens, logprobs.of(i) if logprobs is not None else None, tokenizer=self.tokenizer)
                if req.finish_reason is not None:
                    finished.append(req)
        return finished


def _grown_lens(part: PartPlan, plan: StepPlan, previous: LaunchedStep | None, *, extra: int = 0) -> list[int]:
    """Each request's KV length after the unread ``previous`` step at most (exact where that step
    added one token or none), plus ``extra``."""
    reqs = part.reqs
    if previous is None:
        return [r.kv_len + extra for r in reqs] if extra else [r.kv_len for r in reqs]
    if previous.plan is plan:  # the same parts: each request grew by at most its part's step_tokens
        add = part.step_tokens + extra
        return [r.kv_len + add for r in reqs]
    growth = previous.growth
    return [r.kv_len + growth.get(id(r), 0) + extra for r in reqs]


def _exact(part: PartPlan, plan: StepPlan, previous: LaunchedStep | None) -> bool:
    """Whether the host knows the part's lengths: no unread step, or one that added exactly one
    token to each of them (a plain step) or none."""
    if previous is None:
        return True
    if previous.plan is plan:
        return part.step_tokens <= 1
    growth = previous.growth
    return all(growth.get(id(r), 0) <= 1 for r in part.reqs)


def _growth(grow: list[tuple[Request, int]]) -> tuple[list[int], list[int], list[int]]:
    """(rows, starts, lengths) of ``alloc_extend`` taking each request's reservation to its new end."""
    return [r.row for r, _ in grow], [r.kv_alloc for r, _ in grow], [end - r.kv_alloc for r, end in grow]
