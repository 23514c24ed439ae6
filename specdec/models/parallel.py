"""Tensor parallelism (SGLang's ``--tp-size``) for the target and its draft head: which rows and
columns of each weight a rank holds, and the collectives that join the shards. A draft head's
layers and lm_head are cut as the target's are, or kept whole on every rank (``draft_head_group``:
--speculative-draft-tp); its fc, norms and token maps stay whole. ``TPGroup.all_reduce`` runs the
group's strategy (``specdec.models.all_reduce``: a one-shot kernel over peer memory for small
messages on one host's GPUs, NCCL otherwise).

Glossary: tp = tensor-parallel ranks, r = this rank, Hq / Hkv = query / KV heads, D = head_dim,
I = intermediate_size, V = vocab_size, chunk = ceil(V / tp) vocabulary rows per rank.

    q/k/v_proj, gate/up_proj   column-parallel: rank r holds its heads' (its I/tp features') rows
    o_proj, down_proj          row-parallel: the matching columns; partial outputs all-reduced,
                               then the bias (held whole by every rank) added once
    embed_tokens               vocab-parallel: rows [r*chunk, (r+1)*chunk), zero-padded past V;
                               a rank looks up its own ids, zeros elsewhere, all-reduced (exact)
    lm_head                    vocab-parallel: local logits [T, chunk], all-gathered, cut to V
    norms, q/k norms           replicated

KV heads: with Hkv % tp == 0 each rank holds Hkv/tp of them; with tp % Hkv == 0 each KV head is
replicated on tp/Hkv ranks (rank r holds head r // (tp/Hkv)), so its query heads find their KV
head locally. Worked example, Hq=4, Hkv=1, tp=2: rank 0 has q heads 0,1 and kv head 0; rank 1 has
q heads 2,3 and (a copy of) kv head 0.

Checkpoints stay whole on disk: ``shard_state_dict`` slices a full state to one rank's shapes. With
``TPGroup.size == 1`` every helper is the identity and no collective runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models.config import LlamaConfig
from specdec.models.ops import add_rms_norm

__all__ = ["TPGroup", "SINGLE", "HeadShard", "draft_head_group", "VocabParallelEmbedding", "make_embedding",
           "shard_state_dict"]


@dataclasses.dataclass(frozen=True)
class HeadShard:
    """This rank's attention heads: query heads [q_start, q_start + num_q), KV heads likewise."""

    q_start: int
    num_q: int
    kv_start: int
    num_kv: int


