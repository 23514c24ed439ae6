"""NgramWorker: speculative decoding without a draft model (SGLang's ``--speculative-algorithm NGRAM``).

    prefill   target EXTEND -> sample the first token                    (no draft model, no draft KV)
    decode    plain or lookup, and the largest verify size (``policy.py``: served step times; or
              ``budget.py`` alone) -> each request's draft from n-gram matches in its own tokens:
              device lookups (``ngram.device_lookup``, the host's default): a chain of n - 1 tokens
                  from ``specdec.kernels.ngram_match`` over the token ids of the request's KV slots
                  (``slot_tokens``, written by every forward here), launched past the unread step
                  like a plain step, no host work but the launches;
              host lookups: a tree (``tree.py`` / ``batch.py``; short ones from ``cache.py``'s
                  finished requests, when on), the step's verify size the smallest holding the
                  largest tree, after reading the step before (below)
              -> target TARGET_VERIFY over bs x n nodes -> accept (greedy, or lossless sampling)
              -> move accepted K/V into place, free the rest;
              or, when no request has a match, one plain decode step

Verification is EAGLE's (``specdec.eagle.verify_step``): the drafter is deterministic, so its
draft probabilities are one-hot and tree sampling's target-only rule is exactly lossless (sibling
tokens are distinct by construction). A request whose lookup finds nothing drafts no node: its row
verifies only its root, which is a plain decode step for that request.

The host provides each request's tokens (``specdec.host.TokenHistory``) up to the last step it
read: what host lookups draft from, and where the choice looks each row's reach up. Under overlap
scheduling the next step is chosen before the step in flight is read (``needs_last_step_read``): a
plain step launches past it (it needs nothing of it), and so does a device lookup; a host lookup reads
it first. (Host lookups that ran ahead of it on a guess of its tokens were measured slower than reading
first, and device lookups made them moot: benchmarks/results/2026-11-29-h200-ngram-ahead.) Either way
the host has reserved the step's slots (``slots_reserved``, as for EAGLE). Each verify size replays the
host's target-verify CUDA graphs (``verify_graph_sizes``); the worker itself captures nothing.

Step times under that mixed pipeline (``LaunchClock``): a step's time runs from its choice to the
next step's choice, so a lookup's wait for the step before it is the lookup's cost, and a lookup
that finds nothing (``MISS``: it waited and looked up for a plain step) is timed as neither choice.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np
import torch

from specdec.config import SpecConfig
from specdec.eagle.output import (
    DecodeOutput,
    PendingDecode,
    copy_to_host_async,
    greedy_ids,
    pending_one_token,
    sample_next,
)
from specdec.eagle.tree import BuiltTree
from specdec.eagle.verify_step import TreeVerifier, commit_accepted_kv, target_verify
from specdec.eagle.worker import sample_after_prefill
from specdec.forward import CaptureHiddenMode, ForwardBatch, LogitsMode
from specdec.host import KVMemory, SamplingInfo, TargetModelRunner, TokenHistory, step_slots
from specdec.kernels import ngram_match, ngram_merge_buffer
from specdec.eagle.served import PLAIN, LaunchClock
from specdec.ngram.batch import BatchTrees, build_trees_batch, build_trees_ref, match_ends, pack_batch
from specdec.ngram.budget import DraftBudget
from specdec.ngram.cache import NgramCache, with_cache_drafts
from specdec.ngram.config import NgramConfig
from specdec.ngram.lookup import latest_longest_match_end
from specdec.ngram.policy import NgramPolicy, size_name
from specdec.ngram.tree import pack_trees

# a step the policy chose to look up for that found no match: it decodes plainly, but after the
# wait and the lookups of a lookup step, so its time is handed to the policy as neither choice
MISS = "lookup-miss"

# ``NgramWorker.force``: every step looks up with the largest verify size allowed (diagnostics: the
# policy's choice against always looking up)
LOOK_UP_EVERY_STEP = -1

# a choice looks up each row's reach (``NgramWorker._reach``) for at most about this many rows a step:
# a larger batch refreshes every bs / REACH_ROWS_PER_STEP steps and uses the last values between
# (CPU, 2026-11-29: the batch lookup of 32 rows of 1.5 k tokens 141 us, of 128 rows 500 us, against 8
# rows' 57 us)
REACH_ROWS_PER_STEP = 8

# from this batch size on, chains are looked up and trees packed for the whole batch at once
# (numpy over the batch); below it per request, where numpy's per-call cost is the larger one
# (CPU, 2026-11-29: 32 requests of 1.5 k tokens, pack 180 against 335 us; one request 140 against 18)
BATCH_PATH_MIN_BS = 8


class NgramWorker:
    # the hidden states its plain decode step asks for (the host captures its decode graphs so)
    decode_hidden = CaptureHiddenMode.NULL
    prefill_hidden = CaptureHiddenMode.NULL  # what the target's prefill captures (lookups need none)

    def __init__(
        self,
        config: SpecConfig,
        ngram: NgramConfig,
        target: TargetModelRunner,
        memory: KVMemory,
        history: TokenHistory,
        *,
        max_running_requests: int,
        generator: torch.Generator | None = None,
        learn_step_times: bool = True,
    ) -> None:
        """``config``: the shared speculative settings (N = ``ngram.num_draft_tokens`` nodes, depth
        N - 1, thresholds, batch-size threshold); ``ngram``: the drafter's own.
        ``learn_step_times``: with adaptive on, choose each step by served step times
        (``NgramPolicy``); under tensor parallelism rank 0 alone chooses so (``relay_choices``)."""
        self.config = config
        self.ngram = ngram
        self.target = target
        self.memory = memory
        self.history = history
        self.max_batch_size = max_running_requests
        self._max_reqs = memory.req_to_token.shape[0]
        self._learn_step_times = ngram.adaptive and learn_step_times
        # device lookups (``ngram.device_lookup``): the token id each KV slot holds (the padding slot
        # of CUDA-graph batches last), written by every forward of this worker, which
        # ``specdec.kernels.ngram_match`` reads each request's history from
        # (int64, as the token ids written: no cast kernel a write)
        self.slot_tokens = torch.zeros(memory.capacity + 1, dtype=torch.int64, device=memory.req_to_token.device) \
            if ngram.device_lookup else None
        # where a lookup's programs merge a long history's matches (``ngram_match``), kept idle between steps
        self._lookup_merge = ngram_merge_buffer(self._max_reqs, memory.req_to_token.device) \
            if ngram.device_lookup else None
        self._chains: dict[tuple[int, int], tuple[torch.Tensor, ...]] = {}  # (bs, n) -> a chain's constant fields
        # tensor parallelism (``relay_choices``): rank 0 sends each policy choice, the others receive it
        self._send: Callable[[str], None] | None = None
        self._receive: Callable[[], str] | None = None
        self._start_afresh()
        # one verifier per verify size n: its accepted path is at most n - 1 nodes deep
        self.verifiers = {
            n: TreeVerifier(dataclasses.replace(config, num_steps=n - 1, num_draft_tokens=n),
                            generator=generator, replay=None, simulate_seed=0)
            for n in self.budget.sizes
        }

    # ------------------------------------------------------------ CUDA graphs (the host's verify graphs)
    def verify_graph_sizes(self, batch_sizes: list[int]) -> dict[int, list[int]]:
        """The target's verify graphs to capture: each verify size at the batch sizes that may use it."""
        out = {n: [bs for bs in sorted(batch_sizes) if self.budget.node_cap(bs) >= n - 1] for n in self.budget.sizes}
        return {n: sizes for n, sizes in out.items() if sizes}

    def capture_cuda_graphs(self, **_) -> int:
        """Nothing of its own to capture (no draft model); returns 0 bytes."""
        return 0

    def release_cuda_graphs(self) -> None:
        pass

    def _start_afresh(self) -> None:
        """The drafter's state as at start: budgets, policy, cross-request cache, timing, reach."""
        ngram, max_reqs = self.ngram, self._max_reqs
        self.budget = DraftBudget(ngram, max_reqs)
        self.policy = NgramPolicy(ngram, self.budget.sizes, max_reqs) if self._learn_step_times else None
        self._clock = LaunchClock()
        self._reach_of = np.zeros(max_reqs, dtype=np.int64)  # [max_reqs] each row's last looked-up reach
        self._reach_age = 0  # choices since the last refresh
        # each row's shadow trial (``_observe_shadow_trials``): the token its latest match predicts next, and the
        # history position it predicts (-1: none pending)
        self._shadow_token = np.zeros(max_reqs, dtype=np.int64)
        self._shadow_at = np.full(max_reqs, -1, dtype=np.int64)
        # finished requests' windows, for rows whose own tokens draft less than their budget
        self.cache = NgramCache(capacity=ngram.cache_capacity, branch_length=ngram.cache_branch_length,
                                min_n=ngram.min_match_window, max_n=ngram.max_match_window) \
            if ngram.cache_capacity else None
        # the next step's choice made ahead of its launch (``needs_last_step_read``): its largest
        # verify size (0: plain) and when it was made
        self._choice: tuple[int, float] | None = None
        # a forced verify size: the warm-up's (``specdec.engine.ngram_setup.warm_up``: every step verifies
        # a chain of that many nodes, drafted from the history's tail); benchmarks' diagnostics: 0 every
        # step plain, LOOK_UP_EVERY_STEP every step looks up (the largest size allowed, no policy);
        # None: the policy's choice and lookups
        self.force: int | None = None

    def relay_choices(self, *, send: Callable[[str], None] | None = None,
                      receive: Callable[[], str] | None = None) -> None:
        """Tensor parallelism: every rank must take the same verify size each step, or their
        collectives diverge, and the policy's choice follows rank 0's clock. Relayed, rank 0's policy
        chooses and hands each choice (the largest verify size, "0": plain) to ``send``; every other
        rank drops its policy and takes the choices from ``receive``, in order, after the same history
        sync and reach lookup rank 0's choice made (their trees come from that history). Without a
        policy (adaptive off) there is nothing to relay: every rank sizes its steps alike."""
        if not self._learn_step_times:
            return
        self._send, self._receive = send, receive
        if receive is not None:
            self._learn_step_times, self.policy = False, None

    def forget_warm_up(self) -> None:
        """After ``specdec.engine.ngram_setup.warm_up``: everything the drafter learned forgotten (the
        warm-up's step times include Triton's compilation)."""
        self._start_afresh()

    # ------------------------------------------------------------ prefill
    def prefill(self, batch: ForwardBatch, sampling: SamplingInfo, *,
                next_tokens: list[int] | None = None) -> torch.Tensor:
        """Target EXTEND; returns the token after each request's new ones: [bs] (as ``EAGLEWorker.prefill``)."""
        out = self.target.forward(dataclasses.replace(batch, capture_hidden_mode=self.prefill_hidden,
                                                      slot_tokens=self.slot_tokens))
        extend_lens = batch.host_extend_lens()
        logits = out.next_token_logits
        if batch.logits_mode == LogitsMode.ALL:  # the host asked for every position (prompt logprobs)
            sampling.record_prompt_logprobs(logits, batch.input_ids, extend_lens)
            ends = torch.tensor(extend_lens, device=logits.device).cumsum(0) - 1
            logits = logits[ends]
        rows = batch.req_pool_indices.tolist()
        self.budget.reset(rows)
        if self.policy is not None:
            self.policy.reset(rows)
        self._reach_of[rows] = 0
        self._shadow_at[rows] = -1
        self._clock.reset()  # a prefill between two decode steps is not the first one's cost
        self._choice = None
        return sample_after_prefill(logits, sampling, next_tokens)

    def finish_request(self, tokens: list[int]) -> None:
        """A request left (its prompt + output ``tokens``): the cross-request cache keeps its windows."""
        if self.cache is not None:
            self.cache.insert(tokens)

    # ------------------------------------------------------------ decode
    def decode(self, req_pool_indices, seq_lens, verified_ids, sampling, **kw) -> DecodeOutput:
        return self.launch_decode(req_pool_indices, seq_lens, verified_ids, sampling, **kw).result()

    def needs_last_step_read(self, rows_cpu: list[int], *, in_flight: bool = True,
                             sync_history: Callable[[], None] | None = None) -> bool:
        """Choose the next decode step of ``rows_cpu`` now, before the step in flight is read: False
        where it may launch past that step (a plain step; a device lookup), True for a host lookup, which
        reads it first. The next ``launch_decode`` takes this choice.
        ``in_flight``: a step is in flight (False: none, the history may be complete);
        ``sync_history``: brings the history up to the tokens read so far (the host keeps it
        current only for lookups), called before the choice looks it up."""
        chosen_at = time.perf_counter()
        rows = np.asarray(rows_cpu, dtype=np.int64)
        device = self.slot_tokens is not None  # a device lookup drafts after the unread step, on the device
        size = self._choose(rows, in_flight=in_flight and not device, sync_history=_Once(sync_history))
        self._choice = (size, chosen_at)
        return size > 0 and not device

    def launch_decode(
        self,
        req_pool_indices: torch.Tensor,  # [bs]
        seq_lens: torch.Tensor,  # [bs] tokens in KV; the root is not
        verified_ids: torch.Tensor,  # [bs] the root: each request's last committed token
        sampling: SamplingInfo,
        *,
        seq_lens_cpu: list[int] | None = None,
        rows_cpu: list[int] | None = None,
        slots_reserved: bool = False,
    ) -> PendingDecode:
        """Draft, verify and commit one step, or decode plainly where lookups do not pay;
        ``result()`` reads it and frees the rejected slots (unless ``slots_reserved``: the host
        reserved positions seq_len .. seq_len + N - 1 and keeps them).
        NOTE: a host lookup reads the history: after the last step was read (``needs_last_step_read``)."""
        rows = np.asarray(rows_cpu if rows_cpu is not None else req_pool_indices.tolist(), dtype=np.int64)
        if self._choice is None:
            launched = time.perf_counter()  # the step's host work (the lookups) is part of its cost
            max_size = self._choose(rows)
        else:  # chosen ahead: the step's time runs from its choice (the wait for the last step its own)
            (max_size, launched), self._choice = self._choice, None
            max_size = min(max_size, self._max_size(len(rows)))  # the batch may have lost finished requests
        if self.slot_tokens is not None:
            return self._launch_device_lookup(req_pool_indices, seq_lens, verified_ids, sampling, max_size, rows,
                                              launched, seq_lens_cpu=seq_lens_cpu, slots_reserved=slots_reserved)
        plan = self._plan(rows, max_size)
        self._time_launch(size_name(plan[0]) if plan else MISS if max_size else PLAIN, len(rows), launched)
        guess = self._guess(plan[0] if plan else max_size, len(rows))
        if plan is None:
            if guess is not None:  # the policy looked up and found nothing: its guess realized 0 tokens
                self.policy.observe_outcome(guess[0], 0.0, miss=True)
                self.policy.observe_blind(np.zeros(int(guess[1].sum())))
            return self._launch_plain(req_pool_indices, seq_lens, verified_ids, sampling,
                                      seq_lens_cpu=seq_lens_cpu, rows_cpu=rows.tolist(), slots_reserved=slots_reserved)
        n, trees, drafted = plan
        lengths = self.history.num_tokens[rows]
        roots = self.history.token_ids[rows, lengths - 1].astype(np.int64)
        tree = device_tree(self._host_trees(trees, roots, n), n, verified_ids, seq_lens)
        return self._verify(req_pool_indices, seq_lens, sampling, tree, n, rows, guess, drafted=drafted,
                            seq_lens_cpu=seq_lens_cpu, slots_reserved=slots_reserved)

    def _launch_device_lookup(self, req_pool_indices, seq_lens, verified_ids, sampling, size: int, rows: np.ndarray,
                              launched: float, *, seq_lens_cpu, slots_reserved: bool) -> PendingDecode:
        """A lookup on the device (``ngram.device_lookup``): every request's chain of ``size - 1`` tokens after
        its history's longest latest match (``ngram_match``, the history up to the step before, read or
        not), verified as a chain of ``size`` nodes; or a plain step (``size`` 0)."""
        self._time_launch(size_name(size) if size else PLAIN, len(rows), launched)
        if not size:
            return self._launch_plain(req_pool_indices, seq_lens, verified_ids, sampling, seq_lens_cpu=seq_lens_cpu,
                                      rows_cpu=rows.tolist(), slots_reserved=slots_reserved)
        guess = self._guess(size, len(rows))
        bs = len(rows)
        chains = torch.empty(bs, size, dtype=torch.int64, device=seq_lens.device)  # [bs, size] root, draft
        draft_lens = torch.empty(bs, dtype=torch.int64, device=seq_lens.device)  # [bs]
        ngram_match(self.slot_tokens, self.memory.req_to_token, req_pool_indices, seq_lens, verified_ids, chains,
                    draft_lens, min_n=self.ngram.min_match_window, max_n=self.ngram.max_match_window,
                    merge=self._lookup_merge)
        tree = self._chain_tree(chains, seq_lens)
        return self._verify(req_pool_indices, seq_lens, sampling, tree, size, rows, guess, draft_lens=draft_lens,
                            seq_lens_cpu=seq_lens_cpu, slots_reserved=slots_reserved)

    def _chain_tree(
        self,
        chains: torch.Tensor,  # [bs, n] each request's root, then its draft
        seq_lens: torch.Tensor,  # [bs]
    ) -> BuiltTree:
        """Each request's chain as the tree EAGLE's verify takes (``device_tree``'s fields; all but the
        tokens and positions the same every step of a shape)."""
        bs, n = chains.shape
        if (bs, n) not in self._chains:
            device, depth = seq_lens.device, torch.arange(n, device=seq_lens.device)
            self._chains[(bs, n)] = (
                depth,
                # the mask: node i sees nodes j <= i
                torch.tril(torch.ones(n, n, dtype=torch.bool, device=device)).flatten().repeat(bs),
                torch.arange(bs * n, device=device).view(bs, n),
                torch.where(depth < n - 1, depth + 1, -1).repeat(bs, 1),  # next_token: the next node
                torch.full((bs, n), -1, dtype=torch.int64, device=device),  # no siblings
            )
        depth, mask, index, next_token, next_sibling = self._chains[(bs, n)]
        return BuiltTree(tree_mask=mask, positions=(seq_lens[:, None] + depth).flatten(), retrive_index=index,
                         retrive_next_token=next_token, retrive_next_sibling=next_sibling,
                         draft_tokens=chains.flatten())

    def _verify(self, req_pool_indices, seq_lens, sampling, tree: BuiltTree, n: int, rows: np.ndarray,
                guess: tuple[float, np.ndarray] | None, *, drafted: np.ndarray | None = None,
                draft_lens: torch.Tensor | None = None, seq_lens_cpu, slots_reserved: bool) -> PendingDecode:
        """Verify ``tree`` (``n`` nodes a request), commit the accepted K/V; ``result()`` reads it. Each row's
        drafted depth: ``drafted`` [bs] (host trees) or ``draft_lens`` [bs] (device, read with the step);
        ``guess``: the policy's and its blind rows (``_guess``), for its calibration."""
        tree_slots = step_slots(self.memory, req_pool_indices, seq_lens, n, seq_lens_cpu=seq_lens_cpu,
                                rows_cpu=rows.tolist(), reserved=slots_reserved)
        # (the tree's tokens recorded at their slots: accepted chain nodes stay in place)
        verified = target_verify(self.target, self.memory.req_to_token, req_pool_indices, seq_lens, seq_lens_cpu,
                                 tree, tree_slots, num_draft_tokens=n, slot_tokens=self.slot_tokens)
        logits = verified.next_token_logits  # [bs * n, vocab]
        if getattr(sampling, "needs_processing", False):  # penalties, logit_bias, grammar: per node
            logits = sampling.process(logits.float(), tree)
        result = self.verifiers[n](tree, logits, sampling, seq_lens, predicts=greedy_ids(verified, sampling))
        if self.config.topk > 1:  # a chain's accepted nodes are in place already (node t at seq_len + t)
            commit_accepted_kv(self.memory.req_to_token, self.target.kv_cache, req_pool_indices, seq_lens, result,
                               num_draft_tokens=n, topk=self.config.topk)
        bs = int(req_pool_indices.shape[0])
        chains = drafted is None or self.config.topk == 1  # (device lookups always draft chains)
        # a chain accepts its nodes in order: node t's prediction is committed token t
        nodes = None if chains else result.accept_index.clamp(min=0)  # [bs, n] accepted path, the root past k
        tokens = result.predicts.view(bs, n) if chains else result.predicts[nodes]  # [bs, n], padding past k
        if getattr(sampling, "top_logprobs_num", None) is not None:  # each token under its node's logits
            if chains:  # (a chain's predictions past its accepted path are -1)
                sampling.record_logprobs(logits.view(bs, n, -1), tokens.clamp(min=0))
            else:
                sampling.record_logprobs(logits[nodes], tokens)
        accept = result.accept_length  # [bs]
        next_tokens = tokens.gather(1, accept[:, None]).squeeze(1)  # [bs] the bonus token
        columns = [seq_lens[:, None], accept[:, None], tokens]
        if drafted is None:  # device drafts: their lengths come back with the step
            columns.append(draft_lens[:, None])
        host_view = copy_to_host_async(torch.cat(columns, 1))  # [bs, 2 + n (+ 1)]

        def read() -> DecodeOutput:
            host = host_view()
            old_lens, accepted = [r[0] for r in host], [r[1] for r in host]
            depth = drafted if drafted is not None else np.asarray([r[-1] for r in host], dtype=np.int64)
            new_lens = [s + k + 1 for s, k in zip(old_lens, accepted)]
            if not slots_reserved:
                self.memory.truncate(rows.tolist(), [s + n for s in old_lens], new_lens)
            if drafted is not None:  # host trees: the rows' node budgets (device chains draft n - 1 each)
                self.budget.observe(rows.tolist(), drafted.tolist(), accepted)
            if self.policy is not None:
                # NOTE: a device chain's padding (its root repeated) is accepted where the target repeats it
                self.policy.observe_accepts(rows, depth, np.minimum(accepted, depth))
                self._shadow_at[rows] = -1  # (this verify was the trial)
                if guess is not None:
                    got, blind = np.asarray(accepted, dtype=np.float64), guess[1]
                    self.policy.observe_outcome(guess[0], float(np.where(blind, 0.0, got).mean()))
                    self.policy.observe_blind(got[blind])
            return DecodeOutput(tokens=[r[2: 3 + k] for r, k in zip(host, accepted)], seq_lens=new_lens,
                                accept_lengths=accepted, shape=f"ngram{n}")

        return PendingDecode(seq_lens + accept + 1, next_tokens, read)

    def _guess(self, n: int, bs: int) -> tuple[float, np.ndarray] | None:
        """The policy's guess for a lookup of ``n`` nodes a request and its blind rows ([bs] bool), where it
        chose this step (None: forced, no policy, or plain)."""
        if self.policy is None or self.force is not None or not n:
            return None
        guessed, blind = self.policy.guess(n), self.policy.last_blind
        if guessed is None:
            return None
        return guessed, blind if len(blind) == bs else np.zeros(bs, dtype=bool)  # (the batch lost a request)

    def _max_size(self, bs: int) -> int:
        """The largest verify size (nodes a request, root included) allowed at ``bs``; 0: none."""
        cap = self.budget.node_cap(bs)
        return cap + 1 if cap else 0

    def _choose(self, rows: np.ndarray, *, in_flight: bool = False,
                sync_history: Callable[[], None] | None = None) -> int:
        """The largest verify size this step of ``rows`` may take (the policy's choice); 0: plain.
        ``in_flight``: the step before this one is not read yet (its tokens are not in the history);
        ``sync_history``: as for ``needs_last_step_read``."""
        max_size = self._max_size(len(rows))
        if self.force == LOOK_UP_EVERY_STEP:
            return max_size
        if self.force is not None:
            return min(self.force, max_size)
        if self.policy is not None and max_size:
            reach = None if self.cache is not None else self._reach(rows, sync_history)
            max_size = self.policy.choose(rows, len(rows), max_size, reach, in_flight)
            if self._send is not None:
                self._send(str(max_size))
        elif self._receive is not None and max_size:  # a tensor-parallel rank past 0: rank 0's choice
            if self.cache is None:
                self._reach(rows, sync_history)  # NOTE: the history synced as rank 0's choice synced it
            max_size = int(self._receive())
        elif self.slot_tokens is not None and max_size:  # device lookups without the policy: a match in the
            # history read so far fills the largest size (its repeat continued); no row with one: a plain step
            max_size = max_size if self._reach(rows, sync_history).any() else 0
        return max_size

    def _reach(self, rows: np.ndarray, sync_history: Callable[[], None] | None = None) -> np.ndarray:
        """[bs] each row's reach (``_look_up_reach``), looked up again for the whole batch when due
        (the history synced first, and the shadow trials it settles observed): every step up to
        REACH_ROWS_PER_STEP rows, every bs / REACH_ROWS_PER_STEP steps above (a row prefilled since
        reads 0 until then)."""
        self._reach_age += 1
        if self._reach_age * REACH_ROWS_PER_STEP >= len(rows):
            self._reach_age = 0
            if sync_history is not None:
                sync_history()
            if self.policy is not None:
                self._observe_shadow_trials(rows)
            self._reach_of[rows] = self._look_up_reach(rows)
        return self._reach_of[rows]

    def _look_up_reach(self, rows: np.ndarray) -> np.ndarray:
        """[bs] how many tokens a lookup would draft for each row, as the policy sees it: 0 without a match in
        the history as it stands (a chain lookup), else ``cap`` + 1, past the batch's node cap (a match's draft
        continues its repeat past the history's end, ``lookup.continuation``, so it fills any size, with a
        token to spare for a step in flight).
        With the policy, each matched row's first draft token becomes its shadow trial.
        NOTE: not capped at the row's own budget, which shrinks after rejections and grows only after
        lookups: the acceptance rate prices a poor row, and a span it starts copying is seen at once."""
        lengths = self.history.num_tokens[rows]  # NOTE: 0 for a request whose prefill is not read yet
        cap = self.budget.node_cap(len(rows))
        if int(lengths.max()) < 2 or cap == 0:
            return np.zeros(len(rows), dtype=np.int64)
        min_n, max_n = self.ngram.min_match_window, self.ngram.max_match_window
        if len(rows) < BATCH_PATH_MIN_BS:  # row by row in Python: numpy's per-call cost is the larger one here
            reach = []
            for row, length in zip(rows.tolist(), lengths.tolist()):
                tokens = self.history.token_ids[row, :length]
                end = latest_longest_match_end(tokens, min_n=min_n, max_n=max_n)
                if self.policy is not None:
                    self._shadow_at[row] = length if end >= 0 else -1
                    self._shadow_token[row] = tokens[end + 1] if end >= 0 else 0
                reach.append(cap + 1 if end >= 0 else 0)
            return np.asarray(reach, dtype=np.int64)
        history = self.history.token_ids[rows, : int(lengths.max())]  # [bs, longest]
        ends = match_ends(history, lengths, min_n=min_n, max_n=max_n)  # [bs], -1: no match
        found = ends >= 0
        if self.policy is not None:
            self._shadow_at[rows] = np.where(found, lengths, -1)
            self._shadow_token[rows] = history[np.arange(len(rows)), np.where(found, ends + 1, 0)]
        return np.where(found, cap + 1, 0)

    def _observe_shadow_trials(self, rows: np.ndarray) -> None:
        """Each row's acceptance rate learned on plain steps too: where the token its match predicted at the last
        reach lookup has been read since, and no verify of the row was read in between (which observed the
        row itself), that prediction counts as one verified draft token, accepted if the token is the one
        that came (the geometric model's trial). Without it a row's rate moves only on lookup steps, so a row
        whose rate fell while its text was new stayed on plain steps when copying began again (Spec-Bench
        summarization, SmolLM2-135M, at one request: 1.57x plain decoding without the trials, 1.78x with them,
        1.82x a lookup every step; ``benchmarks/ngram_policy_replay.py``, the H200's step times on CPU)."""
        if len(rows) < BATCH_PATH_MIN_BS:
            for row in rows.tolist():
                at = int(self._shadow_at[row])
                if 0 <= at < self.history.num_tokens[row]:
                    self.policy.observe_trial(row, bool(self.history.token_ids[row, at] == self._shadow_token[row]))
                    self._shadow_at[row] = -1
            return
        at = self._shadow_at[rows]
        due = (at >= 0) & (at < self.history.num_tokens[rows])
        if not due.any():
            return
        rows, at = rows[due], at[due]
        came = self.history.token_ids[rows, at].astype(np.int64) == self._shadow_token[rows]
        self.policy.observe_accepts(rows, np.ones(len(rows), dtype=np.int64), came.astype(np.int64))
        self._shadow_at[rows] = -1

    def _plan(self, rows: np.ndarray, max_size: int) -> tuple[int, BatchTrees, np.ndarray] | None:
        """This step's verify size n, the rows' trees and each one's drafted depth within n - 1
        nodes ([bs]), within ``max_size`` (0: plain); None: a plain step (the choice, or no match)."""
        if not max_size:
            return None
        bs = len(rows)
        limits = np.asarray(self.budget.limits(rows.tolist(), bs), dtype=np.int64)
        if self.force not in (None, LOOK_UP_EVERY_STEP):  # the warm-up: chains of max_size - 1 nodes, any tokens
            trees = self._tail_chains(rows, max_size - 1)
        else:
            lengths = self.history.num_tokens[rows]
            trees = self._trees(self.history.token_ids[rows, : int(lengths.max())], lengths, limits)
        depth = trees.cumulative_depth(self.ngram.num_draft_tokens)  # [bs, N]
        if self.policy is not None:
            self.policy.observe_drafts(rows, depth)
        largest = min(int(trees.sizes.max()), max_size - 1)
        if largest == 0:
            return None
        n = self.budget.step_size(largest)
        return n, trees, depth[:, n - 1]

    def _tail_chains(self, rows: np.ndarray, nodes: int) -> BatchTrees:
        """Each row's last ``nodes`` tokens as its draft chain (verification keeps any draft lossless)."""
        lengths = self.history.num_tokens[rows]
        positions = np.maximum(lengths[:, None] - nodes + np.arange(nodes), 0)  # [bs, nodes]
        tokens = self.history.token_ids[rows[:, None], positions].astype(np.int64)
        return BatchTrees(tokens, np.tile(np.arange(nodes), (len(rows), 1)), np.full(len(rows), nodes))

    def _trees(self, history: np.ndarray, lengths: np.ndarray, limits: np.ndarray) -> BatchTrees:
        """The rows' trees from ``history`` [bs, >= longest] of ``lengths`` [bs], at most ``limits`` [bs] nodes."""
        if self.ngram.is_chain and len(lengths) >= BATCH_PATH_MIN_BS:
            trees = build_trees_batch(history, lengths, self.ngram, limits)
        else:
            trees = build_trees_ref(history, lengths, self.ngram, limits)
        if self.cache is not None:
            trees = with_cache_drafts(trees, self.cache, history, lengths, limits)
        return trees

    def _host_trees(self, trees: BatchTrees, roots: np.ndarray, n: int) -> np.ndarray:
        """[bs, 4n + n*n] int64: tokens, depth, next_token, next_sibling and the mask, cut to n - 1 nodes."""
        bs = len(roots)
        if bs >= BATCH_PATH_MIN_BS:
            host = np.empty((bs, 4 * n + n * n), dtype=np.int64)
            pack_batch(trees, roots, n, out=host)
            return host
        packed = pack_trees(trees.cut(n - 1), roots.tolist(), n)
        return np.concatenate([packed.tokens, packed.depth, packed.next_token, packed.next_sibling,
                               packed.mask.reshape(bs, n * n)], axis=1)

    def _time_launch(self, name: str, bs: int, launched: float) -> None:
        """Hand the policy the last step's served time where ``LaunchClock`` may time it."""
        timed = self._clock.launch(name, bs, now=launched)
        if timed is not None and self.policy is not None and timed[0] != MISS:
            last_name, last_bs, _, ms = timed
            self.policy.observe_step(last_name, last_bs, ms)

    def decode_plain(self, req_pool_indices, seq_lens, verified_ids, sampling, **kw) -> DecodeOutput:
        return self.launch_decode_plain(req_pool_indices, seq_lens, verified_ids, sampling, **kw).result()

    def launch_decode_plain(self, *args, **kw) -> PendingDecode:
        """One target token per request, outside the policy (requests that do not speculate)."""
        self._clock.reset()
        return self._launch_plain(*args, **kw)

    def _launch_plain(
        self,
        req_pool_indices: torch.Tensor,  # [bs]
        seq_lens: torch.Tensor,  # [bs]
        verified_ids: torch.Tensor,  # [bs]
        sampling: SamplingInfo,
        *,
        seq_lens_cpu: list[int] | None = None,
        rows_cpu: list[int] | None = None,
        slots_reserved: bool = False,
    ) -> PendingDecode:
        """One target token per request (its DECODE graph replays); nothing of the drafter changes."""
        out_cache_loc = step_slots(self.memory, req_pool_indices, seq_lens, 1, seq_lens_cpu=seq_lens_cpu,
                                   rows_cpu=rows_cpu, reserved=slots_reserved)
        batch = ForwardBatch.decode(
            verified_ids, seq_lens, out_cache_loc, req_pool_indices,
            req_to_token=self.memory.req_to_token, kv_cache=self.target.kv_cache,
            attn_backend=self.target.attn_backend, capture_hidden_mode=self.decode_hidden, seq_lens_cpu=seq_lens_cpu,
            slot_tokens=self.slot_tokens,
        )
        next_ids = sample_next(self.target.forward(batch), sampling)  # [bs]
        return pending_one_token(seq_lens, next_ids, seq_lens_cpu)


