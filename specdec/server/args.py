"""Engine flags, SGLang's names: the one place argparse meets the engine's keyword arguments."""

from __future__ import annotations

import argparse
from pathlib import Path

from specdec.attention import available_backends

DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "data" / "stories260K" / "stories260K.bin")
DEFAULT_DRAFT = str(Path(__file__).resolve().parents[1] / "data" / "stories260K" / "eagle_head")


def add_engine_args(parser: argparse.ArgumentParser, *, default_model: str | None = None) -> None:
    g = parser.add_argument_group("model and engine")
    g.add_argument("--model-path", default=default_model,
                   help="target model: HF directory (config.json + safetensors) or llama2.c .bin"
                   + (" (default: the embedded stories260K)" if default_model else ""))
    g.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    g.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16 (auto: bf16 on GPU, fp32 on CPU)")
    g.add_argument("--attention-backend", default="torch_native",
                   help=f"attention implementation; available here: {', '.join(available_backends())}")
    g.add_argument("--page-size", type=int, default=1, help="KV cache page size in tokens")
    g.add_argument("--max-total-tokens", type=int, default=None, help="KV cache capacity in tokens")
    g.add_argument("--max-running-requests", type=int, default=64, help="requests decoded together")
    g.add_argument("--context-length", type=int, default=None, help="longest prompt + output")
    g.add_argument("--random-seed", type=int, default=0)
    g.add_argument("--cuda-graph-max-bs", type=int, default=None,
                   help="largest decode batch replayed as a CUDA graph (default: min(64, --max-running-requests)); "
                   "larger batches run eagerly")
    g.add_argument("--disable-cuda-graph", action="store_true",
                   help="run every forward eagerly (CUDA graphs are used on CUDA with the triton backend)")
    g.add_argument("--disable-overlap-schedule", action="store_true",
                   help="read each decode step before launching the next (overlap scheduling, the default on "
                   "CUDA, launches step t+1 from step t's device-resident outputs while the host reads step t)")
    s = parser.add_argument_group("speculative decoding")
    s.add_argument("--speculative-algorithm", default=None, choices=["EAGLE", "EAGLE3"],
                   help="turn on speculative decoding with an EAGLE or EAGLE-3 draft head")
    s.add_argument("--speculative-draft-model-path", default=None, help="draft head directory (SGLang/EAGLE format)")
    s.add_argument("--speculative-num-steps", type=int, default=None, help="draft tree depth (default 5)")
    s.add_argument("--speculative-eagle-topk", type=int, default=None, help="branching per draft step (default 4)")
    s.add_argument("--speculative-num-draft-tokens", type=int, default=None,
                   help="tree nodes verified per request, root included (default 8; steps+1 when topk=1)")
    s.add_argument("--speculative-accept-threshold-single", type=float, default=1.0,
                   help="accept a draft token whose target probability reaches this (1.0 = lossless)")
    s.add_argument("--speculative-accept-threshold-acc", type=float, default=1.0,
                   help="divide the accumulated acceptance probability by this (1.0 = lossless)")
    s.add_argument("--speculative-token-map", default=None, help="reduced draft vocabulary file (EAGLE-2 style)")
    s.add_argument("--speculative-batch-size-threshold", type=int, default=None,
                   help="decode without speculation while more than this many requests run "
                   "(the draft cache stays in step); default: always speculate")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """Engine keyword arguments from parsed flags (speculative ones included only when enabled)."""
    kwargs = dict(
        model_path=args.model_path, device=args.device, dtype=args.dtype,
        attention_backend=args.attention_backend, page_size=args.page_size,
        max_total_tokens=args.max_total_tokens, max_running_requests=args.max_running_requests,
        context_length=args.context_length, random_seed=args.random_seed,
        cuda_graph_max_bs=args.cuda_graph_max_bs, disable_cuda_graph=args.disable_cuda_graph,
        overlap_schedule=False if args.disable_overlap_schedule else None,
    )
    if args.speculative_algorithm:
        kwargs.update(
            speculative_algorithm=args.speculative_algorithm,
            speculative_draft_model_path=args.speculative_draft_model_path,
            speculative_num_steps=args.speculative_num_steps,
            speculative_eagle_topk=args.speculative_eagle_topk,
            speculative_num_draft_tokens=args.speculative_num_draft_tokens,
            speculative_accept_threshold_single=args.speculative_accept_threshold_single,
            speculative_accept_threshold_acc=args.speculative_accept_threshold_acc,
            speculative_token_map=args.speculative_token_map,
            speculative_batch_size_threshold=args.speculative_batch_size_threshold,
        )
    return kwargs
