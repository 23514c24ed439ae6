"""Attention microbenchmark: time per layer call of decode and target verify, per backend.

Llama-3-8B head shape (32 query heads, 8 KV heads, head_dim 128), bf16, page_size 1 with the slots
of every request shuffled over the cache. By default, for bs in {1, 8, 64} and context in
{512, 4096}: DECODE (one token per request) and TARGET_VERIFY with N in {4, 8, 64} tree nodes
(random trees, or chains with ``--chains``; ``--batch-sizes``, ``--contexts``, ``--tree-sizes``
choose others); with ``--prefill Q ...`` also EXTEND, the target's prefill of Q new tokens a request
over the context as its cached prefix (causal; planned from host lengths, as a server's prefill is).
Every available backend (triton, torch_native, flashinfer, fa3; or ``--backends``) runs on the same
inputs in the same process; ``forward`` is timed (metadata is planned once per forward, outside the
per-layer time), warm-up then median of CUDA-event timings, eagerly and replayed from a CUDA graph
(the GPU time without launch overhead; torch_native is timed eagerly only). ``triton_extend`` is the
triton backend with every verify on its extend kernel (no nodes as decode steps: the default path's
cost of greedy answers equal to plain decoding, issue #41).

The floor is the KV bytes a call must read (K and V of every visible entry, once) divided by the
bandwidth of a large device-to-device copy measured in the same run.

``--static-bound L`` plans every call as a CUDA graph of a server does (triton only): from a length
bound L (a server's context length) instead of the actual lengths, which stay at each case's context;
the plan (``init_forward_metadata``, once a forward, on the device alone) is then timed too, replayed.

    python benchmarks/bench_attention.py --output-dir benchmarks/results/attention
    python benchmarks/bench_attention.py --backends triton --static-bound 32768 --output-dir DIR
    python benchmarks/bench_attention.py --backends triton --batch-sizes 4 8 --tree-sizes 32 64
    python benchmarks/bench_attention.py --backends triton triton_extend --static-bound 2048 --contexts 1024
    python benchmarks/bench_attention.py --backends triton --tree-sizes 0 --prefill 1 16 256 --contexts 1024 8192
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from common import metadata_line, run_metadata
from specdec.attention import AttentionLayer, KVCache, available_backends, create_attention_backend
from specdec.bench.device_timing import copy_bandwidth, event_us, graph_us
from specdec.engine.progress import progress
from specdec.forward import ForwardBatch, ForwardMode

HQ, HKV, D = 32, 8, 128
DTYPE = torch.bfloat16
BATCH_SIZES = (1, 8, 64)
CONTEXTS = (512, 4096)
TREE_SIZES = (4, 8, 64)
# torch_native materialises fp32 gathers and scores; skip it where they would pass this many bytes
TORCH_NATIVE_MAX_BYTES = 12 * 2**30
# measured beside the registered backends: name -> (backend, its arguments)
VARIANTS = {"triton_extend": ("triton", {"verify_as_decode_max_rows": 0, "verify_rows_max_nodes": 0})}
TRITON_NAMES = ("triton", *VARIANTS)


def random_tree_mask(n: int, gen: torch.Generator, *, chain: bool = False) -> torch.Tensor:
    """[n, n] bool ancestors-and-self mask of a random tree (node i's parent is uniform in 0..i-1), or
    of a chain (node i's parent is i - 1: NGRAM's default drafts)."""
    parents = [-1] + [i - 1 if chain else int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def make_batch(mode: ForwardMode, bs: int, ctx: int, n: int, seed: int = 0, *, chains: bool = False):
    """(batch, layer, q, k, v): bs requests of ``ctx`` cached tokens and ``n`` new ones each."""
    gen = torch.Generator().manual_seed(seed)
    num_slots = bs * (ctx + n)
    table = torch.randperm(num_slots, generator=gen).view(bs, ctx + n).to(torch.int32).cuda()
    cache = KVCache(num_layers=1, num_slots=num_slots, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, device="cuda")
    cache.k_buffers[0].normal_()
    cache.v_buffers[0].normal_()
    kw = {}
    depths = torch.zeros(bs * n, dtype=torch.int64)  # [bs * n] a node's ancestors (0: the root; decode: 0)
    if mode == ForwardMode.TARGET_VERIFY:
        masks = [random_tree_mask(n, gen, chain=chains) for _ in range(bs)]
        kw["tree_mask"] = torch.cat([m.flatten() for m in masks]).cuda()
        depths = torch.cat([m.sum(1) - 1 for m in masks])
    elif mode == ForwardMode.EXTEND:  # causal new tokens after the cached context
        depths = torch.arange(n).repeat(bs)
    batch = ForwardBatch(
        forward_mode=mode,
        input_ids=torch.zeros(bs * n, dtype=torch.int64, device="cuda"),
        positions=(ctx + depths).cuda(),  # NOTE: the verify-as-decode plans list each node's positions 0..its own
        out_cache_loc=table[:, ctx:].reshape(-1).long(),
        req_pool_indices=torch.arange(bs, device="cuda"),
        prefix_lens=torch.full((bs,), ctx, device="cuda"),
        extend_lens=torch.full((bs,), n, device="cuda"),
        req_to_token=table,
        kv_cache=cache,
        attn_backend=None,
        prefix_lens_cpu=[ctx] * bs,
        extend_lens_cpu=[n] * bs,
        **kw,
    )
    layer = AttentionLayer(layer_id=0, num_heads=HQ, num_kv_heads=HKV, head_dim=D, scaling=D**-0.5)
    q = torch.randn(bs * n, HQ * D, dtype=DTYPE, device="cuda")
    k = torch.randn(bs * n, HKV * D, dtype=DTYPE, device="cuda")
    v = torch.randn(bs * n, HKV * D, dtype=DTYPE, device="cuda")
    return batch, layer, q, k, v


def torch_native_bytes(bs: int, ctx: int, n: int) -> int:
    kv = ctx + n
    return bs * kv * HKV * D * 4 * 2 + bs * HQ * n * kv * 4 * 3


def library_versions() -> dict:
    """Versions of the optional attention libraries that are importable here."""
    import importlib.metadata

    versions = {}
    for dist in ("flashinfer-python", "apache-tvm-ffi", "flash-attn-3", "flash_attn_3", "sgl-kernel"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def bench_case(mode: ForwardMode, bs: int, ctx: int, n: int, backends: list[str], args) -> dict:
    batch, layer, q, k, v = make_batch(mode, bs, ctx, n, chains=args.chains)
    if args.static_bound and mode != ForwardMode.EXTEND:  # a captured graph's plan (prefill runs eagerly)
        batch = dataclasses.replace(batch, prefix_lens_cpu=None, extend_lens_cpu=None,
                                    static_max_seq_len=max(args.static_bound, ctx + n))
    kv_bytes = bs * (ctx + n) * HKV * D * DTYPE.itemsize * 2
    row = {"mode": mode.name, "bs": bs, "context": ctx,
           "num_draft_tokens": n if mode == ForwardMode.TARGET_VERIFY else None,
           "new_tokens": n if mode == ForwardMode.EXTEND else None, "chains": args.chains,
           "static_bound": args.static_bound if mode != ForwardMode.EXTEND else None,
           "kv_bytes": kv_bytes, "floor_us": kv_bytes / args.bandwidth * 1e6, "us": {}, "plan_us": {}}
    for name in backends:
        if name == "torch_native" and torch_native_bytes(bs, ctx, n) > TORCH_NATIVE_MAX_BYTES:
            row["us"][name] = None
            continue
        registered, kwargs = VARIANTS.get(name, (name, {}))
        backend = create_attention_backend(registered, **kwargs)
        b = dataclasses.replace(batch, attn_backend=backend, attn_metadata=None)
        backend.init_forward_metadata(b)
        iters = args.iters if name != "torch_native" else max(3, args.iters // 5)
        if args.static_bound:
            try:
                row["plan_us"][name] = graph_us(lambda: backend.init_forward_metadata(b), reps=iters,
                                                warmup=args.warmup)
            except RuntimeError:  # a plan that reads host lengths: not capturable
                row["plan_us"][name] = None
            backend.init_forward_metadata(b)  # NOTE: metadata of its own, not the freed graph pool's
        call = lambda: backend.forward(q, k, v, layer, b)  # noqa: E731
        row["us"][name] = event_us(call, reps=iters, warmup=args.warmup)
        if name != "torch_native":  # after its first call forward plans nothing on the host: capturable
            try:
                row["us"][f"{name}_graph"] = graph_us(call, reps=iters, warmup=args.warmup)
            except RuntimeError as e:  # a library whose run cannot be captured: say so, keep the eager time
                row["us"][f"{name}_graph"] = None
                row.setdefault("graph_errors", {})[name] = str(e).splitlines()[0][:200]
        del b, backend
    torch.cuda.empty_cache()
    return row


def markdown(rows: list[dict], backends: list[str], bandwidth: float) -> str:
    """One row per case: the floor, each backend's eager and graph time, and how each compares with triton."""
    others = [b for b in backends if b not in ("triton", "torch_native")]
    head = ["mode", "bs", "ctx", "N", "KV MB", "floor us", "triton us", "triton graph us"]
    for b in others:
        head += [f"{b} us", f"{b} graph us"]
    head += ["torch_native us"] if "torch_native" in backends else []
    head += ["triton graph / floor"] + [f"triton / {b} (graph)" for b in others]
    planned = [b for b in backends if any(r["plan_us"].get(b) is not None for r in rows)]
    head += [f"{b} plan us" for b in planned]
    lines = [f"Copy bandwidth (read + write): {bandwidth / 1e9:.0f} GB/s. Llama-3-8B heads (32/8/128), bf16, "
             "page_size 1, one layer's `forward` (K/V write + attention). `us`: eager call, launch overhead "
             "included; `graph us`: CUDA-graph replay (GPU time). `triton / x (graph)` divides the graph "
             "times: > 1 means x is faster than triton; `plan us`: a forward's plan under `--static-bound`, "
             "replayed.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def fmt(x, spec):
        return "-" if x is None else format(x, spec)

    for r in rows:
        us = r["us"]
        t, g = us.get("triton"), us.get("triton_graph")
        cells = [r["mode"], str(r["bs"]), str(r["context"]), fmt(r["num_draft_tokens"] or r["new_tokens"], "d"),
                 f"{r['kv_bytes'] / 1e6:.1f}", f"{r['floor_us']:.1f}", fmt(t, ".1f"), fmt(g, ".1f")]
        for b in others:
            cells += [fmt(us.get(b), ".1f"), fmt(us.get(f"{b}_graph"), ".1f")]
        cells += [fmt(us.get("torch_native"), ".1f")] if "torch_native" in backends else []
        cells += [fmt(g / r["floor_us"] if g else None, ".2f")]
        cells += [fmt(g / us[f"{b}_graph"] if g and us.get(f"{b}_graph") else None, ".2f") for b in others]
        cells += [fmt(r["plan_us"].get(b), ".1f") for b in planned]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/results/attention"))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--backends", nargs="+", default=None,
                        help="backends to measure (default: every available one; triton always runs as the baseline)")
    parser.add_argument("--static-bound", type=int, default=None, metavar="L",
                        help="plan as a CUDA graph does, for lengths up to L (with --backends among "
                             f"{', '.join(TRITON_NAMES)})")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES), help="requests per call")
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS),
                        help="cached tokens per request")
    parser.add_argument("--tree-sizes", type=int, nargs="+", default=list(TREE_SIZES),
                        help="TARGET_VERIFY node counts (0 alone: decode only)")
    parser.add_argument("--chains", action="store_true", help="verify chains, not random trees")
    parser.add_argument("--prefill", type=int, nargs="+", default=[], metavar="Q",
                        help="also EXTEND: Q new prompt tokens a request over the context as a cached prefix")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention needs a CUDA device")
    static_ok = args.backends and set(args.backends) <= set(TRITON_NAMES)  # NOTE: the default list holds others
    if args.static_bound is not None and (args.static_bound < 1 or not static_ok):
        raise SystemExit(f"--static-bound: a length >= 1, with --backends among {', '.join(TRITON_NAMES)}")
    start = time.time()
    args.bandwidth = copy_bandwidth()
    wanted = args.backends or [b for b in ("torch_native", "flashinfer", "fa3") if b in available_backends()]
    backends = ["triton"] + [b for b in wanted if b != "triton"]
    cases = [(ForwardMode.DECODE, bs, ctx, 1) for bs in args.batch_sizes for ctx in args.contexts]
    cases += [(ForwardMode.TARGET_VERIFY, bs, ctx, n)
              for bs in args.batch_sizes for ctx in args.contexts for n in args.tree_sizes if n > 0]
    cases += [(ForwardMode.EXTEND, bs, ctx, n)
              for bs in args.batch_sizes for ctx in args.contexts for n in args.prefill]
    rows = [bench_case(*case, backends, args) for case in progress(cases, desc="attention", unit="cases")]
    args.output_dir.mkdir(parents=True, exist_ok=True)
    result = {**run_metadata(),
              "copy_bandwidth_bytes_per_s": args.bandwidth, "backends": backends,
              "heads": {"num_heads": HQ, "num_kv_heads": HKV, "head_dim": D}, "dtype": str(DTYPE),
              "page_size": 1, "libraries": library_versions(), "rows": rows, "wall_s": time.time() - start}
    (args.output_dir / "bench_attention.json").write_text(json.dumps(result, indent=1))
    table = markdown(rows, backends, args.bandwidth)
    (args.output_dir / "bench_attention.md").write_text(
        f"# Attention microbenchmark ({result['device']})\n\n{metadata_line(result)}"
        f"{''.join(f' · {k} {v}' for k, v in result['libraries'].items())}\n\n" + table)
    print(table)
    print(f"wrote {args.output_dir} in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
