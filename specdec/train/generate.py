"""Fast batched sampling from a target for training data: a dense KV cache, fixed-length rounds.

The serving engine (paged KV, a scheduler, per-request bookkeeping) is built for requests that
come and go; regenerating tens of thousands of training answers is the opposite case: many
requests of one length, all started together. ``generate`` runs the same target model
(``LlamaForCausalLM.forward`` through this module's duck-typed attention backend) over a batch of
prompts at once:

    prefill    prompts left-padded to one length P, one forward          -> the first new token
    decode     max_new_tokens - 1 forwards of bs tokens, KV in a dense [bs, hkv, P + new, D] cache

Left padding keeps every row's newest token in the same cache column, so a step writes one column
for all rows; a row's pad keys are masked for its real queries (a pad query sees only itself, which
keeps its output finite). Positions count real tokens only, so a row's numbers equal an unpadded
run. Worked example, prompts [7 8 9] and [5 6], P = 3 (``x`` = may attend, ``.`` = masked):

    column       0  1  2 | 3      row 1 is [pad 5 6]: its column-0 key is masked for every real
    row 0 keys   x  x  x | x      query, its positions are [0, 0, 1] (the pad's clamped to 0),
    row 1 keys   .  x  x | x      and column 3 holds the first generated token of both rows

Nothing reads the device between steps (tokens are sampled into a device buffer), so the host
queues steps ahead of the GPU. Rows are bucketed by prompt length to keep padding small. Sampling:
``temperature == 0`` is argmax, otherwise a draw from softmax(logits / temperature) with a seeded
generator. Stopping is left to the caller (``ignore_eos``, as the benchmark runs; ``truncate_at``
cuts each row after a stop token).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from specdec.attention.base import AttentionLayer
from specdec.engine.progress import progress
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode
from specdec.models.llama import LlamaForCausalLM


class DenseKVAttention:
    """Duck-typed attention backend: per-layer dense K/V [bs, hkv, max_len, D] of left-padded rows."""

    name = "dense_kv"

    def __init__(self, target: LlamaForCausalLM, pad: torch.Tensor, max_len: int) -> None:
        c = target.config
        bs = int(pad.shape[0])
        weight = target.lm_head_weight
        shape = (c.num_hidden_layers, bs, c.num_key_value_heads, max_len, c.head_dim)
        self.k = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        self.v = torch.zeros(shape, dtype=weight.dtype, device=weight.device)
        col = torch.arange(max_len, device=weight.device)
        # [bs, max_len] True where the column holds a real token of the row
        self.real = col[None] >= pad.to(weight.device)[:, None]
        self.bs, self.max_len = bs, max_len
        self.filled = 0  # columns written by finished forwards

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.num_tokens % self.bs:
            raise ValueError(f"DenseKVAttention: {batch.num_tokens} tokens is not a multiple of bs={self.bs}")

    def advance(self, n: int) -> None:
        """The forward that wrote ``n`` new columns per row is done."""
        self.filled += n

    def forward(
        self,
        q: torch.Tensor,  # [bs * n, hq * d]
        k: torch.Tensor,  # [bs * n, hkv * d]
        v: torch.Tensor,  # [bs * n, hkv * d]
        layer: AttentionLayer,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [bs * n, hq * d]
        b, n = self.bs, q.shape[0] // self.bs
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        start, end = self.filled, self.filled + n
        if end > self.max_len:
            raise ValueError(f"DenseKVAttention: {end} columns exceed max_len={self.max_len}")
        lid = layer.layer_id
        self.k[lid, :, :, start:end] = k.view(b, n, hkv, d).transpose(1, 2)
        self.v[lid, :, :, start:end] = v.view(b, n, hkv, d).transpose(1, 2)
        cols = torch.arange(end, device=q.device)
        qcol = cols[start:end]
        # [b, n, end]: causal, real keys only, and every query sees its own column
        mask = ((cols[None, :] <= qcol[:, None])[None] & self.real[:, None, :end]) | (cols[None, :] == qcol[:, None])[None]
        # NOTE: the query heads of one KV head go in as extra rows (no repeated K/V: SDPA's GQA path
        # would copy the whole cache every step)
        g = hq // hkv
        qs = q.view(b, n, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * n, d)
        scores = torch.matmul(qs, self.k[lid, :, :, :end].transpose(-1, -2)) * layer.scaling  # [b, hkv, g*n, end]
        scores = scores.view(b, hkv, g, n, end).masked_fill(~mask[:, None, None], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(b, hkv, g * n, end)
        out = torch.matmul(probs, self.v[lid, :, :, :end])  # [b, hkv, g*n, d]
        return out.view(b, hkv, g, n, d).permute(0, 3, 1, 2, 4).reshape(b * n, hq * d)


def _batch(ids: torch.Tensor, positions: torch.Tensor, backend: DenseKVAttention,
           output_rows: torch.Tensor | None) -> ForwardBatch:
    """A ForwardBatch over ``ids`` [bs * n] (n tokens per row): logits of ``output_rows`` or all."""
    device, t = ids.device, ids.shape[0]
    b = backend.bs
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND, input_ids=ids, positions=positions,
        out_cache_loc=torch.arange(t, device=device), req_pool_indices=torch.arange(b, device=device),
        prefix_lens=torch.zeros(b, dtype=torch.int64, device=device),
        extend_lens=torch.full((b,), t // b, dtype=torch.int64, device=device),
        req_to_token=torch.empty(0, dtype=torch.int32, device=device), kv_cache=None, attn_backend=backend,
        logits_mode=LogitsMode.LAST if output_rows is not None else LogitsMode.ALL,
        capture_hidden_mode=CaptureHiddenMode.NULL, output_rows=output_rows,
        prefix_lens_cpu=[0] * b, extend_lens_cpu=[t // b] * b,
    )


def _sample(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> torch.Tensor:
    """[bs, vocab] fp32 logits -> [bs] int64 tokens."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(1)


