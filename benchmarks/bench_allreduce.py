"""All-reduce latency on two or more GPUs (--world-size) by message size: NCCL's ring against the
one-shot kernels over peer memory (specdec.models.all_reduce: torch's and our push kernel), each
replayed from a CUDA graph of back-to-back calls, as a decode step replays them. Tells where the
one-shot paths stop paying (ONE_SHOT_MAX_BYTES, PUSH_MAX_BYTES) and, from three GPUs on, where the push
kernel's two-shot mode overtakes its one-shot mode (TWO_SHOT_MIN_BYTES): "push" is the push kernel
held one-shot, "push two-shot" the same kernel held two-shot, each on buffers of its own.

    python benchmarks/bench_allreduce.py --output out/allreduce.json   # writes allreduce.md beside it
    python benchmarks/bench_allreduce.py --world-size 4 --output out/allreduce_tp4.json

bf16 messages of 1 KiB to 16 MiB (an 8B model's decode step all-reduces bs x 4096 x 2 bytes: 8 KiB
at bs 1, 1 MiB at bs 128; its verify step N times that); per size the median over --reps replays of
--calls calls, per call, on rank 0. "saved per 8B step" = 65 all-reduces a step (two a layer, one
for the embedding) x (NCCL - one-shot) at the decode sizes.
"""

from __future__ import annotations

import argparse
import gc
import json
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common import metadata_line, run_metadata
from specdec.bench.device_timing import graph_us
from specdec.models.all_reduce import ONE_SHOT_MAX_BYTES, TWO_SHOT_MIN_BYTES, DistAllReduce, choose_all_reduce

SIZES = [1 << k for k in range(10, 25)]  # 1 KiB .. 16 MiB
PUSH_MAX_BYTES = 4 << 20  # the push kernel's largest message (its MAX_PROGRAMS); NCCL's beyond
HIDDEN, CALLS_PER_STEP = 4096, 65  # Llama-3.1-8B


def peer_all_reduce(rank: int, args, kernel: str, max_bytes: int, two_shot_min_bytes: int = TWO_SHOT_MIN_BYTES):
    """A peer-memory all-reduce on buffers of its own (collective: every rank at once)."""
    reduce = choose_all_reduce(None, f"cuda:{rank}", size=args.world_size, enabled=True, single_host=True,
                               peers=list(range(args.world_size)), max_bytes=max_bytes, kernel=kernel,
                               two_shot_min_bytes=two_shot_min_bytes)
    if reduce.name != {"torch": "one-shot", "push": "push"}[kernel]:
        raise RuntimeError("the one-shot all-reduce is unavailable here (the warning above says why)")
    return reduce


def measure(rank: int, args) -> list[dict]:
    """Per size: microseconds per call, NCCL and one-shot (the one-shot buffer as large as the largest
    size), the push kernel one-shot and (from three GPUs on) two-shot."""
    one_shot = peer_all_reduce(rank, args, "torch", max(SIZES))
    pushes = {"push": peer_all_reduce(rank, args, "push", PUSH_MAX_BYTES, two_shot_min_bytes=PUSH_MAX_BYTES + 1)}
    if args.world_size >= 3:  # NOTE: with two ranks PushAllReduce never goes two-shot
        pushes["push_two_shot"] = peer_all_reduce(rank, args, "push", PUSH_MAX_BYTES, two_shot_min_bytes=0)
    nccl = DistAllReduce()
    args.fused_copy = one_shot.fused
    rows = []
    for size in SIZES:
        x = torch.randn(size // 2, device="cuda").to(torch.bfloat16)
        row = {"bytes": size, "dtype": "bfloat16"}
        for name, reduce in (("nccl", nccl), ("one_shot", one_shot), *pushes.items()):
            # as a layer calls them: NCCL in place (the values grow to inf, which costs it nothing),
            # one-shot out of place
            row[f"{name}_us"] = graph_us(lambda: reduce(x), reps=args.reps, calls=args.calls)
        row["one_shot_over_nccl"] = row["one_shot_us"] / row["nccl_us"]
        row["push_over_one_shot"] = row["push_us"] / row["one_shot_us"]
        if "push_two_shot_us" in row:
            row["two_shot_over_push"] = row["push_two_shot_us"] / row["push_us"]
        if size % (2 * HIDDEN) == 0 and size // (2 * HIDDEN) <= 256:
            row["decode_bs_8b"] = size // (2 * HIDDEN)
            row["saved_us_per_8b_step"] = CALLS_PER_STEP * (row["nccl_us"] - row["one_shot_us"])
        rows.append(row)
        if rank == 0:
            two_shot = f"  push two-shot {row['push_two_shot_us']:7.2f} us" if "push_two_shot_us" in row else ""
            print(f"{size:>9} B  nccl {row['nccl_us']:7.2f} us  one-shot {row['one_shot_us']:7.2f} us  "
                  f"({row['one_shot_over_nccl']:.2f}x)  push {row['push_us']:7.2f} us{two_shot}", flush=True)
    return rows


def rank_main(rank: int, port: int, args) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.world_size)
    dist.all_reduce(torch.zeros(1, device="cuda"))  # the communicator, before any capture
    rows = measure(rank, args)
    if rank == 0:
        write(rows, args)
    gc.collect()  # NOTE: no graph that captured NCCL may outlive the process group (pytorch/pytorch#115388)
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()


