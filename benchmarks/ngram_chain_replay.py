"""Chain drafts replayed on a model's greedy answers: tokens a drafted step for each lookup rule (CPU).

A chain drafter's acceptance does not depend on the device: given a request's greedy answer, each step
drafts k tokens from the history so far, the target accepts the longest prefix equal to the answer's
next tokens, and the history advances by that prefix plus the target's own token. This generates the
answers with specdec (plain decoding, CPU), or reads those a GPU run recorded, and replays three rules on
them, windows 1..4 and 1..12:

    vllm     the longest match up to max_n, its earliest occurrence (vLLM 0.26's ``ngram``, restated)
    latest   the longest match, its latest occurrence, cut at the history's end (``propose_ngram``)
    repeat   ``latest`` continued past the history's end (``repeat=True``: the vLLM drop-in's drafts, and
             the engine's NGRAM drafts)

    python benchmarks/ngram_chain_replay.py --model /tmp/gemma-bf16 --datasets translation,humaneval
    python benchmarks/ngram_chain_replay.py --answers answers.jsonl   # a GPU run's answers instead
    python benchmarks/ngram_chain_replay.py --engine vllm --concurrency 32 \
        --answers benchmarks/results/2026-12-01-h200-ngram-repeat/answers.jsonl.gz

(``--model``: a checkpoint ``benchmarks/peer/export_gguf.py`` exported; prompts as ``offline.py``'s lookup
workload renders them. ``--answers``: the prompts and greedy answers a plain run of ``offline.py --answers``
recorded, each workload's cells at ``--concurrency``.) A diagnostic of the drafts, not a speed figure.
"""

from __future__ import annotations

import argparse
import gzip
import json

import numpy as np

from specdec.ngram.lookup import propose_ngram

Answers = list[tuple[list[int], list[int]]]  # (prompt, greedy answer) token ids, a request each


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
    "latest": propose_ngram,
    "repeat": lambda h, **kw: propose_ngram(h, repeat=True, **kw),
}


def tokens_per_drafted_step(answers: Answers, rule, *, min_n: int, max_n: int, k: int) -> float:
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


def every_rule(answers: Answers, *, k: int) -> dict[str, float]:
    """Tokens a drafted step for each rule and window ("latest[1,4]": ``latest`` with min_n 1, max_n 4)."""
    return {f"{name}[1,{max_n}]": tokens_per_drafted_step(answers, rule, min_n=1, max_n=max_n, k=k)
            for max_n in (4, 12) for name, rule in RULES.items()}


def greedy_answers(model: str, dataset: str, *, num_prompts: int, max_tokens: int) -> Answers:
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


def recorded_answers(path: str, concurrency: int, engine: str | None = None) -> dict[str, Answers]:
    """Each workload's (prompt, answer) pairs from ``offline.py --answers`` lines at ``concurrency`` (of
    ``engine``'s plain run, or of every engine's); ``path`` may be gzipped (``.gz``: the committed records)."""
    sets: dict[str, Answers] = {}
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            cell = json.loads(line)
            if cell["concurrency"] == concurrency and engine in (None, cell["engine"]):
                sets.setdefault(cell["workload"], []).extend(zip(cell["prompts"], cell["answers"]))
    return sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="generate the answers: this checkpoint, plain decoding on CPU")
    source.add_argument("--answers", help="replay the answers offline.py --answers recorded")
    parser.add_argument("--concurrency", type=int, default=1, help="--answers: the cells of this concurrency")
    parser.add_argument("--engine", choices=["specdec", "vllm"], help="--answers: this engine's answers only")
    parser.add_argument("--datasets", default="summarization,rag,translation,humaneval")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--output", help="JSON of every dataset's figures")
    args = parser.parse_args()
    if args.answers:
        sets = recorded_answers(args.answers, args.concurrency, args.engine)
    else:
        sets = {dataset: greedy_answers(args.model, dataset, num_prompts=args.num_prompts, max_tokens=args.max_tokens)
                for dataset in args.datasets.split(",")}
    results = {}
    for set_name, answers in sets.items():
        results[set_name] = every_rule(answers, k=args.k)
        print(set_name, " ".join(f"{key} {value:.2f}" for key, value in results[set_name].items()), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
