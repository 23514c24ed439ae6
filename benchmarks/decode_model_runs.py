"""``bench_decode_kernels.py``'s model runs: the ``breakdown`` part (torch.profiler over
graph-replayed decode steps at bs 1, per-kernel GPU time per step) and the ``e2e`` part (plain
decode ms/step of the full model as ``specdec.bench.synthetic`` measures it), each for the model
paths "before" (cuBLAS, no PDL), "gemv" (Triton GEMMs, no PDL) and "gemv+pdl" (the default).
"""

from __future__ import annotations

import contextlib
import time


def _engine(target, batch_sizes: list[int], context: int, device: str):
    from specdec.engine.engine import Engine

    max_bs = max(batch_sizes)
    backend = "triton" if device != "cpu" else "torch_native"
    engine = Engine(target_model=target, device=device, attention_backend=backend, max_running_requests=max_bs,
                    context_length=context, max_total_tokens=max_bs * (context + 64), disable_cuda_graph=True,
                    random_seed=0)
    if device != "cpu":
        engine.capture_cuda_graphs(batch_sizes)
    return engine


def _paths(names: list[str]):
    """(name, context manager) of each model path: before (cuBLAS, no PDL), gemv, gemv+pdl."""
    from specdec.models.ops.gemv import cublas_only
    from specdec.models.ops.launch import programmatic_launch

    def before():
        stack = contextlib.ExitStack()
        stack.enter_context(cublas_only())
        stack.enter_context(programmatic_launch(False))
        return stack

    every = {"before": before, "gemv": lambda: programmatic_launch(False), "gemv+pdl": contextlib.nullcontext}
    return [(name, every[name]) for name in names]


def _gemm_label(name: str) -> bool:
    low = name.lower()
    return any(s in low for s in ("gemv", "gemm", "nvjet", "xmma", "cutlass", "splitk", "sm90_"))


def breakdown(args, shape: dict) -> dict:
    """Per-kernel GPU time of graph-replayed decode steps at bs 1 (profiler), both paths."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from specdec.engine.sampling import SamplingParams

    steps, warmup = 8, 4
    out = {"layers": shape["num_hidden_layers"], "steps": steps}
    target = build_target(shape, args.device)
    prompt = torch.randint(3, shape["vocab_size"], (args.context_len,), generator=torch.Generator().manual_seed(0))
    params = SamplingParams.from_dict({"temperature": 0, "max_new_tokens": 4 * (steps + warmup), "ignore_eos": True})
    for path, ctx in _paths(["before", "gemv+pdl"]):
        with ctx():
            engine = _engine(target, [1], args.context_len + 4 * (steps + warmup) + 64, args.device)
            req = engine.make_request(input_ids=prompt.tolist(), sampling_params=params, rid=f"breakdown-{path}")
            engine.add_request(req)
            while not req.output_ids:
                engine.step()  # prefill
            for _ in range(warmup):
                engine.step()
            _sync(args.device)
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device != "cpu" else [])
            with profile(activities=acts) as prof:
                t0 = time.perf_counter()
                for _ in range(steps):
                    engine.step()
                _sync(args.device)
                step_ms = (time.perf_counter() - t0) * 1e3 / steps
            engine.abort(req.rid)
            if hasattr(engine.scheduler, "drain"):
                engine.scheduler.drain()  # the overlap scheduler's step launched past the abort
        kernels = sorted(((e.time_range.start, e.time_range.elapsed_us(), e.name) for e in prof.events()
                          if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda t: t[0])
        per_step = len(kernels) // steps
        one = kernels[-per_step:] if per_step else []
        summary: dict[str, float] = {}
        for _, us, name in kernels:
            summary[name[:90]] = summary.get(name[:90], 0.0) + us / steps
        gemms = [(name, us) for _, us, name in one if _gemm_label(name) or "_gemv_kernel" in name]
        span = (one[-1][0] + one[-1][1] - one[0][0]) if one else float("nan")
        out[path] = {"step_ms": step_ms, "kernels_per_step": len(kernels) / steps,
                     "gpu_busy_ms": sum(us for _, us, _ in kernels) / steps / 1e3, "gpu_span_ms": span / 1e3,
                     "by_kernel_us": dict(sorted(summary.items(), key=lambda kv: -kv[1])),
                     "one_step": [(name[:60], round(us, 2)) for _, us, name in one],
                     "gemm_sequence_us": [(name[:40], round(us, 2)) for name, us in gemms]}
        print(f"breakdown [{path}] step {step_ms:.3f} ms, {len(kernels) / steps:.1f} kernels/step, GPU busy "
              f"{out[path]['gpu_busy_ms']:.3f} ms, last step's span {out[path]['gpu_span_ms']:.3f} ms", flush=True)
        for name, us in list(out[path]["by_kernel_us"].items())[:16]:
            print(f"    {us:9.1f} us  {name}", flush=True)
        print("    one layer + tail: " + ", ".join(f"{n[:24]}={us}" for n, us in out[path]["one_step"][:14] +
                                                   out[path]["one_step"][-8:]), flush=True)
        del engine
        _free(args.device)
    del target
    _free(args.device)
    return out


def build_target(shape: dict, device: str):
    """A Llama of ``shape`` with random weights, as ``--load-format dummy`` draws them."""
    import torch

    from specdec.models.llama import LlamaConfig
    from specdec.models.parallel import SINGLE
    from specdec.models.registry import build_target as build

    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    return build(LlamaConfig(**shape), None, what="random target", dtype=dtype, device=device,
                 aux_hidden_layers=None, tp=SINGLE)


def _sync(device: str) -> None:
    import torch

    if device != "cpu":
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device != "cpu":
        torch.cuda.empty_cache()


def end_to_end(args, shape: dict, batch_sizes: list[int], copy_bw: float, out: dict, save) -> dict:
    """Plain decode ms/step of the full model, old path and new, in one run."""
    from specdec.bench.synthetic import SyntheticSettings, measure

    run_args = SyntheticSettings(synthetic="llama-3.1-8b", seed=0, warmup_steps=3, decode_steps=args.decode_steps,
                                 context_len=args.context_len)
    target = build_target(shape, args.device)
    # bytes a decode step must read: every weight but the embedding table (one row of it)
    step_bytes = sum(p.numel() * p.element_size() for n, p in target.named_parameters() if "embed_tokens" not in n)
    floor_ms = step_bytes / (copy_bw * 1e9) * 1e3 if copy_bw == copy_bw else float("nan")
    all_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    out.update({"step_weight_bytes": step_bytes, "all_weight_bytes": all_bytes, "floor_ms": floor_ms,
                "floor_ms_all_weights": all_bytes / (copy_bw * 1e9) * 1e3 if copy_bw == copy_bw else float("nan")})
    context = args.context_len + (args.decode_steps + 8) + 64
    for path, ctx in _paths(args.paths.split(",")):
        with ctx():
            engine = _engine(target, batch_sizes, context, args.device)
            points = [measure(engine, bs, run_args, shape["vocab_size"]) for bs in batch_sizes]
        out[path] = [{"batch_size": p["batch_size"], "step_ms": p["step_ms"], "tokens_per_s": p["tokens_per_s"],
                      "floor_share": floor_ms / p["step_ms"]} for p in points]
        for p in out[path]:
            print(f"e2e [{path}] bs={p['batch_size']}  {p['step_ms']:.3f} ms/step  {p['tokens_per_s']:.1f} tok/s  "
                  f"{p['floor_share']:.0%} of floor", flush=True)
        del engine
        _free(args.device)
        save()
    del target
    _free(args.device)
    return out
