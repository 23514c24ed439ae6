"""Measure trained heads: acceptance length over a grid, and teacher-forced accuracy on evaluation answers.

    python -m specdec.cli.train evaluate --model-path SmolLM2-135M-Instruct.Q4_1.gguf \\
        --heads specdec/data/smollm2/eagle3_head,specdec/data/smollm2/eagle_head --output grid.json

Acceptance grid (the protocol of ``benchmarks/results/2026-11-22-smollm2*.md``): for every head,
tree shape (steps, topk, draft tokens), temperature and dataset, the first ``--num-prompts``
prompts of ``specdec/data/prompts/<dataset>.jsonl`` (turn 1, rendered with the chat template) run
as one batch through ``specdec.Engine`` (``ignore_eos``, ``--max-new-tokens``, random seed 0, a
fresh engine per cell so that no cell depends on another). Acceptance length = tokens committed
per verify step (accepted + bonus), over all verify steps of the cell.

``--stop-at-eos`` is EAGLE's own protocol instead: answers end at the target's end of turn (or
``--max-new-tokens``), so nothing is measured on text the model writes past its answer; with
``--num-prompts 80`` it covers a whole benchmark file. ``--device cuda`` runs the cells on a GPU
(Triton attention by default; acceptance does not depend on the device beyond float rounding).

``--answer-accuracy N``: the target answers the first N prompts of each dataset greedily
(``--max-new-tokens``), and each head's teacher-forced top-1 accuracy per draft step is measured
on those answers (response positions only, as the trainer's held-out figure).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from specdec.engine.args import flag

SHAPES = ((3, 1, 4), (5, 4, 8), (6, 8, 32))


def _parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = [tuple(int(x) for x in part.split(",")) for part in text.split(":") if part.strip()]
    if not shapes or any(len(s) != 3 for s in shapes):
        raise ValueError(f"--shapes {text!r}: expected steps,topk,draft_tokens[:...]")
    return shapes


def acceptance_cell(target, head, tokenizer, algorithm: str, prompts: list[str], shape: tuple[int, int, int], *,
                    temperature: float, max_new_tokens: int, stop_at_eos: bool = False, device: str = "cpu",
                    attention_backend: str = "torch_native") -> dict:
    from specdec.engine.engine import Engine

    steps, topk, draft_tokens = shape
    engine = Engine(target_model=target, draft_model=head, tokenizer=tokenizer, speculative_algorithm=algorithm,
                    speculative_num_steps=steps, speculative_eagle_topk=topk,
                    speculative_num_draft_tokens=draft_tokens, max_running_requests=len(prompts), random_seed=0,
                    device=device, attention_backend=attention_backend, disable_cuda_graph=True)
    params = {"temperature": temperature, "max_new_tokens": max_new_tokens, "ignore_eos": not stop_at_eos}
    start = time.perf_counter()
    results = engine.generate(prompts, [params] * len(prompts))
    committed = [k + 1 for r in results for k in r["meta_info"]["spec_accept_lengths"]]
    return {"acceptance_length": round(sum(committed) / len(committed), 3), "verify_steps": len(committed),
            "completion_tokens": sum(r["meta_info"]["completion_tokens"] for r in results),
            "seconds": round(time.perf_counter() - start, 2)}


def answer_accuracy(target, heads: dict, prompt_ids: list[list[int]], max_new_tokens: int) -> dict:
    """Teacher-forced top-1 accuracy per draft step of each head on the target's greedy answers."""
    from specdec.train.generate import GenerateSettings, generate
    from specdec.train.trainer import DraftTrainer, TrainConfig

    answers = generate(target, prompt_ids, GenerateSettings(temperature=0, max_new_tokens=max_new_tokens,
                                                            batch_size=16))
    seqs = [p + a for p, a in zip(prompt_ids, answers)]
    starts = [len(p) for p in prompt_ids]
    out = {}
    for name, (algorithm, head, head_target) in heads.items():
        steps = 5 if algorithm == "EAGLE3" else 2
        trainer = DraftTrainer(head_target, head, TrainConfig(algorithm=algorithm, batch_size=8, ttt_steps=steps),
                               seqs, train_starts=starts)
        out[name] = [round(a, 4) for a in trainer.evaluate(seqs, starts).accuracy()]
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvaluateSettings:
    """What to measure (one field a flag of ``python -m specdec.cli.train evaluate``)."""

    model_path: str = dataclasses.field(metadata=flag("the target the heads draft for"))
    heads: str = dataclasses.field(metadata=flag("comma-separated draft head directories"))
    datasets: str = dataclasses.field(default="mt_bench,humaneval,gsm8k", metadata=flag(
        "comma-separated prompt sets"))
    shapes: str = dataclasses.field(default=":".join(",".join(map(str, s)) for s in SHAPES), metadata=flag(
        "steps,topk,draft_tokens[:...] (default 3,1,4:5,4,8:6,8,32)"))
    temperatures: str = dataclasses.field(default="0,1", metadata=flag("comma-separated temperatures"))
    num_prompts: int = dataclasses.field(default=10, metadata=flag("prompts per cell"))
    max_new_tokens: int = dataclasses.field(default=64, metadata=flag("longest answer"))
    answer_accuracy: int = dataclasses.field(default=0, metadata=flag(
        "prompts per dataset for teacher-forced accuracy"))
    output: str | None = dataclasses.field(default=None, metadata=flag("write the results as JSON"))
    stop_at_eos: bool = dataclasses.field(default=False, metadata=flag(
        "answers end at the end of turn (EAGLE's protocol) instead of ignore_eos"))
    device: str = dataclasses.field(default="cpu", metadata=flag("cpu or cuda[:N]"))
    attention_backend: str | None = dataclasses.field(default=None, metadata=flag(
        "default: torch_native on CPU, triton on CUDA"))
    num_threads: int | None = dataclasses.field(default=None, metadata=flag("torch CPU threads"))

    def __post_init__(self) -> None:
        _parse_shapes(self.shapes)


