"""Benchmark only: acceptance replayed from a real draft head's recorded trees.

The hazards model (``specdec.eagle.acceptance``) gives every tree of one shape the same ranking:
it cannot show that the real draft grows a deep tree where it is sure and a wide one where it is
not, so it underrates trees (a 4-node tree of top-2 children commits 2.7 % more than the 4-node
chain with the SmolLM2 head on MT-bench; the model ranks that tree as the chain). A *trace* keeps
what the draft did instead. At every verify step of a run of a real head at a wide shape (S steps, top-K),
``TraceRecorder`` keeps:

    probs[t, 0, 0]      [K]   the root's top-K children's probabilities
    probs[t, d, s]      [K]   d >= 1: the top-K children of frontier slot s at depth d
    keys[t, d, j]             the frontier at depth d + 1: slot j is child c of slot s at depth d,
                              key s * K + c (keys[t, 0] = 0..K-1: depth 1 is the root's children)
    path_ranks[t, d]          the rank, among the children of the target's own path node at depth
                              d, of the token the target chose next (from the run's output); -1
                              where none of the K is, or where the recorded draft never expanded
                              that node
    recorded[t]               the draft tokens the recorded run accepted there (a replay's check)

``DraftReplay`` plays a trace row to a synthetic draft of any shape (S', K', N) with S' <= S and
K' <= K: the draft scores its frontier's children with the recorded probabilities (the children of
a node the recording never expanded score 0), grows and cuts its tree as the real draft would, and
the verify accepts along the recorded path ranks (``specdec.kernels.simulate_target_predict`` with
a 0/1 cdf per request). A request's k-th verify step replays the row its (seed, batch row, k) hashes
to, so every policy's k-th step of a request replays the same row: two shapes are compared on the
same rows, step for step. (Keyed by position, as until 2026-11-29, each shape drew its own rows: over
the 300 tokens a request commits in a point of ``--decode-steps 300``, the ratio of 5x1x6's committed
tokens a step to 3x1x4's scattered by 8.9 % (one standard deviation) where paired rows give 3.5 %;
over 1,000 tokens 5.0 % against 2.0 %.) ``expected_committed`` runs the same
replay over every row of a trace on the host: what a shape commits a step on the recorded text.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from specdec.kernels.replay import replay_accept_cdf, replay_advance, replay_root, replay_rows

ROW_HASH_SIZE = 1 << 16

TRACE_FORMAT = 1


@dataclasses.dataclass
class DraftTrace:
    probs: np.ndarray  # [T, S, K, K] float16, see the module docstring
    keys: np.ndarray  # [T, S, K] int16
    path_ranks: np.ndarray  # [T, S] int8
    protocol: dict = dataclasses.field(default_factory=dict)
    # [T] int8 the draft tokens the recorded run accepted at each row (-1: unknown), for checking a replay
    recorded: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return self.probs.shape[1]

    @property
    def topk(self) -> int:
        return self.probs.shape[2]

    def __len__(self) -> int:
        return self.probs.shape[0]

    def save(self, path: str | Path) -> None:
        recorded = self.recorded if self.recorded is not None else np.full(len(self), -1, dtype=np.int8)
        np.savez_compressed(path, probs=self.probs, keys=self.keys, path_ranks=self.path_ranks, recorded=recorded,
                            protocol=np.array(json.dumps({"format": TRACE_FORMAT, **self.protocol})))

    @classmethod
    def load(cls, path: str | Path) -> "DraftTrace":
        with np.load(path) as f:
            protocol = json.loads(str(f["protocol"]))
            if protocol.get("format") != TRACE_FORMAT:
                raise ValueError(f"{path}: draft trace format {protocol.get('format')}, expected {TRACE_FORMAT}")
            trace = cls(f["probs"], f["keys"], f["path_ranks"], protocol, f["recorded"])
        t, s, k, k2 = trace.probs.shape
        if (k2 != k or trace.keys.shape != (t, s, k) or trace.path_ranks.shape != (t, s) or t == 0
                or trace.recorded.shape != (t,)):
            raise ValueError(f"{path}: inconsistent draft trace shapes {trace.probs.shape}, {trace.keys.shape}, "
                             f"{trace.path_ranks.shape}, {trace.recorded.shape}")
        return trace

    def expected_committed(self, num_steps: int, topk: int, num_draft_tokens: int) -> float:
        """Mean tokens a verify step commits (accepted + 1) at this shape, over every recorded row."""
        accepted = replay_accept_lengths(self._host_replay, torch.arange(len(self)), num_steps, topk,
                                         num_draft_tokens)
        return float(accepted.double().mean()) + 1.0

    @functools.cached_property
    def _host_replay(self) -> "DraftReplay":
        return DraftReplay(self, torch.device("cpu"))


@functools.lru_cache(maxsize=4)
def load_replay(path: str, device: torch.device) -> "DraftReplay":
    """The trace at ``path`` on ``device``, loaded once for every worker (adaptive shapes share it)."""
    return DraftReplay(DraftTrace.load(path), device)


class DraftReplay:
    """A trace on a device, and the steps a synthetic draft and verify take to replay it.

    A node the recording never expanded sits in slot K, a sentinel whose children have probability 0
    and lead to slot K again. The tables are ``specdec.kernels.replay``'s, so each draft step costs
    one launch (inside the draft loop's CUDA graph) and the verify's accept cdf two.
    """

    def __init__(self, trace: DraftTrace, device: torch.device) -> None:
        self.trace = trace
        t, s, k, _ = trace.probs.shape
        probs = np.zeros((t, s, k + 1, k), dtype=np.float32)  # [T, S, K + 1, K]
        probs[:, :, :k] = trace.probs
        # next_slot[t, d, slot, c]: the slot at depth d + 1 of child c of ``slot`` at depth d (K: none)
        next_slot = np.full((t, s, k + 1, k), k, dtype=np.int64)
        rows, depths, slots = np.nonzero(trace.keys >= 0)
        key = trace.keys[rows, depths, slots].astype(np.int64)
        next_slot[rows, depths, key // k, key % k] = slots
        self.probs = torch.from_numpy(probs).to(device)
        self.next_slot = torch.from_numpy(next_slot).to(device)
        self.path_ranks = torch.from_numpy(trace.path_ranks.astype(np.int64)).to(device)  # [T, S]
        # the trace row of each 16-bit hash of (seed, batch row, position): a fixed random table
        gen = torch.Generator().manual_seed(0x5EED)
        self.row_table = torch.randint(len(trace), (ROW_HASH_SIZE,), generator=gen).to(device)

    def check_shape(self, num_steps: int, topk: int) -> None:
        if num_steps > self.trace.num_steps or topk > self.trace.topk:
            raise ValueError(f"a draft trace of {self.trace.num_steps} steps and top-{self.trace.topk} cannot "
                             f"replay {num_steps} steps of top-{topk}")

    def rows(self, keys: torch.Tensor, seed: int) -> torch.Tensor:  # [bs] -> [bs] int64
        """The trace row each request replays: a fixed random table at a 16-bit hash of (seed, batch
        row, its key: the request's verify steps so far) (``specdec.kernels.replay_rows``; one launch,
        in the verify's eager step as in the draft's graph)."""
        rows = torch.empty_like(keys)
        replay_rows(keys, self.row_table, rows, seed=seed)
        return rows

    def root(self, rows: torch.Tensor, k: int, *, children: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The root's top-k children's probabilities [bs, k], the depth-1 frontier's recorded slots
        [bs, k] and (``children``) that frontier's children's probabilities [bs*k, k]."""
        bs, device = rows.shape[0], rows.device
        root_p = torch.empty(bs, k, dtype=torch.float32, device=device)
        slots = torch.empty(bs, k, dtype=torch.int64, device=device)
        child_p = torch.empty(bs * k, k, dtype=torch.float32, device=device) if children else None
        replay_root(rows, self.probs, self.next_slot, root_p, slots, child_p)
        return root_p, slots, child_p

    def advance(self, rows: torch.Tensor, slots: torch.Tensor, parents: torch.Tensor, depth: int, k: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The depth + 1 frontier's recorded slots [bs, k] and its children's probabilities [bs*k, k]:
        its nodes are ``parents`` [bs, k], the frontier ``select_top_k_tokens(depth, ...)`` chose
        (``tree_info[2]``: score indices from k + (depth - 1) * k * k) among the children of the
        depth-``depth`` frontier at ``slots``."""
        new_slots = torch.empty_like(slots)
        child_p = torch.empty(slots.shape[0] * k, k, dtype=torch.float32, device=slots.device)
        replay_advance(rows, slots, parents, self.probs, self.next_slot, new_slots, child_p, depth=depth,
                       parent_offset=k + (depth - 1) * k * k)
        return new_slots, child_p

    def accept_cdf(self, rows: torch.Tensor, num_steps: int, k: int) -> torch.Tensor:
        """[bs, S' + 1, 1, k] fp32 the 0/1 cdf of the child rank each depth's node accepts (step at
        the recorded path rank; all 0, no child, where it is -1 or past k and at the leaves)."""
        cdf = torch.empty(rows.shape[0], num_steps + 1, 1, k, dtype=torch.float32, device=rows.device)
        replay_accept_cdf(rows, self.path_ranks, cdf)
        return cdf


def replay_accept_lengths(replay: DraftReplay, rows: torch.Tensor, num_steps: int, topk: int,
                          num_draft_tokens: int) -> torch.Tensor:
    """[bs] draft tokens a verify accepts when each row of ``rows`` is replayed at (S, K, N), on the host:
    the synthetic draft's frontier selection and node choice over the recorded probabilities, then
    the recorded path's depth within the kept nodes (the engine's simulated verify walks its built
    tree to the same node; tests/eagle/test_replay.py checks one against the other)."""
    from specdec.eagle.tree import organize_draft_results, select_top_k_tokens

    replay.check_shape(num_steps, topk)
    bs, k = rows.shape[0], topk
    hidden = torch.zeros(bs, 1)
    probs, slots, child_p = replay.root(rows, k, children=num_steps > 1)
    rank = torch.arange(k)
    tokens = rank.expand(bs, k).contiguous()  # the proposals' tokens: unused, any ids
    sel = select_top_k_tokens(0, probs, tokens, hidden, None, k)
    on_path = rank == replay.path_ranks[rows, :1]  # [bs, K] the frontier node on the target's path
    scores, toks, parents, paths = [sel.tree_info[0]], [sel.tree_info[1]], [sel.tree_info[2]], [on_path]
    for step in range(1, num_steps):
        tokens = torch.zeros(bs * k, k, dtype=torch.int64)
        sel = select_top_k_tokens(step, child_p, tokens, sel.hidden_states, sel.scores, k)  # child_p [bs*K, K]
        child_on_path = on_path[:, :, None] & (rank == replay.path_ranks[rows, step, None, None])  # [bs, K, K]
        on_path = child_on_path.flatten(1).gather(1, sel.parent_branch * k + sel.tree_info[2] % k)  # [bs, K]
        if step + 1 < num_steps:
            slots, child_p = replay.advance(rows, slots, sel.tree_info[2], step, k)
        for out, item in zip((scores, toks, parents, paths), (*sel.tree_info, child_on_path.flatten(1))):
            out.append(item)
    _, kept, _ = organize_draft_results(scores, toks, parents, num_draft_tokens)  # [bs, N-1] score indices
    path = torch.cat(paths, 1).gather(1, kept)  # [bs, N-1] kept nodes on the path
    depth = torch.cat([torch.full((k,), 1)] + [torch.full((k * k,), d + 1) for d in range(1, num_steps)])[kept]
    reached = torch.stack([(path & (depth == d)).any(1) for d in range(1, num_steps + 1)], 1)  # [bs, S]
    return reached.long().cumprod(1).sum(1)


class TraceRecorder:
    """Records a ``DraftTrace`` from a real head's run: set it as the ``DraftRunner.observer`` of the
    worker of the recording shape (eager steps: the observer reads the draft's lists on the host),
    run the requests to the end, then ``finish`` with each request's tokens.

    ``owners`` maps the request-pool rows of an expansion to their requests (any objects; the host
    may reuse a row once its request ends)."""

    def __init__(self, owners: Callable[[list[int]], list[object]]) -> None:
        self.owners = owners
        self._steps: list[tuple] = []  # (requests, seq_lens, probs, keys, child tokens) per expansion

    def __call__(self, score_list: list[torch.Tensor], token_list: list[torch.Tensor],
                 parents_list: list[torch.Tensor], req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
        """One draft expansion's lists (``DraftRunner.expand``): scores [bs, 1, K] then [bs, K, K],
        tokens [bs, K] then [bs, K*K], frontier score indices [bs, K + 1] then [bs, K]."""
        bs, k = token_list[0].shape
        s = len(score_list)
        probs = torch.zeros(bs, s, k, k)
        tokens = torch.full((bs, s, k, k), -1, dtype=torch.int64)
        keys = torch.full((bs, s, k), -1, dtype=torch.int64)
        probs[:, 0, 0] = score_list[0][:, 0].float().cpu()
        tokens[:, 0, 0] = token_list[0].cpu()
        keys[:, 0] = torch.arange(k)
        frontier = score_list[0][:, 0].float().cpu()  # [bs, K] the depth-1 frontier's scores
        for i in range(1, s):
            scores = score_list[i].float().cpu()  # [bs, K, K] cumulative, children of the depth-i frontier
            probs[:, i] = scores / frontier[..., None].clamp(min=torch.finfo(torch.float32).tiny)
            tokens[:, i] = token_list[i].cpu().view(bs, k, k)
            keys[:, i] = parents_list[i][:, -k:].cpu() - (k + (i - 1) * k * k)  # branch * K + child rank
            frontier = scores.flatten(1).gather(1, keys[:, i])
        self._steps.append((self.owners(req_pool_indices.tolist()), seq_lens.tolist(), probs.numpy(),
                            keys.numpy(), tokens.numpy()))

    def finish(self, tokens_of: Callable[[object], list[int]], protocol: dict) -> DraftTrace:
        """The trace, each expansion's path ranks read from its request's tokens at the end of the
        run (``tokens_of(request)``: prompt then output, position by position). Expansions less than
        S + 1 tokens before their output's end are left out, whatever their path: what the target
        wanted past the end is unknown, and keeping those whose path ended earlier would keep the
        short paths of the ends and drop the long ones."""
        lens: dict[int, list[int]] = {}  # each request's expansions' lengths, in order
        for requests, seq_lens, *_ in self._steps:
            for req, seq_len in zip(requests, seq_lens):
                lens.setdefault(id(req), []).append(seq_len)
        probs, keys, paths, recorded = [], [], [], []
        for requests, seq_lens, step_probs, step_keys, step_tokens in self._steps:
            s = step_keys.shape[1]
            for b, (req, seq_len) in enumerate(zip(requests, seq_lens)):
                tokens = tokens_of(req)
                if seq_len + s >= len(tokens):
                    continue
                paths.append(_path_ranks(tokens, seq_len, step_tokens[b], step_keys[b]))
                later = [n for n in lens[id(req)] if n > seq_len]
                recorded.append(min(later) - seq_len - 1 if later else -1)
                probs.append(step_probs[b])
                keys.append(step_keys[b])
        return DraftTrace(np.stack(probs).astype(np.float16), np.stack(keys).astype(np.int16),
                          np.asarray(paths, dtype=np.int8), protocol, np.asarray(recorded, dtype=np.int8))


def _path_ranks(tokens: list[int], seq_len: int, children: np.ndarray, keys: np.ndarray) -> list[int]:
    """[S] the rank of the target's next token among the children of its path node at each depth
    (``tokens[seq_len]`` is the root, ``tokens`` reach past seq_len + S; children [S, K, K] tokens by
    depth and frontier slot, keys [S, K]), -1 from the first depth where none of them is it or the
    node was never expanded."""
    s, k = keys.shape
    ranks, slot = [-1] * s, 0
    for d in range(s):
        if slot < 0:
            break
        hit = np.flatnonzero(children[d, slot] == tokens[seq_len + d + 1])
        if not hit.size:
            break
        ranks[d] = int(hit[0])
        found = np.flatnonzero(keys[d] == slot * k + ranks[d])  # the path node's slot at depth d + 1
        slot = int(found[0]) if found.size else -1
    return ranks
