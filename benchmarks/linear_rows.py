"""Does a token's row of a linear layer depend on how many rows share the call? (issue #41)

A greedy answer with speculation equals plain decoding's only if each token's computation is the same
in both runs, but the two runs put a token among different numbers of rows: plain decoding's bs, a
verify's bs x nodes, a prefill group's prompt tokens. For each weight shape and each M this runs
``specdec.models.ops.gemv.linear`` (the default path, or deterministic inference's with
``--deterministic``) on M rows and compares the first rows with the same rows computed one at a time
(M = 1, a decode step at bs 1): how many differ and by how much, and which kernel served M.
cuBLAS runs as PyTorch starts it unless ``--as-engine`` (without a workspace, as the engine runs it:
``gemv.cublas_without_workspace``) or the environment says otherwise.

    python benchmarks/linear_rows.py --shapes smollm2 llama-3.1-8b --json $OUT/linear_rows.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.forward import batch_invariant  # noqa: E402
from specdec.models.ops import gemv  # noqa: E402

SHAPES = {  # model -> {layer: (N, K)}
    "smollm2": {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
                "lm_head": (49152, 576)},
    "llama-3.1-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
                     "lm_head": (128256, 4096)},
}
M_VALUES = [1, 2, 3, 4, 8, 9, 12, 16, 24, 32, 33, 48, 64, 65, 96, 128, 160, 192, 256, 288, 320, 384, 512, 1024,
            2048]
ROWS = 8  # rows compared at each M


def kernel_name(x: torch.Tensor, w: torch.Tensor) -> str:
    config = gemv.plan(x, w, None)
    if config is None:
        return "F.linear"
    return f"triton {config.block_n}x{config.block_k}{' swap-AB' if config.swap_ab else ''}"


def check_shape(n: int, k: int, m_values: list[int], *, device: str, seed: int) -> list[dict]:
    gen = torch.Generator(device=device).manual_seed(seed)
    w = (torch.randn(n, k, device=device, generator=gen) * k ** -0.5).bfloat16()
    x = torch.randn(max(m_values), k, device=device, generator=gen).bfloat16()
    one_at_a_time = torch.cat([gemv.linear(x[i:i + 1], w) for i in range(ROWS)])  # [ROWS, N]
    rows = []
    for m in m_values:
        out = gemv.linear(x[:m], w)[:ROWS]  # [min(m, ROWS), N]
        ref = one_at_a_time[:out.shape[0]]
        differing = (out != ref).any(dim=1)
        rows.append({"m": m, "kernel": kernel_name(x[:m], w), "rows": out.shape[0],
                     "rows_differing": int(differing.sum()),
                     "max_abs_diff": float((out.float() - ref.float()).abs().max())})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--m", type=int, nargs="+", default=M_VALUES)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deterministic", action="store_true", help="under --enable-deterministic-inference")
    ap.add_argument("--blas", default=None, choices=["cublas", "cublaslt"], help="torch's preferred BLAS library")
    ap.add_argument("--no-reduced-precision-reduction", action="store_true",
                    help="cuBLAS's split-K partials summed in fp32 (allow_bf16_reduced_precision_reduction off)")
    ap.add_argument("--as-engine", action="store_true", help="cuBLAS without a workspace, as the engine runs it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.as_engine:
        gemv.cublas_without_workspace()
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)
    if args.no_reduced_precision_reduction:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    results = []
    with torch.inference_mode(), batch_invariant(args.deterministic):
        for model in args.shapes:
            for layer, (n, k) in SHAPES[model].items():
                for row in check_shape(n, k, args.m, device=args.device, seed=args.seed):
                    results.append({"model": model, "layer": layer, "n": n, "k": k,
                                    "deterministic": args.deterministic, "blas": args.blas, "as_engine": args.as_engine,
                                    "reduced_precision_reduction": not args.no_reduced_precision_reduction, **row})
                    r = results[-1]
                    print(f"{model:13s} {layer:8s} M={r['m']:5d} {r['kernel']:26s} rows differing "
                          f"{r['rows_differing']}/{r['rows']}  max|d| {r['max_abs_diff']:.3e}", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
