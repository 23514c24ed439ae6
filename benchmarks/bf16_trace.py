"""The harness behind ``benchmarks/bf16_paths.py``: one target, one paged KV cache, and a traced
forward that records every sub-op's output, so that a decode step and a verify forward over the
same tokens and the same KV state can be compared stage by stage.

Layout: request b owns slots [b * max_len, (b + 1) * max_len); position p of request b lives in
slot b * max_len + p, except for verify-tree nodes, which (as in the worker) are written at
seq_len + tree index.

``traced_forward`` runs ``LlamaForCausalLM.forward`` step by step with the same ops and records
(stage name, [rows, features] tensor) pairs; ``check_trace`` asserts that its logits equal the
model's own forward bit for bit, so the trace is the model's computation, not a copy of it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from specdec.attention.kv_cache import KVCache
from specdec.forward import CaptureHiddenMode, ForwardBatch, ForwardMode, LogitsMode
from specdec.models.llama import LlamaForCausalLM, logits_and_hidden
from specdec.models.llama_layers import row_parallel


@dataclasses.dataclass
class Trace:
    """Stage outputs of one forward, in execution order: name -> [num_tokens, F]."""

    stages: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def add(self, name: str, x: torch.Tensor) -> None:
        self.stages[name] = x.detach().clone()


def _traced_attention(attn: Any, positions: torch.Tensor, x: torch.Tensor, batch: ForwardBatch,
                      trace: Trace, tag: str) -> torch.Tensor:
    """``LlamaAttention.forward`` with each sub-op recorded."""
    qkv = attn.qkv_proj(x)  # [T, (Hq + 2 Hkv) D]
    trace.add(f"{tag}.qkv_proj", qkv)
    q = qkv[:, : attn.q_size]
    k = qkv[:, attn.q_size : attn.q_size + attn.kv_size]
    v = qkv[:, attn.q_size + attn.kv_size :]
    if attn.qk_norm:
        t, d = q.shape[0], attn.head_dim
        q = attn.q_norm(q.reshape(-1, d)).view(t, -1)
        k = attn.k_norm(k.reshape(-1, d)).view(t, -1)
    attn.rotary(positions, q, k)
    trace.add(f"{tag}.rope_q", q)
    trace.add(f"{tag}.rope_k", k)
    out = batch.attn_backend.forward(q, k, v, attn.layer, batch)  # [T, Hq D]
    trace.add(f"{tag}.attention", out)
    out = row_parallel(out, attn.o_proj, attn.tp)
    trace.add(f"{tag}.o_proj", out)
    return out


@torch.no_grad()
def traced_forward(model: LlamaForCausalLM, batch: ForwardBatch) -> tuple[Trace, torch.Tensor]:
    """(the trace, logits [T, vocab] in ``batch.logits_dtype``) of one forward with LogitsMode.ALL."""
    trace = Trace()
    batch.attn_backend.init_forward_metadata(batch)
    x = model.embed(batch.input_ids)  # [T, H]
    residual = None
    for i, layer in enumerate(model.model.layers):
        tag = f"L{i:02d}"
        h, residual = layer.input_layernorm.forward_add(x, residual)
        trace.add(f"{tag}.input_norm", h)
        trace.add(f"{tag}.stream_in", residual)
        h = _traced_attention(layer.self_attn, batch.positions, h, batch, trace, tag)
        h, residual = layer.post_attention_layernorm.forward_add(h, residual)
        trace.add(f"{tag}.post_norm", h)
        trace.add(f"{tag}.stream_mid", residual)
        gate_up = layer.mlp.gate_up_proj(h)  # [T, 2I]
        trace.add(f"{tag}.gate_up_proj", gate_up)
        act = layer.mlp.act(gate_up)
        trace.add(f"{tag}.silu_and_mul", act)
        x = row_parallel(act, layer.mlp.down_proj, layer.mlp.tp)
        trace.add(f"{tag}.down_proj", x)
    normed, _ = model.model.norm.forward_add(x, residual)
    trace.add("final_norm", normed)
    out = logits_and_hidden(normed, None, model.lm_head_weight, batch, tp=model.tp,
                            vocab_size=model.config.vocab_size)
    trace.add("logits", out.next_token_logits)
    return trace, out.next_token_logits


class PagedHarness:
    """``bs`` requests over one KV cache with a fixed slot layout (module docstring)."""

    def __init__(self, model: LlamaForCausalLM, backend: Any, *, bs: int, max_len: int) -> None:
        layout = model.kv_layout
        weight = next(model.parameters())
        self.model, self.backend, self.bs, self.max_len = model, backend, bs, max_len
        self.device = weight.device
        self.cache = KVCache(num_layers=layout.num_layers, num_slots=bs * max_len, num_kv_heads=layout.num_kv_heads,
                             head_dim=layout.head_dim, dtype=weight.dtype, device=weight.device)
        base = torch.arange(bs, device=self.device)[:, None] * max_len
        self.req_to_token = (base + torch.arange(max_len, device=self.device)[None]).to(torch.int32)  # [bs, max_len]
        self.seq_lens = [0] * bs

    def _batch(self, mode: ForwardMode, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               extend: list[int], *, tree_mask: torch.Tensor | None = None,
               logits_dtype: torch.dtype | None = torch.float32) -> ForwardBatch:
        dev = self.device
        return ForwardBatch(
            forward_mode=mode, input_ids=ids.to(dev), positions=positions.to(dev), out_cache_loc=slots.to(dev),
            req_pool_indices=torch.arange(self.bs, device=dev), prefix_lens=torch.tensor(self.seq_lens, device=dev),
            extend_lens=torch.tensor(extend, device=dev), req_to_token=self.req_to_token, kv_cache=self.cache,
            attn_backend=self.backend, logits_mode=LogitsMode.ALL, logits_dtype=logits_dtype,
            capture_hidden_mode=CaptureHiddenMode.NULL, tree_mask=tree_mask,
            prefix_lens_cpu=list(self.seq_lens), extend_lens_cpu=list(extend))

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """EXTEND over every request's prompt; the greedy next token of each [bs]."""
        ids = torch.tensor([t for p in prompts for t in p])
        pos = torch.cat([torch.arange(len(p)) for p in prompts])
        slots = torch.cat([torch.arange(len(p)) + b * self.max_len for b, p in enumerate(prompts)])
        batch = self._batch(ForwardMode.EXTEND, ids, pos, slots, [len(p) for p in prompts])
        _, logits = traced_forward(self.model, batch)
        self.seq_lens = [len(p) for p in prompts]
        last = torch.cumsum(torch.tensor([len(p) for p in prompts]), 0) - 1
        return logits[last.to(logits.device)].argmax(-1).cpu()

    def decode(self, tokens: torch.Tensor, *, logits_dtype: torch.dtype | None = torch.float32) -> Trace:
        """One DECODE step: token b at position seq_len[b] of request b; the step is committed."""
        pos = torch.tensor(self.seq_lens)
        slots = pos + torch.arange(self.bs) * self.max_len
        batch = self._batch(ForwardMode.DECODE, tokens, pos, slots, [1] * self.bs, logits_dtype=logits_dtype)
        trace, _ = traced_forward(self.model, batch)
        self.seq_lens = [s + 1 for s in self.seq_lens]
        return trace

    def verify(self, nodes: torch.Tensor, depth: torch.Tensor, mask: torch.Tensor, *,
               logits_dtype: torch.dtype | None = None) -> Trace:
        """One TARGET_VERIFY forward: nodes [bs, N] at positions seq_len + depth [N], node t written
        at slot of position seq_len + t; ``mask`` [N, N] bool (ancestors and self). Not committed."""
        trace, _ = traced_forward(self.model, self.verify_batch(nodes, depth, mask, logits_dtype=logits_dtype))
        return trace

    def verify_batch(self, nodes: torch.Tensor, depth: torch.Tensor, mask: torch.Tensor, *,
                     logits_dtype: torch.dtype | None = None) -> ForwardBatch:
        """The TARGET_VERIFY batch ``verify`` runs (metadata not yet built)."""
        bs, n = nodes.shape
        seq = torch.tensor(self.seq_lens)[:, None]
        pos = (seq + depth[None]).reshape(-1)
        slots = (seq + torch.arange(n)[None] + torch.arange(bs)[:, None] * self.max_len).reshape(-1)
        tree_mask = mask.reshape(1, -1).expand(bs, -1).reshape(-1).to(self.device)
        return self._batch(ForwardMode.TARGET_VERIFY, nodes.reshape(-1), pos, slots, [n] * bs,
                           tree_mask=tree_mask, logits_dtype=logits_dtype)

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        return self.cache.k.clone(), self.cache.v.clone(), list(self.seq_lens)

    def restore(self, state: tuple[torch.Tensor, torch.Tensor, list[int]]) -> None:
        self.cache.k.copy_(state[0])
        self.cache.v.copy_(state[1])
        self.seq_lens = list(state[2])


