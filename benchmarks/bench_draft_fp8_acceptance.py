"""Would FP8 weights cost the draft head acceptance? The acceptance model of a head as it is and with
its linear weights rounded to FP8, on the same prompts.

The draft head's GEMMs read its weights once per draft forward (0.75 GB a forward for an 8B
EAGLE-3 head), so FP8 weights (e4m3, one fp32 scale per output row: weight-only, W8A16) would halve
the bytes of the draft loop. Speculation stays lossless whatever the draft proposes; what FP8 could
cost is acceptance. This measures it before any kernel is written: each 2-D weight of the head
except embeddings is replaced by its FP8 rounding, ``s * fp8(w / s)`` with ``s = max|w_row| / 448``,
and the computation stays in the model's dtype, which is what a W8A16 kernel computes up to its
summation order.

    python benchmarks/bench_draft_fp8_acceptance.py --num-prompts 40 --max-new-tokens 192

Other flags go to ``python -m specdec.cli.bench acceptance`` (defaults: SmolLM2-135M-Instruct and
its EAGLE-3 head, MT-bench first turns, greedy, shape 6x8x32). Writes both acceptance models, with
their acceptance lengths, as one JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from common import run_metadata
from specdec.cli.bench import acceptance_main
from specdec.engine import engine as engine_module

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


def measure(argv: list[str], output: Path, *, fp8: bool) -> dict:
    """``python -m specdec.cli.bench acceptance`` with ``argv``, the head's weights rounded to FP8
    when ``fp8``; returns its JSON."""
    original = engine_module.Engine
    rounded: list[str] = []

    class RoundedHeadEngine(original):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            rounded.extend(round_to_fp8_(self.draft_model))

    engine_module.Engine = RoundedHeadEngine if fp8 else original
    try:
        start = time.perf_counter()
        acceptance_main([*argv, "--output", str(output)])
    finally:
        engine_module.Engine = original
    result = json.loads(output.read_text())
    result["protocol"]["wall_s"] = round(time.perf_counter() - start, 1)
    result["protocol"]["fp8_weights"] = rounded
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("draft_fp8_acceptance.json"))
    opts, argv = parser.parse_known_args()  # the rest goes to `specdec.cli.bench acceptance`
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: measure(argv, Path(tmp) / f"{name}.json", fp8=name == "fp8") for name in ("as_is", "fp8")}
    opts.output.write_text(json.dumps({**run_metadata(), "acceptance_args": argv, **runs}, indent=1))
    for name, run in runs.items():
        p = run["protocol"]
        print(f"{name:6s} acceptance length {p['acceptance_length']:.3f} over {p['verify_steps']} verify steps "
              f"({p['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