def evaluate(args: EvaluateSettings) -> dict:
    """The acceptance grid (and, with ``answer_accuracy``, the teacher-forced accuracies)."""
    from specdec.engine.chat import has_chat_template, render_user_prompt
    from specdec.engine.embedded import load_prompts
    from specdec.models.loaders import draft_aux_hidden_layers, load_draft_head, load_target, read_num_layers
    from specdec.models.tokenizer import load_tokenizer

    backend = args.attention_backend or ("triton" if args.device.startswith("cuda") else "torch_native")
    if args.num_threads:
        torch.set_num_threads(args.num_threads)

    tokenizer = load_tokenizer(args.model_path)
    chat = has_chat_template(tokenizer)
    datasets = [d for d in args.datasets.split(",") if d]
    prompts = {d: [render_user_prompt(tokenizer, x) if chat else x
                   for x in load_prompts(d, max(args.num_prompts, args.answer_accuracy))] for d in datasets}
    layers = read_num_layers(args.model_path)
    heads = {}
    for path in (h for h in args.heads.split(",") if h):
        aux = draft_aux_hidden_layers(path, layers)
        target = load_target(args.model_path, aux_hidden_layers=aux, device=args.device)
        head = load_draft_head(path, target, device=args.device).eval()
        heads[path] = ("EAGLE3" if aux is not None else "EAGLE", head, target)
    rows = []
    for path, (algorithm, head, target) in heads.items():
        for shape in _parse_shapes(args.shapes):
            for temp in (float(t) for t in args.temperatures.split(",")):
                for d in datasets:
                    cell = acceptance_cell(target, head, tokenizer, algorithm, prompts[d][: args.num_prompts], shape,
                                           temperature=temp, max_new_tokens=args.max_new_tokens,
                                           stop_at_eos=args.stop_at_eos, device=args.device,
                                           attention_backend=backend)
                    rows.append({"head": path, "algorithm": algorithm, "dataset": d, "temperature": temp,
                                 "num_steps": shape[0], "topk": shape[1], "num_draft_tokens": shape[2], **cell})
                    print(json.dumps(rows[-1]), flush=True)
    result = {"protocol": {"num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
                           "chat_template": chat, "ignore_eos": not args.stop_at_eos, "random_seed": 0,
                           "batched": "all prompts of a cell at once", "device": args.device,
                           "attention_backend": backend}, "rows": rows}
    if args.answer_accuracy:
        result["answer_accuracy"] = {}
        for d in datasets:
            ids = [tokenizer.encode(x) for x in prompts[d][: args.answer_accuracy]]
            first = next(iter(heads.values()))[2]
            result["answer_accuracy"][d] = answer_accuracy(first, heads, ids, args.max_new_tokens)
            print(d, json.dumps(result["answer_accuracy"][d]), flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return result
