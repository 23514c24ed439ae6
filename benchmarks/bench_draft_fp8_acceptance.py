"""Would FP8 weights cost the draft head acceptance? The acceptance model of a head as it is, with
its linear weights rounded to FP8 (W8A16), with their inputs rounded to FP8 too (W8A8), and with
its KV cache in FP8 (``--kv``), on the same prompts.

The draft head's GEMMs read its weights once per draft forward (0.75 GB a forward for an 8B
EAGLE-3 head), so FP8 weights (e4m3, one fp32 scale per output row: weight-only, W8A16) would halve
the bytes of the draft loop. Speculation stays lossless whatever the draft proposes; what FP8 could
cost is acceptance. This measures it before any kernel is written: each 2-D weight of the head
except embeddings is replaced by its FP8 rounding, ``s * fp8(w / s)`` with ``s = max|w_row| / 448``,
and the computation stays in the model's dtype, which is what a W8A16 kernel computes up to its
summation order.

W8A8 (``--activations``) also rounds the input rows of every GEMM of the head to FP8, one scale per
row (token): what an FP8 tensor-core GEMM with per-token activation scales (``torch._scaled_mm``)
computes up to its summation order; the target's GEMMs stay as they are.

An FP8 KV cache for the head (``--kv``) would halve what its attention reads: at bs 64 and 1 k
tokens of context, 105 us of each draft forward and 100 us of the draft extend on an H100, the
same KV floor as a target layer's. Here every K and V the head stores is rounded to e4m3 with a
scale of 1 (what a cache of ``float8_e4m3fn`` entries without calibration holds; past +-448 it
saturates), and attention reads the rounded values; the head's weights stay as they are. The
engine now has the cache itself (``--speculative-draft-kv-cache-dtype fp8_e4m3``, rounding by the
same ``cast_kv``); this run also counts the values that saturate or fall below e4m3's normal range.

    python benchmarks/bench_draft_fp8_acceptance.py --num-prompts 40 --max-new-tokens 192 [--activations] [--kv]

Other flags go to ``python -m specdec.cli.bench acceptance`` (defaults: SmolLM2-135M-Instruct and
its EAGLE-3 head, MT-bench first turns, greedy, shape 6x8x32). Writes both acceptance models, with
their acceptance lengths, as one JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

import torch

from common import run_metadata
from specdec.attention.kv_dtype import cast_kv
from specdec.cli.bench import acceptance_main
from specdec.engine import engine as engine_module
from specdec.models.ops.gemv import quantize_rows_fp8_ref

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def round_to_fp8_(model: torch.nn.Module) -> list[str]:
    """Round every 2-D weight but embeddings to FP8 with one scale per output row, in place;
    returns the names rounded."""
    rounded = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() != 2 or "embed" in name:
                continue
            scale = param.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / FP8_MAX
            param.copy_(((param.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(param.dtype))
            rounded.append(name)
    return rounded


def round_rows_to_fp8(x: torch.Tensor) -> torch.Tensor:
    """``x`` [T, K] rounded to FP8 with one scale per row (the library's W8A8 quantization,
    ``gemv.quantize_rows_fp8_ref``), in its own dtype. (The 2026-11-26 W8A8 run took the scale as
    ``max|x| / 448``, at most one ulp off this one.)"""
    xq, scale = quantize_rows_fp8_ref(x)
    return (xq.float() * scale[:, None]).to(x.dtype)


# every module that calls the GEMM op by this name (the head's GEMMs and the target's)
LINEAR_USERS = ("specdec.models.llama", "specdec.models.llama_layers", "specdec.models.eagle",
                "specdec.models.eagle3", "specdec.models.ops.stacked_linear")


def round_kv_to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """``x`` rounded to e4m3 with a scale of 1, saturating at +-448, in its own dtype; and how many of
    its values saturated and how many fell below e4m3's normal range (2**-6, where it keeps fewer bits)."""
    saturated = int((x.abs() > FP8_MAX).sum())
    subnormal = int(((x != 0) & (x.abs() < 2.0**-6)).sum())
    return cast_kv(x, torch.float8_e4m3fn).to(x.dtype), saturated, subnormal


def measure(argv: list[str], output: Path, *, fp8: bool, activations: bool = False, kv: bool = False) -> dict:
    """``python -m specdec.cli.bench acceptance`` with ``argv``, the head's weights rounded to FP8
    when ``fp8``, its GEMMs' inputs too when ``activations``, and the K/V it stores when ``kv``;
    returns its JSON."""
    import importlib

    from specdec.models.ops.gemv import linear as original_linear

    original = engine_module.Engine
    rounded: list[str] = []
    head_storage: set[int] = set()  # the head's weights, by storage (stacked weights are views of one)

    rounded_calls = [0]
    kv_counts = collections.Counter()  # values the head stored: all, saturated, subnormal

    def head_linear(x, weight, *args, **kw):
        if weight.untyped_storage().data_ptr() in head_storage:
            x = round_rows_to_fp8(x)
            rounded_calls[0] += 1
        return original_linear(x, weight, *args, **kw)

    class RoundedHeadEngine(original):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            if fp8:
                rounded.extend(round_to_fp8_(self.draft_model))
                head_storage.update(p.untyped_storage().data_ptr() for p in self.draft_model.parameters()
                                    if p.dim() == 2)
            if kv:
                cache = self.worker.resources.kv  # the draft KV every shape shares
                store = cache.set_kv

                def set_kv_fp8(layer_id, loc, k, v):
                    (k, *ks), (v, *vs) = round_kv_to_fp8(k), round_kv_to_fp8(v)
                    kv_counts.update(values=k.numel() + v.numel(), saturated=ks[0] + vs[0], subnormal=ks[1] + vs[1])
                    store(layer_id, loc, k, v)

                cache.set_kv = set_kv_fp8

    users = [importlib.import_module(name) for name in LINEAR_USERS]
    engine_module.Engine = RoundedHeadEngine if fp8 or kv else original
    if activations:
        for module in users:
            module.linear = head_linear
    try:
        start = time.perf_counter()
        acceptance_main([*argv, "--output", str(output)])
    finally:
        engine_module.Engine = original
        for module in users:
            module.linear = original_linear
    result = json.loads(output.read_text())
    result["protocol"]["wall_s"] = round(time.perf_counter() - start, 1)
    result["protocol"]["fp8_weights"] = rounded
    result["protocol"]["fp8_activations"] = activations
    result["protocol"]["head_gemms_with_fp8_inputs"] = rounded_calls[0]
    result["protocol"]["fp8_kv"] = dict(kv_counts) if kv else None
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("draft_fp8_acceptance.json"))
    parser.add_argument("--activations", action="store_true", help="also W8A8: the head's GEMM inputs in FP8")
    parser.add_argument("--kv", action="store_true", help="the head's KV cache in FP8 instead of its weights")
    opts, argv = parser.parse_known_args()  # the rest goes to `specdec.cli.bench acceptance`
    variants = {"as_is": {"fp8": False}}
    if opts.kv:
        variants["fp8_kv"] = {"fp8": False, "kv": True}
    else:
        variants["fp8"] = {"fp8": True}
    if opts.activations:
        variants["w8a8"] = {"fp8": True, "activations": True}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: measure(argv, Path(tmp) / f"{name}.json", **kw) for name, kw in variants.items()}
    opts.output.write_text(json.dumps({**run_metadata(), "acceptance_args": argv, **runs}, indent=1))
    for name, run in runs.items():
        p = run["protocol"]
        print(f"{name:6s} acceptance length {p['acceptance_length']:.3f} over {p['verify_steps']} verify steps "
              f"({p['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
