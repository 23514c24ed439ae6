"""Chain drafts replayed on a model's greedy answers: tokens a drafted step for each lookup rule (CPU).

A chain drafter's acceptance does not depend on the device: given a request's greedy answer, each step
drafts k tokens from the history so far, the target accepts the longest prefix equal to the answer's
next tokens, and the history advances by that prefix plus the target's own token. This generates the
answers with specdec (plain decoding, CPU) and replays three rules on them, windows 1..4 and 1..12:

    vllm     the longest match up to max_n, its earliest occurrence (vLLM 0.26's ``ngram``, restated)
    latest   the longest match, its latest occurrence, cut at the history's end (``propose_ngram``)
    repeat   ``latest`` continued past the history's end (``repeat=True``: the vLLM drop-in's drafts)

    python benchmarks/ngram_chain_replay.py --model /tmp/gemma-bf16 --datasets translation,humaneval

(``--model``: a checkpoint ``benchmarks/peer/export_gguf.py`` exported; prompts as ``offline.py``'s lookup
workload renders them.) A diagnostic of the drafts, not a speed figure.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from specdec.ngram.lookup import propose_ngram


def earliest_longest(history: np.ndarray, *, min_n: int, max_n: int, k: int) -> np.ndarray:
    """vLLM's rule: the longest n <= max_n whose suffix occurs earlier, the draft after its first occurrence."""
    length, draft = history.shape[0], history[:0]
    for n in range(min_n, min(max_n, length - 1) + 1):
        suffix = history[length - n:]
        ends = [p for p in range(n - 1, length - 1) if np.array_equal(history[p - n + 1: p + 1], suffix)]
        if not ends:
            break
        draft = history[ends[0] + 1: ends[0] + 1 + k]
    return draft


RULES = {
    "vllm": earliest_longest,
    "latest": lambda h, **kw: propose_ngram(h, **kw),
    "repeat": lambda h, **kw: propose_ngram(h, repeat=True, **kw),
}


def tokens_per_drafted_step(answers: list[tuple[list[int], list[int]]], rule, *, min_n: int, max_n: int,
                            k: int) -> float:
    """Committed tokens per step that drafted (accepted draft tokens + the target's own), over every answer."""
    steps = committed = 0
    for prompt, answer in answers:
        sequence = np.array(prompt + answer, dtype=np.int64)
        known = len(prompt) + 1  # the first answer token comes from the prefill
        while known < len(sequence):
            draft = rule(sequence[:known], min_n=min_n, max_n=max_n, k=k)
            truth = sequence[known: known + len(draft)]
            accepted = int(np.cumprod(draft[:len(truth)] == truth).sum())
            if len(draft):
                steps, committed = steps + 1, committed + accepted + 1
            known += accepted + 1
    return committed / max(steps, 1)


def greedy_answers(model: str, dataset: str, *, num_prompts: int, max_tokens: int) -> list[tuple[list[int], list[int]]]:
    import specdec
    from specdec.engine.chat import render_user_prompt
    from specdec.engine.embedded import load_rows

    engine = specdec.Engine(model, device="cpu", attention_backend="torch_native")
    prompts = [engine.tokenizer.encode(render_user_prompt(engine.tokenizer, r["turns"][0]))
               for r in load_rows(dataset)[:num_prompts]]
    reqs = []
    for i, ids in enumerate(prompts):
        req = engine.make_request(input_ids=ids, rid=f"{dataset}-{i}",
                                  sampling_params={"temperature": 0, "max_new_tokens": max_tokens})
        engine.add_request(req)
        reqs.append(req)
    while not all(r.finished for r in reqs):
        engine.step()
    return [(ids, list(r.output_ids)) for ids, r in zip(prompts, reqs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--datasets", default="summarization,rag,translation,humaneval")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--output", help="JSON of every dataset's figures")
    args = parser.parse_args()
    results = {}
    for dataset in args.datasets.split(","):
        answers = greedy_answers(args.model, dataset, num_prompts=args.num_prompts, max_tokens=args.max_tokens)
        results[dataset] = {f"{name}[1,{max_n}]": tokens_per_drafted_step(answers, rule, min_n=1, max_n=max_n, k=args.k)
                            for max_n in (4, 12) for name, rule in RULES.items()}
        print(dataset, " ".join(f"{key} {value:.2f}" for key, value in results[dataset].items()), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