@dataclasses.dataclass(frozen=True)
class TPGroup:
    """One rank's view of a tensor-parallel group (``group=None``: torch.distributed's default group)."""

    rank: int = 0
    size: int = 1
    group: Any = dataclasses.field(default=None, compare=False, hash=False)
    # how ``all_reduce`` sums, chosen once per group (``specdec.models.all_reduce.choose_all_reduce``);
    # None: torch.distributed's
    reducer: Callable[[torch.Tensor], torch.Tensor] | None = dataclasses.field(
        default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"TPGroup: rank={self.rank} must be in [0, size={self.size})")

    # ------------------------------------------------------------ layout
    def check(self, config: LlamaConfig) -> None:
        """Clear errors for a model that cannot be split ``size`` ways."""
        c, tp = config, self.size
        if c.num_attention_heads % tp:
            raise ValueError(f"--tp-size {tp} does not divide num_attention_heads={c.num_attention_heads}")
        if c.num_key_value_heads % tp and tp % c.num_key_value_heads:
            raise ValueError(
                f"--tp-size {tp}: num_key_value_heads={c.num_key_value_heads} must divide or be divisible by it"
            )
        if c.intermediate_size % tp:
            raise ValueError(f"--tp-size {tp} does not divide intermediate_size={c.intermediate_size}")

    def heads(self, config: LlamaConfig) -> HeadShard:
        hq, hkv, tp, r = config.num_attention_heads, config.num_key_value_heads, self.size, self.rank
        num_q = hq // tp
        if hkv % tp == 0:
            num_kv, kv_start = hkv // tp, r * (hkv // tp)
        else:  # tp % hkv == 0: each KV head is held by tp // hkv ranks
            num_kv, kv_start = 1, r // (tp // hkv)
        return HeadShard(q_start=r * num_q, num_q=num_q, kv_start=kv_start, num_kv=num_kv)

    def vocab_chunk(self, vocab: int) -> int:
        return -(-vocab // self.size)

    # ------------------------------------------------------------ collectives
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks (``x`` contiguous). NOTE: use the result: torch.distributed's sums in place
        and returns ``x``; the one-shot path returns a new tensor and leaves ``x`` as it was."""
        if self.size == 1:
            return x
        if self.reducer is not None:
            return self.reducer(x)
        import torch.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x

    def all_reduce_add_rms_norm(
        self,
        x: torch.Tensor,  # [T, H] this rank's partial sum
        residual: torch.Tensor,  # [T, H]
        weight: torch.Tensor,  # [H]
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # ([T, H] normed, [T, H] the stream: the sum over ranks + residual)
        """``add_rms_norm(all_reduce(x), residual, weight, eps)``, in one kernel where the group's
        all-reduce fuses them (``PushAllReduce.add_rms_norm``: the same bits), else the two."""
        fused = getattr(self.reducer, "add_rms_norm", None) if self.size > 1 else None
        out = fused(x, residual, weight, eps) if fused is not None else None
        return out if out is not None else add_rms_norm(self.all_reduce(x), residual, weight, eps)

    @property
    def all_reduce_name(self) -> str:
        """Which all-reduce the group runs: "push" (ours, the default), "one-shot" (torch's kernel) or
        "torch.distributed" (reports, tests)."""
        return getattr(self.reducer, "name", "torch.distributed")

    def gather_vocab(self, local: torch.Tensor, vocab: int) -> torch.Tensor:  # [T, chunk] -> [T, V]
        """Every rank's vocabulary columns side by side, cut to ``vocab``."""
        if self.size == 1:
            return local
        import torch.distributed as dist

        local = local.contiguous()
        if local.device.type == "cuda":
            out = torch.empty((self.size,) + tuple(local.shape), dtype=local.dtype, device=local.device)
            dist.all_gather_into_tensor(out, local, group=self.group)
            parts = list(out.unbind(0))
        else:  # NOTE: gloo has no all_gather_into_tensor
            parts = [torch.empty_like(local) for _ in range(self.size)]
            dist.all_gather(parts, local, group=self.group)
        return torch.cat(parts, dim=-1)[..., :vocab]

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` (picklable) on every rank: a host-side decision all ranks must share."""
        if self.size == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather_rows(self, local: torch.Tensor, rows: int) -> torch.Tensor:  # [chunk, H] -> [rows, H]
        """A vocab-parallel weight made whole again (the rows of an EAGLE token map, whole on every rank)."""
        return self.gather_vocab(local.t().contiguous(), rows).t().contiguous()


SINGLE = TPGroup()

# --speculative-draft-tp auto shards a draft head from this hidden size up
DRAFT_SHARD_MIN_HIDDEN = 4096
DRAFT_TP_CHOICES = ("auto", "shard", "replicate")


def draft_head_group(choice: str, config: LlamaConfig, tp: TPGroup) -> TPGroup:
    """The group an EAGLE head's own weights are cut over: ``tp`` (shard: its layer's heads and MLP,
    its own embedding and lm_head, as the target's) or ``SINGLE`` (replicate: whole on every rank).

    auto shards when the head splits ``tp.size`` ways and ``hidden_size >= 4096``. A sharded forward
    reads 1/tp of the weights but adds two all-reduces and a logits gather. An 8B model's head (H
    4096, ~850 MB) measured 1-5 % more throughput sharded at tp 2 on two H200s (draft + extend 0-15 %
    shorter; benchmarks/results/2026-11-26-h200x2-draft-head-tp); a head of H 2048 reads ~250 MB,
    ~60 us a forward at 4.3 TB/s, so sharding saves ~30 us against ~20 us of NCCL collectives and
    extra launches: not worth it, and smaller heads lose outright."""
    if choice not in DRAFT_TP_CHOICES:
        raise ValueError(f"--speculative-draft-tp {choice!r}: expected one of {', '.join(DRAFT_TP_CHOICES)}")
    if tp.size == 1 or choice == "replicate":
        return SINGLE
    if choice == "shard":
        tp.check(config)
        return tp
    try:
        tp.check(config)
    except ValueError:
        return SINGLE
    return tp if config.hidden_size >= DRAFT_SHARD_MIN_HIDDEN else SINGLE


class VocabParallelEmbedding(nn.Module):
    """``nn.Embedding`` over rows [rank*chunk, (rank+1)*chunk) of the vocabulary; same call and
    ``weight`` name, so a checkpoint's ``embed_tokens.weight`` (sliced) loads into it."""

    def __init__(self, vocab: int, hidden: int, tp: TPGroup, *, dtype: torch.dtype, device: Any) -> None:
        super().__init__()
        self.tp = tp
        self.num_embeddings, self.embedding_dim = vocab, hidden
        self.chunk = tp.vocab_chunk(vocab)
        self.start = tp.rank * self.chunk
        self.weight = nn.Parameter(torch.empty(self.chunk, hidden, dtype=dtype, device=device))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        local = ids - self.start
        outside = (local < 0) | (local >= self.chunk)  # [T]
        out = F.embedding(local.clamp(0, self.chunk - 1), self.weight)
        out = out.masked_fill(outside[:, None], 0.0)
        return self.tp.all_reduce(out)


def make_embedding(vocab: int, hidden: int, tp: TPGroup, *, dtype: torch.dtype, device: Any) -> nn.Module:
    if tp.size == 1:
        return nn.Embedding(vocab, hidden, dtype=dtype, device=device)
    return VocabParallelEmbedding(vocab, hidden, tp, dtype=dtype, device=device)


# ----------------------------------------------------------------------------- checkpoint slicing

_COLUMN = ("mlp.gate_proj.", "mlp.up_proj.")  # rows split by I
_ROW = ("mlp.down_proj.weight",)  # columns split by I


def _vocab_rows(t: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    chunk = tp.vocab_chunk(t.shape[0])
    part = t[tp.rank * chunk : (tp.rank + 1) * chunk]
    if part.shape[0] < chunk:  # the last rank's rows past V are zero (their logits are cut off)
        part = torch.cat([part, part.new_zeros(chunk - part.shape[0], *t.shape[1:])])
    return part


def _shard_one(name: str, t: torch.Tensor, config: LlamaConfig, tp: TPGroup) -> torch.Tensor:
    shard, d = tp.heads(config), config.head_dim
    inter = config.intermediate_size // tp.size
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return _vocab_rows(t, tp)
    if ".self_attn.q_proj." in name:
        return t[shard.q_start * d : (shard.q_start + shard.num_q) * d]
    if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
        return t[shard.kv_start * d : (shard.kv_start + shard.num_kv) * d]
    if name.endswith(".self_attn.o_proj.weight"):
        return t[:, shard.q_start * d : (shard.q_start + shard.num_q) * d]
    if any(f".{c}" in name for c in _COLUMN):
        return t[tp.rank * inter : (tp.rank + 1) * inter]
    if any(name.endswith(c) for c in _ROW):
        return t[:, tp.rank * inter : (tp.rank + 1) * inter]
    return t  # norms, q/k norms, row-parallel biases: replicated


def shard_state_dict(state: dict[str, torch.Tensor], config: LlamaConfig, tp: TPGroup) -> dict[str, torch.Tensor]:
    """A full target state dict cut to rank ``tp.rank``'s shapes (the identity when tp.size == 1)."""
    if tp.size == 1:
        return state
    tp.check(config)
    return {name: _shard_one(name, t, config, tp).contiguous() for name, t in state.items()}
