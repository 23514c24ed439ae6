"""AdaptiveEAGLEWorker: each decode step speculates with the tree shape that commits the most tokens
per second at this batch size and context, or not at all.

One ``EAGLEWorker`` per candidate shape (``policy.candidate_shapes``: chains and the configured tree,
all within the configured (S, K, N)), over one shared draft memory (``DraftResources``: the draft
KV cache with a scratch area for the largest shape, and each request's root expansion kept at the
largest topk). Every step, whatever its shape, ends with the same draft extend over the committed
tokens, so the draft KV and root state are current for any shape, or for a plain step, next.
Greedy and sampled output stay lossless whatever the choice: each shape's step is an ordinary
lossless speculative step, and a plain step is an ordinary decode step.

Each shape's verify and draft-loop CUDA graphs are captured only at the batch sizes whose verify
has at most ``max_verify_rows`` rows (``policy.graph_batch_sizes``), and the policy chooses a shape
only there (``max_batch``): larger trees at large batches never pay and their graphs' logits would
hold gigabytes. Each shape's draft extend is captured at every size, and so is the plain steps'
one-token draft extend, once: plain steps run on ``base``.

The policy (``AdaptivePolicy``) needs step costs, measured at start-up by the host
(``specdec.engine.spec_profile``); until it has them, ``force`` decides (default: the configured
shape). The worker presents the host contract of ``EAGLEWorker`` (``prefill``, ``launch_decode``,
``launch_decode_plain``, ``capture_cuda_graphs``, ``release_cuda_graphs``), with ``config`` the
configured bound.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from specdec.config import SpecConfig
from specdec.eagle.output import DecodeOutput, PendingDecode
from specdec.eagle.policy import (
    MAX_VERIFY_ROWS, PLAIN, AdaptivePolicy, SpecShape, candidate_shapes, graph_batch_sizes,
)
from specdec.eagle.served import LaunchClock
from specdec.eagle.state import DraftResources
from specdec.eagle.timing import PhaseTimer
from specdec.eagle.worker import EAGLEWorker
from specdec.forward import ForwardBatch
from specdec.host import KVMemory, SamplingInfo, TargetModelRunner

AUTO = "auto"


class AdaptiveEAGLEWorker:
    def __init__(
        self,
        config: SpecConfig,
        target: TargetModelRunner,
        memory: KVMemory,
        draft_model: torch.nn.Module,
        *,
        attention_backend: str,
        max_running_requests: int,
        generator: torch.Generator | None = None,
        shapes: list[SpecShape] | None = None,
        max_verify_rows: int | None = MAX_VERIFY_ROWS,
    ) -> None:
        """``max_verify_rows``: a shape's graphs and choice stop at the batch sizes whose verify
        has more rows (None or 0: every size)."""
        self.config = config
        self.shapes = shapes or candidate_shapes(config)
        if max_verify_rows is not None and max_verify_rows < 0:
            raise ValueError(f"--speculative-adaptive-max-verify-rows={max_verify_rows}: expected >= 0")
        self.max_verify_rows = max_verify_rows
        # the largest batch size each shape (by name) has graphs for and may be chosen at (absent: any);
        # filled at capture, emptied at release, read by the policy (the same dict)
        self.max_batch: dict[str, int] = {}
        if any(s.num_steps > config.num_steps or s.topk > config.topk or s.num_draft_tokens > config.num_draft_tokens
               for s in self.shapes):
            raise ValueError(f"adaptive shapes {[s.name for s in self.shapes]} exceed the configured "
                             f"({config.num_steps}, {config.topk}, {config.num_draft_tokens})")
        resources = DraftResources.build(draft_model, memory, max_running_requests=max_running_requests,
                                         num_steps=config.num_steps, topk=config.topk,
                                         kv_cache_dtype=config.draft_kv_cache_dtype)
        self.resources = resources  # the draft memory every shape shares
        self.workers = {
            shape: EAGLEWorker(
                _shape_config(config, shape),
                target, memory, draft_model, attention_backend=attention_backend,
                max_running_requests=max_running_requests, generator=generator, resources=resources,
                observe_paths=True)
            for shape in self.shapes
        }
        self.configured = SpecShape(config.num_steps, config.topk, config.num_draft_tokens)
        # any worker prefills and decodes plainly: they share the draft memory and its extend
        self.base = self.workers.get(self.configured) or next(iter(self.workers.values()))
        self.max_batch_size = max_running_requests
        self.policy: AdaptivePolicy | None = None
        # with no policy, or to measure one shape: a SpecShape, None (plain steps), or AUTO
        self.force: SpecShape | None | str = AUTO
        self._context = 0.0  # mean tokens in KV of the last read step (lengths unread under overlap)
        self._timer: PhaseTimer | None = None
        # the decode steps launched through the policy, timed from one launch to the next
        self._clock = LaunchClock()
        # tensor parallelism (``relay_choices``): rank 0 sends each policy choice, the others receive it
        self._send: Callable[[str], None] | None = None
        self._receive: Callable[[], str] | None = None
        self._by_name = {shape.name: shape for shape in self.shapes}

    def graph_sizes(self, shape: SpecShape, batch_sizes: list[int]) -> list[int]:
        """The batch sizes ``shape``'s verify and draft loop are captured at."""
        return graph_batch_sizes(shape, batch_sizes, self.max_verify_rows)

    def verify_graph_sizes(self, batch_sizes: list[int]) -> dict[int, list[int]]:
        """The target's verify graphs: each tree size at the batch sizes of the shapes verifying it."""
        sizes: dict[int, set[int]] = {}
        for shape in self.shapes:
            sizes.setdefault(shape.num_draft_tokens, set()).update(self.graph_sizes(shape, batch_sizes))
        return {tokens: sorted(s) for tokens, s in sorted(sizes.items())}

    @property
    def context(self) -> float:
        """Mean tokens in KV of the last read step (what a step that knows no lengths is chosen at)."""
        return self._context

    @property
    def timer(self) -> PhaseTimer | None:
        return self._timer

    @timer.setter
    def timer(self, timer: PhaseTimer | None) -> None:
        self._timer = timer
        for worker in self.workers.values():
            worker.timer = timer

    def capture_cuda_graphs(self, *, batch_sizes: list[int], **kw) -> int:
        """Every shape's draft loop (at its ``graph_sizes``) and draft extend graphs, and the plain
        steps' draft extend on ``base`` (``EAGLEWorker.capture_cuda_graphs``); from now on a shape
        is chosen only up to its largest captured size, unless that is the largest of all (past it
        every choice runs eagerly)."""
        total = 0
        self.max_batch.clear()  # NOTE: in place: the policy reads this dict
        for shape, worker in self.workers.items():
            sizes = self.graph_sizes(shape, batch_sizes)
            total += worker.capture_cuda_graphs(batch_sizes=batch_sizes, draft_batch_sizes=sizes,
                                                plain_steps=worker is self.base, **kw)
            if sizes[-1] < max(batch_sizes):
                self.max_batch[shape.name] = sizes[-1]
        return total

    def release_cuda_graphs(self) -> None:
        for worker in self.workers.values():
            worker.release_cuda_graphs()
        self.max_batch.clear()

    def prefill(self, batch: ForwardBatch, sampling: SamplingInfo, **kw) -> torch.Tensor:
        self._clock.reset()  # a prefill between two decode steps is not the first one's cost
        return self.base.prefill(batch, sampling, **kw)

    @property
    def plain_step_prefills(self) -> bool:
        return self.base.plain_step_prefills

    def launch_decode_plain(self, *args, **kw) -> PendingDecode:
        self._clock.reset()
        return self.base.launch_decode_plain(*args, **kw)

    def relay_choices(self, *, send: Callable[[str], None] | None = None,
                      receive: Callable[[], str] | None = None) -> None:
        """Tensor parallelism: every rank must take the same choice each step, or their collectives
        diverge. Unrelayed, each rank's policy chooses from the same inputs and so may not learn from
        its own clock. Relayed, rank 0's policy chooses, learning the served steps' times and trying
        runner-ups, and hands each choice's name (``PLAIN``: no speculation) to ``send``; every other
        rank takes its choices from ``receive``, in order (the ranks run the same steps). Set on every
        rank before the first step that asks the policy, after the policy is built (without one every
        rank takes the configured shape: nothing to relay)."""
        if self.policy is None:
            return
        self._send, self._receive = send, receive
        if send is not None:
            self.policy.learn_served_step_times()

    def choose(self, bs: int, seq_lens_cpu: list[int] | None) -> SpecShape | None:
        """This step's shape (None: plain): ``force`` unless AUTO, else the policy's choice (rank 0's
        under a relay)."""
        if self.force != AUTO:
            return self.force
        if self.policy is None:
            return self.configured
        if self._receive is not None:
            name = self._receive()
            return None if name == PLAIN else self._by_name[name]
        context = sum(seq_lens_cpu) / len(seq_lens_cpu) if seq_lens_cpu else self._context
        shape = self.policy.choose(bs, context)
        self._observe_last_step(shape, bs, context)
        if self._send is not None:
            self._send(PLAIN if shape is None else shape.name)
        return shape

    def _observe_last_step(self, shape: SpecShape | None, bs: int, context: float) -> None:
        """Hand the policy the time from the last policy step's launch to this one's, where
        ``LaunchClock`` may time it (only after a step of the same choice: see its NOTE)."""
        timed = self._clock.launch(PLAIN if shape is None else shape.name, bs, context)
        if timed is not None:
            self.policy.observe_step(*timed)

    def launch_decode(self, req_pool_indices, seq_lens, verified_ids, sampling, **kw) -> PendingDecode:
        shape = self.choose(int(req_pool_indices.shape[0]), kw.get("seq_lens_cpu"))
        if shape is None:
            pending = self.base.launch_decode_plain(req_pool_indices, seq_lens, verified_ids, sampling, **kw)
        else:
            pending = self.workers[shape].launch_decode(req_pool_indices, seq_lens, verified_ids, sampling, **kw)
        return PendingDecode(pending.next_seq_lens, pending.next_tokens, lambda: self._read(shape, pending))

    def _read(self, shape: SpecShape | None, pending: PendingDecode) -> DecodeOutput:
        out = pending.result()
        if out.seq_lens:
            self._context = sum(out.seq_lens) / len(out.seq_lens)
        if shape is not None and self.policy is not None:
            self.policy.record(shape, [k + 1 for k in out.accept_lengths], out.paths)
        return out


def _shape_config(config: SpecConfig, shape: SpecShape) -> SpecConfig:
    tau = config.simulate_accept_length  # benchmark only: a mean the shape can reach
    return dataclasses.replace(config, num_steps=shape.num_steps, topk=shape.topk,
                               num_draft_tokens=shape.num_draft_tokens,
                               simulate_accept_length=None if tau is None else min(tau, shape.num_steps + 1))