def write(rows: list[dict], args) -> None:
    slower = [r["bytes"] for r in rows if r["one_shot_us"] >= r["nccl_us"]]
    # within the push kernel's range (beyond it both push columns are NCCL's)
    two_shot_faster = [r["bytes"] for r in rows if r.get("two_shot_over_push", 1) < 1 and r["bytes"] <= PUSH_MAX_BYTES]
    result = {**run_metadata(), "world_size": args.world_size, "calls_per_graph": args.calls, "reps": args.reps,
              "fused_copy": args.fused_copy,
              "one_shot_max_bytes": ONE_SHOT_MAX_BYTES, "first_size_one_shot_not_faster": min(slower, default=None),
              "two_shot_min_bytes": TWO_SHOT_MIN_BYTES,
              "first_size_two_shot_faster": min(two_shot_faster, default=None),
              "rows": rows}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    lines = [f"# All-reduce latency, {args.world_size} GPUs, bf16, graph-replayed\n\n{metadata_line(result)}\n",
             "| bytes | 8B decode bs | NCCL us | one-shot us | push us | push two-shot us | one-shot / NCCL | "
             "push / one-shot | two-shot / push | saved us per 8B step |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        saved = f"{r['saved_us_per_8b_step']:.0f}" if "saved_us_per_8b_step" in r else ""
        two_shot, ratio = (f"{r['push_two_shot_us']:.2f}", f"{r['two_shot_over_push']:.2f}") \
            if "push_two_shot_us" in r else ("", "")
        lines.append(f"| {r['bytes']} | {r.get('decode_bs_8b', '')} | {r['nccl_us']:.2f} | {r['one_shot_us']:.2f} | "
                     f"{r['push_us']:.2f} | {two_shot} | {r['one_shot_over_nccl']:.2f} | "
                     f"{r['push_over_one_shot']:.2f} | {ratio} | {saved} |")
    lines.append(f"\nOne-shot threshold in use: {ONE_SHOT_MAX_BYTES} bytes; first size where one-shot is not "
                 f"faster: {result['first_size_one_shot_not_faster']}.")
    if args.world_size >= 3:
        lines.append(f"Push two-shot threshold in use: {TWO_SHOT_MIN_BYTES} bytes; first size where two-shot is "
                     f"faster than push one-shot: {result['first_size_two_shot_faster']}.")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="JSON file (a markdown table is written beside it)")
    parser.add_argument("--reps", type=int, default=20, help="graph replays timed per size and path")
    parser.add_argument("--calls", type=int, default=32, help="all-reduces per captured graph")
    parser.add_argument("--world-size", type=int, default=2, help="GPUs (ranks), one process each")
    args = parser.parse_args()
    if not 2 <= args.world_size <= torch.cuda.device_count():
        raise SystemExit(f"--world-size {args.world_size}: this host has {torch.cuda.device_count()} GPUs (2 at least)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(port, args), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
