"""GPU microbenchmark of the speculative ops: Triton vs the torch reference on the same GPU and inputs,
and vs each op's memory floor (tensor bytes read + written / measured device copy bandwidth).

    python benchmarks/bench_kernels.py --output-dir benchmarks/results/kernels

Writes kernels.json and kernels.md. Times are CUDA-event medians after warm-up, of the eager call and
of a CUDA-graph replay of it (which also proves the op captures: no host sync inside). A graph of one
call still includes the graph launch's own latency (several µs; what a trivial op shows), so a second
graph replays AMORTIZED calls back to back and reports the time per call: the op's device time, which
is what its floor ratio is about. The reference ops plan on the host (``.tolist()``), so their time
includes those syncs: that is what they cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from common import metadata_line, run_metadata
from specdec import kernels as K
from specdec.bench.device_timing import copy_bandwidth, event_us, graph_us

BATCHES = (1, 16, 64, 256)
NODES = (8, 64)
VOCABS = (32000, 128256)
# (topk, depth) with enough candidates for N nodes
TREE = {8: (4, 3), 64: (8, 6)}


AMORTIZED = 8  # calls per graph for the device-time column


def replay_us(fn, *, reps: int, calls: int = 1) -> float | None:
    """``graph_us``, or None where ``fn`` cannot be captured."""
    try:
        return graph_us(fn, reps=reps, calls=calls, warmup=1)
    except RuntimeError:
        return None


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def tree_inputs(bs: int, n: int):
    """A random draft tree per request (ascending selection closed under parents), on the GPU."""
    topk, depth = TREE[n]
    g = torch.Generator().manual_seed(bs * 1000 + n)
    parent_list, selected = [], []
    for _ in range(bs):
        parents, prev, parent_of = [-1], list(range(topk)), {s: -1 for s in range(topk)}
        for i in range(1, depth):
            frontier = [prev[j] for j in torch.randperm(len(prev), generator=g)[:topk].tolist()]
            prev = []
            for r, f in enumerate(frontier):
                parents.append(f)
                for c in range(topk):
                    s = topk + (i - 1) * topk * topk + r * topk + c
                    parent_of[s], prev = f, prev + [s]
        chosen, avail = [], sorted(s for s, p in parent_of.items() if p == -1)
        while len(chosen) < n - 1:
            s = avail.pop(int(torch.randint(len(avail), (1,), generator=g)))
            chosen.append(s)
            avail = sorted(set(avail) | {c for c, p in parent_of.items() if p == s})
        parent_list.append(parents)
        selected.append(sorted(chosen))
    seq_lens = torch.randint(100, 2000, (bs,), generator=g)
    return (torch.tensor(parent_list).cuda(), torch.tensor(selected).cuda().view(bs, n - 1), seq_lens.cuda(),
            topk, depth)


def tree_outputs(bs: int, n: int):
    mask = torch.empty(bs * n * n, dtype=torch.bool, device="cuda")
    positions = torch.empty(bs * n, dtype=torch.int64, device="cuda")
    links = [torch.full((bs, n), -1, dtype=torch.int64, device="cuda") for _ in range(3)]
    return mask, positions, links


def cases():
    """(op, shape label, triton fn, ref fn or None, floor bytes) for every benchmarked shape."""
    for n in NODES:
        for bs in BATCHES:
            parent_list, selected, seq_lens, topk, depth = tree_inputs(bs, n)
            mask, positions, links = tree_outputs(bs, n)
            args = (parent_list, selected, seq_lens, mask, positions, *links, topk, depth, n, 1)
            floor = nbytes(parent_list, selected, seq_lens, mask, positions, *links)
            yield ("build_tree_kernel_efficient", dict(bs=bs, N=n),
                   lambda a=args: K.build_tree_kernel_efficient(*a),
                   lambda a=args: K.build_tree_kernel_efficient_ref(*a), floor)
            K.build_tree_kernel_efficient(*args)
            rargs = (mask, seq_lens, positions, *links, bs, n)
            yield ("reconstruct_indices_from_tree_mask", dict(bs=bs, N=n),
                   lambda a=rargs: K.reconstruct_indices_from_tree_mask(*a),
                   lambda a=rargs: K.reconstruct_indices_from_tree_mask_ref(*a), nbytes(mask, seq_lens, positions, *links))
            candidates = torch.randint(0, 4, (bs, n), device="cuda")
            target = torch.randint(0, 4, (bs, n), device="cuda")
            outs = (torch.empty(bs * n, dtype=torch.int32, device="cuda"),
                    torch.full((bs, depth + 1), -1, dtype=torch.int32, device="cuda"),
                    torch.empty(bs, dtype=torch.int32, device="cuda"))
            vargs = (*outs, candidates, *links, target)
            yield ("verify_tree_greedy", dict(bs=bs, N=n), lambda a=vargs: K.verify_tree_greedy(*a),
                   lambda a=vargs: K.verify_tree_greedy_ref(*a), nbytes(*vargs))
            for vocab in VOCABS:
                if n == 64 and bs == 256:  # 2 x 8.4 GB of probabilities; the op reads 2 rows per request
                    continue
                probs = torch.rand(bs, n, vocab, device="cuda")
                probs /= probs.sum(-1, keepdim=True)
                draft = torch.zeros_like(probs)
                sargs = (*outs, candidates, *links, torch.rand(bs, n, device="cuda"), torch.rand(bs, device="cuda"),
                         probs, draft)
                small = probs.numel() * 4 < 2**30  # the ref copies target_probs to the host
                # floor: the bonus draw reads target and draft probs of each request's last node once
                # (2 fp32 rows); the walk's few scattered reads and the [bs, N] index tensors are noise
                yield ("tree_speculative_sampling_target_only", dict(bs=bs, N=n, vocab=vocab),
                       lambda a=sargs: K.tree_speculative_sampling_target_only(*a),
                       (lambda a=sargs: K.tree_speculative_sampling_target_only_ref(*a)) if small else None,
                       bs * 2 * vocab * 4)
                del probs, draft, sargs
            bits = torch.rand(bs * n * n, device="cuda") < 0.5
            in_ptr = torch.arange(0, bs + 1, device="cuda", dtype=torch.int32) * (n * n)
            out_ptr = torch.arange(0, bs + 1, device="cuda", dtype=torch.int32) * ((n * n + 7) // 8)
            y = torch.empty(int(out_ptr[-1]), dtype=torch.uint8, device="cuda")
            pargs = (bits, in_ptr, out_ptr, y, bs)
            yield ("segment_packbits", dict(bs=bs, N=n), lambda a=pargs: K.segment_packbits(*a),
                   lambda a=pargs: K.segment_packbits_ref(*a), nbytes(bits, y))
    for bs in BATCHES:
        ctx = 4096
        table = torch.randint(0, 2**30, (bs, ctx), dtype=torch.int32, device="cuda")
        rows = torch.arange(bs, device="cuda")
        lens = torch.randint(1000, 3000, (bs,), device="cuda")
        indptr = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), lens.cumsum(0)]).to(torch.int32)
        kv = torch.empty(int(lens.sum()), dtype=torch.int32, device="cuda")
        kargs = (table, rows, lens, indptr, None, kv)
        yield ("create_kv_indices", dict(bs=bs, seq_len="1000-3000"), lambda a=kargs: K.create_kv_indices(*a),
               lambda a=kargs: K.create_kv_indices_ref(*a), 2 * nbytes(kv))
        n = 8
        starts = lens
        loc = torch.randint(0, 2**30, (bs * n,), device="cuda")
        aargs = (table, rows, starts, starts + n, loc)
        yield ("assign_req_to_token", dict(bs=bs, N=n), lambda a=aargs: K.assign_req_to_token(*a),
               lambda a=aargs: K.assign_req_to_token_ref(*a), nbytes(loc) + bs * n * 4)
        accept = (torch.arange(bs, device="cuda")[:, None] * n + torch.arange(4, device="cuda")).to(torch.int32)
        outs = [torch.empty(bs, 4, dtype=torch.int64, device="cuda") for _ in range(3)]
        cargs = (table, rows, lens, accept, torch.full((bs,), 3, dtype=torch.int32, device="cuda"), *outs)
        yield ("compact_accepted_kv_locs", dict(bs=bs, N=n),
               lambda a=cargs: K.compact_accepted_kv_locs(*a, num_draft_tokens=n),
               lambda a=cargs: K.compact_accepted_kv_locs_ref(*a, num_draft_tokens=n), nbytes(accept, *outs))
    yield from ngram_cases()


def ngram_cases():
    """The n-gram drafter's device lookup over long histories, split over programs (the default) and in one
    program a request (``span`` = the table's width): floor = each history token's slot and id read once."""
    for bs in (1, 32):
        for ctx in (1024, 8192, 32768):
            table = torch.randperm(bs * ctx, device="cuda").view(bs, ctx).to(torch.int32)
            slot_tokens = torch.randint(0, 64, (bs * ctx,), device="cuda")  # a small vocabulary: many matches
            lens = torch.full((bs,), ctx - 1, device="cuda")
            largs = dict(slot_tokens=slot_tokens, req_to_token=table, req_pool_indices=torch.arange(bs, device="cuda"),
                         seq_lens=lens, roots=torch.randint(0, 64, (bs,), device="cuda"),
                         chains=torch.empty(bs, 9, dtype=torch.int64, device="cuda"),
                         draft_lens=torch.empty(bs, dtype=torch.int64, device="cuda"), min_n=1, max_n=12)
            merge = K.ngram_merge_buffer(bs, "cuda")
            for split, span in (("default", None), ("one program", ctx)):
                yield ("ngram_match", dict(bs=bs, ctx=ctx, split=split),
                       lambda a=largs, sp=span, m=merge: K.ngram_match(**a, span=sp, merge=m),
                       (lambda a=largs: K.ngram_match_ref(**a)) if bs == 1 and split == "default" else None,
                       bs * ctx * (4 + 8))


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}x" if x < 10 else f"{x:.0f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernels needs a CUDA device")
    torch.manual_seed(0)
    bandwidth = copy_bandwidth()
    rows, t0 = [], time.time()
    for i, (op, shape, ours, ref, floor_bytes) in enumerate(cases()):
        triton_us = event_us(ours, reps=args.reps)
        one_us = replay_us(ours, reps=args.reps)
        device_us = replay_us(ours, reps=args.reps, calls=AMORTIZED) if one_us else None
        ref_us = event_us(ref, reps=3, warmup=1) if ref is not None else None
        floor_us = floor_bytes / bandwidth * 1e6
        rows.append(dict(op=op, shape=shape, triton_us=triton_us, graph_us=one_us, device_us=device_us,
                         ref_us=ref_us, floor_us=floor_us, speedup_vs_ref=ref_us / triton_us if ref_us else None,
                         graph_x_floor=one_us / floor_us if one_us else None,
                         device_x_floor=device_us / floor_us if device_us else None))
        print(f"\r[{i + 1} cases, {time.time() - t0:5.1f} s] {op} {shape}" + " " * 20, end="", file=sys.stderr)
    print(file=sys.stderr)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(**run_metadata(), copy_bandwidth_GBps=bandwidth / 1e9)
    (args.output_dir / "kernels.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [f"# Kernel microbenchmark ({meta['device']}, copy bandwidth {bandwidth / 1e9:.0f} GB/s)", "",
             metadata_line(meta), "",
             "triton = eager call (host launch included); graph = CUDA-graph replay of one call (graph launch "
             f"latency included); device = per call of {AMORTIZED} calls replayed from one graph.", "",
             "| op | shape | triton µs | graph µs | device µs | ref µs | speedup | floor µs | graph / floor "
             "| device / floor |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ref = f"{r['ref_us']:.1f}" if r["ref_us"] else "-"
        shape = " ".join(f"{k}={v}" for k, v in r["shape"].items())
        graph = f"{r['graph_us']:.1f}" if r["graph_us"] else "capture failed"
        device = f"{r['device_us']:.1f}" if r["device_us"] else "-"
        lines.append(f"| {r['op']} | {shape} | {r['triton_us']:.1f} | {graph} | {device} | {ref} | "
                     f"{ratio(r['speedup_vs_ref'])} | {r['floor_us']:.2f} | {ratio(r['graph_x_floor'])} | "
                     f"{ratio(r['device_x_floor'])} |")
    (args.output_dir / "kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