def device_tree(
    host: np.ndarray,  # [bs, 4n + n*n] int64: tokens, depth, next_token, next_sibling, mask
    n: int,
    verified_ids: torch.Tensor,  # [bs] the roots
    seq_lens: torch.Tensor,  # [bs]
) -> BuiltTree:
    """The packed host trees on the device, in one copy: what ``build_tree`` gives EAGLE's verify
    (QLEN_ONLY mask [bs * n * n], positions seq_len + depth, local child / sibling links)."""
    bs = host.shape[0]
    staged = torch.from_numpy(host)
    if seq_lens.device.type == "cuda":  # NOTE: from pageable memory the copy would wait for the queued steps
        staged = staged.pin_memory()
    device = staged.to(seq_lens.device, non_blocking=True)
    tokens, depth, next_token, next_sibling = device[:, : 4 * n].view(bs, 4, n).unbind(1)  # [bs, n] each
    tokens = torch.cat([verified_ids[:, None].to(tokens.dtype), tokens[:, 1:]], 1)  # [bs, n] root from the device
    return BuiltTree(
        tree_mask=device[:, 4 * n:].flatten().bool(),
        positions=(seq_lens[:, None] + depth).flatten(),
        retrive_index=torch.arange(bs * n, device=seq_lens.device).view(bs, n),
        retrive_next_token=next_token.contiguous(),
        retrive_next_sibling=next_sibling.contiguous(),
        draft_tokens=tokens.flatten(),
    )


class _Once:
    """``fn()`` on the first call only (None: nothing): the history synced at most once a choice."""

    def __init__(self, fn: Callable[[], None] | None) -> None:
        self.fn = fn

    def __call__(self) -> None:
        if self.fn is not None:
            fn, self.fn = self.fn, None
            fn()