@torch.no_grad()
def generate_round(
    target: LlamaForCausalLM,
    prompts: Sequence[Sequence[int]],
    *,
    temperature: float,
    max_new_tokens: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:  # [bs, max_new_tokens] int64, on the target's device
    """One batch: every prompt gets exactly ``max_new_tokens`` new tokens (no stopping)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate: need one or more non-empty prompts")
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens} must be >= 1")
    device = target.lm_head_weight.device
    b, p = len(prompts), max(len(x) for x in prompts)
    if p + max_new_tokens > target.config.max_position_embeddings:
        raise ValueError(f"generate: {p} + {max_new_tokens} tokens exceed max_position_embeddings="
                         f"{target.config.max_position_embeddings}")
    pad = torch.tensor([p - len(x) for x in prompts], dtype=torch.int64)
    ids = torch.zeros(b, p, dtype=torch.int64)
    for i, x in enumerate(prompts):
        ids[i, p - len(x):] = torch.as_tensor(list(x), dtype=torch.int64)
    ids, pad = ids.to(device), pad.to(device)
    backend = DenseKVAttention(target, pad, p + max_new_tokens)
    positions = (torch.arange(p, device=device)[None] - pad[:, None]).clamp_(min=0)  # [b, p]
    last = torch.arange(b, device=device) * p + p - 1  # [b] packed row of each prompt's last token
    out = torch.empty(b, max_new_tokens, dtype=torch.int64, device=device)
    logits = target(_batch(ids.reshape(-1), positions.reshape(-1), backend, last)).next_token_logits
    backend.advance(p)
    next_pos = positions[:, -1] + 1  # [b]
    for step in range(max_new_tokens):
        out[:, step] = tok = _sample(logits, temperature, generator)
        if step + 1 == max_new_tokens:
            break
        logits = target(_batch(tok, next_pos + step, backend, None)).next_token_logits
        backend.advance(1)
    return out


@dataclasses.dataclass(frozen=True)
class GenerateSettings:
    temperature: float
    max_new_tokens: int
    batch_size: int = 256
    seed: int = 0
    # a round holds at most this many cache columns in all (rows x (longest prompt + new tokens)):
    # 640k fp32 columns of a SmolLM2-135M-sized model are ~30 GB of KV cache
    max_batch_tokens: int = 640_000

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.max_new_tokens < 1 or self.batch_size < 1 or self.max_batch_tokens < 1:
            raise ValueError(f"GenerateSettings: {self} needs temperature >= 0 and max_new_tokens, batch_size, "
                             "max_batch_tokens >= 1")


def plan_rounds(lengths: Sequence[int], settings: GenerateSettings) -> list[list[int]]:
    """Prompt indices per round: sorted by length, at most ``batch_size`` rows and ``max_batch_tokens``
    columns (rows x (longest prompt + max_new_tokens)) per round, one row at least.

    Example: lengths [5, 1, 9, 3] (sorted order 1, 3, 0, 2), batch_size 3, max_new_tokens 2:
    max_batch_tokens 100 -> [[1, 3, 0], [2]] (three rows at most);
    max_batch_tokens 20  -> [[1, 3], [0], [2]] (3 x (5 + 2) = 21 and 2 x (9 + 2) = 22 exceed 20).
    """
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    rounds: list[list[int]] = []
    for i in order:
        cur = rounds[-1] if rounds else None
        cols = lengths[i] + settings.max_new_tokens
        if cur is None or len(cur) >= settings.batch_size or (len(cur) + 1) * cols > settings.max_batch_tokens:
            rounds.append([i])
        else:
            cur.append(i)
    return rounds


def generate(
    target: LlamaForCausalLM,
    prompts: Sequence[Sequence[int]],
    settings: GenerateSettings,
    *,
    desc: str = "generate",
) -> list[list[int]]:
    """``max_new_tokens`` new tokens for every prompt, in the prompts' order (rows bucketed by length).

    Reproducible for a given seed, batch size and device: each round draws from one generator
    seeded with ``seed`` and the round's index.
    """
    device = target.lm_head_weight.device
    rounds = plan_rounds([len(p) for p in prompts], settings)
    results: list[torch.Tensor] = []
    desc = f"{desc} T={settings.temperature:g}"
    for r, rows in enumerate(progress(rounds, desc=desc, total=len(rounds), unit="rounds")):
        gen = torch.Generator(device=device).manual_seed(settings.seed * 1_000_003 + r)
        results.append(generate_round(target, [prompts[i] for i in rows], temperature=settings.temperature,
                                      max_new_tokens=settings.max_new_tokens, generator=gen))
    out: list[list[int]] = [[] for _ in prompts]
    for rows, tokens in zip(rounds, results):
        for i, row in zip(rows, tokens.cpu().tolist()):
            out[i] = row
    return out


def truncate_at(tokens: list[int], stop_ids: Sequence[int]) -> tuple[list[int], bool]:
    """``tokens`` up to (not including) the first stop id, and whether one was found."""
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[:i], True
    return tokens, False
