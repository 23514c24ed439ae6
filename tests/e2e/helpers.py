"""Shared builders for end-to-end tests: tiny models, engines, and plain-greedy references."""

from __future__ import annotations

import copy

import torch

from specdec.engine.engine import Engine
from specdec.forward import LogitsMode
from ..kv_leaks import assert_kv_idle
from ..builders import StandaloneRunner, make_perfect_draft_pair, make_random_eagle3_head, make_random_eagle_head, \
    make_random_target, tiny_llama_config
from specdec.models.llama import default_eagle3_layers

# (num_steps, topk, num_draft_tokens) of the core issue
TREE_SHAPES = [(1, 1, 2), (3, 1, 4), (5, 4, 8), (4, 8, 32), (6, 10, 60)]


@torch.no_grad()
def perturb_target(target, scale: float, seed: int):
    """Give a perfect-draft target real attention and MLP, so the draft is right only sometimes."""
    gen = torch.Generator().manual_seed(seed)
    for layer in target.model.layers:
        for w in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
            noise = torch.randn(w.shape, generator=gen) * scale / w.shape[-1] ** 0.5
            w.copy_(noise.to(w.dtype))
    return target


def make_pair(algorithm: str, kind: str, *, dtype=torch.float32, seed=0, **config_overrides):
    """kind: 'random' (draft rarely right), 'perfect' (always right), 'mixed' (often right)."""
    config = tiny_llama_config(**config_overrides)
    if kind == "random":
        aux = default_eagle3_layers(config.num_hidden_layers) if algorithm == "EAGLE3" else None
        target = make_random_target(config, seed, dtype, aux_hidden_layers=aux)
        if algorithm == "EAGLE3":
            return target, make_random_eagle3_head(target, seed + 1, draft_vocab_size=config.vocab_size - 20)
        return target, make_random_eagle_head(target, seed + 1)
    target, draft = make_perfect_draft_pair(config, algorithm, seed=seed, dtype=dtype)
    if kind == "mixed":
        perturb_target(target, 1.2, seed + 3)
    return target, draft


def engine(target, draft=None, *, algorithm=None, shape=None, page_size=1, **kw) -> Engine:
    spec = {}
    if draft is not None:
        steps, topk, ntok = shape
        spec = dict(speculative_algorithm=algorithm, speculative_num_steps=steps,
                    speculative_eagle_topk=topk, speculative_num_draft_tokens=ntok)
        # NOTE: a test names one shape and checks that shape: adaptive speculation (on by default
        # with CUDA graphs) would pick others, and profile step costs at every engine start
        kw.setdefault("speculative_adaptive", "off")
    kw.setdefault("max_total_tokens", 8192)
    kw.setdefault("max_running_requests", 16)
    kw.setdefault("cuda_graph_max_bs", 4)  # on CUDA with triton: capture 1..4 (and decode at most 4 at once)
    kw.setdefault("piecewise_cuda_graph_max_tokens", 512)  # on CUDA: prefills up to 512 tokens replay pieces
    return Engine(target_model=target, draft_model=draft, page_size=page_size, **spec, **kw)


def prompts_of(lengths, vocab, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def assert_no_leak(eng: Engine) -> None:
    assert_kv_idle(eng)


NEAR_TIE = 2.0**-5  # logit gap to the best, relative to the largest |logit|: a few bf16 roundings


def assert_equal_or_near_tie(target, prompts, got, expected, *, max_diverged: int | None = None,
                             top_two: bool = False):
    """bf16 greedy outputs ``got`` equal ``expected``, or first differ where both tokens are within
    bf16 noise of the best, judged by an fp32 copy of ``target``; at most ``max_diverged`` differ;
    ``top_two``: the two tokens must also be the target's two best."""
    reference = copy.deepcopy(target).float()
    diverged = 0
    for prompt, g, e in zip(prompts, got, expected):
        if g == e:
            continue
        diverged += 1
        i = next(j for j, (a, b) in enumerate(zip(g, e)) if a != b)
        runner = StandaloneRunner(reference, len(prompt) + i + 1)
        logits = runner.forward(prompt + e[:i], logits_mode=LogitsMode.LAST).next_token_logits[-1].float()
        slack = NEAR_TIE * float(logits.abs().max())
        if top_two:
            best_two = set(logits.topk(2).indices.tolist())
            assert {g[i], e[i]} == best_two, f"diverged at position {i} on a token outside the top 2"
        for token in (g[i], e[i]):
            gap = float(logits.max() - logits[token])
            assert gap <= slack, f"diverged at position {i} on token {token}, {gap:.4f} below the best (> {slack:.4f})"
    assert max_diverged is None or diverged <= max_diverged, f"{diverged} of {len(prompts)} outputs diverged"
