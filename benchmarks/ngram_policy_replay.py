"""NGRAM's choice replayed on CPU: the real model's drafts and acceptance, a GPU's step times modeled.

At one request a small model's NGRAM step on a GPU costs what its host work and kernel launches cost, which
a CPU run does not reproduce; its acceptance does not depend on the device. This runs the engine on CPU
(greedy, overlap and adaptive on, as served) with a fake clock for the policy: each decode step advances it
by the modeled time of what it ran, so the policy learns the GPU's step times while the model's tokens are
real (a prefill step counts a plain step's time). Every prompt is run three times: every step plain, every
step a lookup of the largest size, and the policy's choice; their modeled tokens a millisecond against plain
decoding's are the figures.

    python benchmarks/ngram_policy_replay.py --model /tmp/smollm2-bf16 --datasets summarization,humaneval

(``--model``: SmolLM2-135M-Instruct exported to bf16, ``benchmarks/peer/export_gguf.py``; defaults: the H200's
step times of SmolLM2-135M at one request, 2026-11-30: plain 0.89 ms, a verify of n nodes 1.05 + 0.0125 n ms.)
A diagnostic of the policy, not a speed figure: those are measured on the device (scripts/gpu_peer.sh lookup).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "peer"))

import offline  # noqa: E402  (benchmarks/peer/offline.py: the engine wrapper and the prompt sets)

from specdec.eagle import served  # noqa: E402
from specdec.ngram import worker as ngram_worker  # noqa: E402
from specdec.ngram.worker import LOOK_UP_EVERY_STEP, MISS  # noqa: E402


class FakeClock:
    """``time`` for the policy's modules: ``perf_counter`` reads the modeled time (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the target's directory (safetensors + tokenizer)")
    parser.add_argument("--datasets", default="summarization,humaneval")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--plain-ms", type=float, default=0.89, help="a plain decode step")
    parser.add_argument("--verify-ms", type=float, default=1.05, help="a verify step, before its nodes")
    parser.add_argument("--node-ms", type=float, default=0.0125, help="a verify step's cost a node")
    args = parser.parse_args()

    def step_ms(choice: str | None) -> float:
        if choice is None or choice == "plain":
            return args.plain_ms
        if choice == MISS:
            return args.verify_ms
        return args.verify_ms + args.node_ms * int(choice.removeprefix("ngram"))

    clock = FakeClock()
    ngram_worker.time, served.time = clock, clock  # the launch clock and the choice's timestamps
    engine = offline.SpecdecEngine(args.model, config="ngram", head=None, dummy=False, overlap_schedule=True,
                                   speculative_adaptive="on")
    worker = engine.engine.worker
    for dataset in args.datasets.split(","):
        prompts = offline.dataset_prompts(engine, args.model, dataset, num_prompts=args.num_prompts,
                                          max_tokens=args.max_tokens, turn1_cache=Path("/tmp/turn1.json"))
        results = {}
        for label, force in [("plain", 0), ("lookup", LOOK_UP_EVERY_STEP), ("auto", None)]:
            worker.force = force
            steps: dict[str, int] = {}
            answers = []
            for i, ids in enumerate(prompts):
                rid = f"{dataset}-{label}-{i}"
                engine.add(rid, ids, args.max_tokens, ignore_eos=False)
                req = engine.reqs[rid]
                while not req.finished:
                    engine.engine.scheduler.step()
                    last = worker._clock._last  # the step this call launched: (choice, bs, ...)
                    choice = last[0] if last is not None else None
                    clock.now += step_ms(choice) / 1e3
                    steps[choice or "prefill"] = steps.get(choice or "prefill", 0) + 1
                answers.append(list(req.output_ids))
            ms = sum(step_ms(None if k == "prefill" else k) * n for k, n in steps.items())
            results[label] = (sum(map(len, answers)) / ms, answers, steps)
        base, plain_answers = results["plain"][0], results["plain"][1]
        for label, (rate, answers, steps) in results.items():
            same = "greedy equal to plain" if answers == plain_answers else "ANSWERS DIFFER FROM PLAIN"
            print(f"{dataset} {label}: {rate:.3f} tok/ms modeled, {rate / base:.2f}x plain; {same}; steps {steps}",
                  flush=True)
        if worker.policy is not None:
            learned = ", ".join(f"{k} {v:.2f}" for k, v in worker.policy.explain(1).items())
            print(f"{dataset} policy at bs=1: {learned}", flush=True)


if __name__ == "__main__":
    main()