@torch.no_grad()
def check_trace(model: LlamaForCausalLM, harness: PagedHarness, tokens: torch.Tensor) -> None:
    """The traced forward's logits equal the model's own forward bit for bit (one decode step)."""
    state = harness.snapshot()
    pos = torch.tensor(harness.seq_lens)
    slots = pos + torch.arange(harness.bs) * harness.max_len
    batch = harness._batch(ForwardMode.DECODE, tokens, pos, slots, [1] * harness.bs)
    _, traced = traced_forward(model, batch)
    harness.restore(state)
    batch = harness._batch(ForwardMode.DECODE, tokens, pos, slots, [1] * harness.bs)
    harness.backend.init_forward_metadata(batch)
    own = model(batch).next_token_logits
    harness.restore(state)
    if not torch.equal(traced, own):
        raise AssertionError("traced_forward differs from the model's forward: the trace is stale")


def tree_with_path(n: int, path_len: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """A draft tree of ``n`` nodes whose greedy path (``path_len`` nodes, root first) is not the
    contiguous first nodes: each path node's first child is a distractor leaf, its second the next
    path node. Returns (parent [n], depth [n], path node indices).

        n = 6, path_len = 3:     0 (root)          path: 0 -> 2 -> 4
                                /   \\
                               1     2
                                    / \\
                                   3   4  -- 5
    Nodes past the path hang off the last path node.
    """
    if n < 2 * path_len - 1:
        raise ValueError(f"a tree of {n} nodes cannot hold a path of {path_len} with a distractor at each step")
    parent, path = [-1], [0]
    for _ in range(path_len - 1):
        parent.append(path[-1])  # distractor
        parent.append(path[-1])
        path.append(len(parent) - 1)
    while len(parent) < n:
        parent.append(path[-1])
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parent[i]] + 1
    return torch.tensor(parent), torch.tensor(depth), path


def ancestor_mask(parent: torch.Tensor) -> torch.Tensor:  # [N] -> [N, N] bool
    n = parent.shape[0]
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(n):
        p = int(parent[i])
        while p >= 0:
            mask[i, p] = True
            p = int(parent[p])
    return mask
