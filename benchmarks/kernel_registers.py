"""A Triton kernel's registers, spills and shared memory on an H200 (sm_90a), from any machine.

Triton compiles for a GPU it does not have (``triton.compile`` with a ``GPUTarget``), and its wheel
ships NVIDIA's ``ptxas``, whose ``-v`` report is what the GPU would load. So a kernel change's register
pressure can be checked on a CPU before a device call times it (a static figure, not a speed).

    python benchmarks/kernel_registers.py specdec/attention/triton_kernels/verify_rows.py:_node_group_kernel \\
        --ptr Q,K,V=bf16 --ptr O,LSE=fp32 --ptr kv_table,row_lens=i32 \\
        --scalar sm_scale_log2=fp32 --warps 4 --stages 3 \\
        --div16 stride_qs,stride_qh,stride_ks,stride_kh,stride_vs,stride_vh,stride_os,stride_oh,stride_osplit,stride_ls \\
        GROUP=4 HEAD_DIM=128 BLOCK_D=128 BLOCK_H=16 BLOCK_N=128 TAIL=16 TAIL_N=128 NODES=4 PAIR=True SPAN=8 \\
        DIRECT=False DOT_PRECISION=native ROW_SUMS_BY_DOT=False

Arguments not named as pointers, scalars or constexprs are i32 scalars. As at a launch, pointers are
taken 16-byte aligned and the i32 scalars named by ``--div16`` as multiples of 16: Triton specializes on
both, and without them the K/V tiles load 2 bytes at a time instead of through ``cp.async``, so the
report is not the GPU's (the decode kernel under the 8B plan at 4 warps: 166 registers and no spills
here, 168 registers in ncu's reading on an H200; unspecialized, 255 registers and 0.76 KB of spills).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def load_kernel(spec: str):
    path, name = spec.rsplit(":", 1)
    module_spec = importlib.util.spec_from_file_location("kernel_module", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, name)


def constexpr_value(text: str):
    if text in ("True", "False"):
        return text == "True"
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def named_types(items: list[str], prefix: str = "") -> dict[str, str]:
    """``NAME[,NAME...]=TYPE`` items as {name: prefix + type}."""
    out = {}
    for item in items:
        names, kind = item.split("=")
        out.update({n: prefix + kind for n in names.split(",")})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", help="FILE:KERNEL (a @triton.jit function)")
    parser.add_argument("constexprs", nargs="*", help="NAME=VALUE for each tl.constexpr argument")
    parser.add_argument("--ptr", action="append", default=[], help="NAMES=DTYPE pointer arguments (bf16, fp32, i32...)")
    parser.add_argument("--scalar", action="append", default=[], help="NAMES=DTYPE scalar arguments other than i32")
    parser.add_argument("--div16", default="", help="NAME,... i32 scalar arguments that are multiples of 16")
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--arch", type=int, default=90, help="compute capability (90: H100 / H200)")
    parser.add_argument("--ptx", type=Path, help="also write the PTX here (which MMA instructions a tile takes)")
    args = parser.parse_intermixed_args()

    fn = load_kernel(args.kernel)
    constexprs = dict(item.split("=", 1) for item in args.constexprs)
    types = {**named_types(args.ptr, "*"), **named_types(args.scalar)}
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in fn.arg_names}
    divisible = [n for n, kind in signature.items() if kind.startswith("*")] + [n for n in args.div16.split(",") if n]
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(n),): constexpr_value(v) for n, v in constexprs.items()},
                       attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible})
    compiled = triton.compile(source, target=GPUTarget("cuda", args.arch, 32),
                              options={"num_warps": args.warps, "num_stages": args.stages})
    if args.ptx:
        args.ptx.write_text(compiled.asm["ptx"])
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        report = subprocess.run([str(ptxas), "-v", "--gpu-name", f"sm_{args.arch}a", str(ptx), "-o",
                                 str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True, check=True)
    lines = [line.replace("ptxas info    :", "").strip() for line in (report.stdout + report.stderr).splitlines()
             if "registers" in line or "spill" in line]
    print(f"{fn.__name__} ({args.warps} warps, {args.stages} stages, sm_{args.arch}a): " + "; ".join(lines)
          + f"; shared memory {compiled.metadata.shared} bytes")


if __name__ == "__main__":
    main()
