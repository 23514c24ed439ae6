"""No Triton build in the middle of serving from a value or an alignment: Triton compiles a variant of a
kernel for an integer argument equal to 1 and for one divisible by 16, and for a pointer 16-byte aligned
or not. An argument whose value follows the batch (its size, its lengths) must be ``do_not_specialize``,
and buffers handed to kernels must start aligned whatever the batch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from specdec.eagle.worker import CARVE_ALIGN, carve_int64

PACKAGE = Path(__file__).resolve().parents[2] / "specdec"


def follows_the_batch(name: str) -> bool:
    """Arguments named for the batch's size or a count of its tokens (``bs``, GEMMs' ``M``, ``*_numel``)
    or a layer's sliding window (one kernel serves layers of several windows)."""
    return name in ("bs", "M", "window") or name.endswith("_numel")


def launched(tree: ast.AST) -> set[str]:
    """Names launched as ``name[grid](...)`` in a module (helpers a kernel calls are compiled into it)."""
    return {ast.unparse(node.func.value).rsplit(".", 1)[-1] for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)}


def jit_kernels():
    """(module, kernel, its runtime arguments, its do_not_specialize names) of every launched ``@triton.jit``."""
    trees = {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}
    kernels = set().union(*map(launched, trees.values()))
    for path, tree in trees.items():
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in kernels):
            for dec in fn.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if ast.unparse(target) != "triton.jit":
                    continue
                keywords = {k.arg: k.value for k in dec.keywords} if isinstance(dec, ast.Call) else {}
                unspecialized = ast.literal_eval(keywords.get("do_not_specialize", ast.List(elts=[])))
                runtime = [a.arg for a in fn.args.args
                           if a.annotation is None or "constexpr" not in ast.unparse(a.annotation)]
                yield path.relative_to(PACKAGE.parent), fn.name, runtime, set(unspecialized)


def test_the_scan_finds_the_kernels():
    kernels = {name: (runtime, off) for _, name, runtime, off in jit_kernels()}
    assert len(kernels) > 30 and "_rows_window" not in kernels  # a helper, not launched
    assert "bs" in kernels["_build_tree_kernel"][0] and "mask_numel" in kernels["_build_tree_kernel"][0]
    assert kernels["_gemv_kernel"][1] == {"M"}


def test_arguments_that_follow_the_batch_are_not_specialized():
    missing = [f"{path}: {name}({arg})" for path, name, runtime, off in jit_kernels()
               for arg in runtime if follows_the_batch(arg) and arg not in off]
    assert not missing, "specialized by value (a Triton build per value class mid-serve): " + ", ".join(missing)


@pytest.mark.parametrize("sizes", [[1], [3, 1, 5], [19, 19, 19, 1, 1, 7], [16, 32, 1, 2]])
def test_carved_parts_start_aligned(sizes):
    parts = carve_int64(sizes, "cpu")
    assert [p.numel() for p in parts] == sizes
    base = parts[0].data_ptr()
    offsets = [p.data_ptr() - base for p in parts]
    assert all(o % (CARVE_ALIGN * 8) == 0 for o in offsets)
    assert CARVE_ALIGN * 8 == 128
    for a, b, n in zip(offsets, offsets[1:], sizes):  # in order, disjoint
        assert b >= a + 8 * n
    for p, n in zip(parts, sizes):  # each writable on its own
        p.fill_(n)
    assert [p.tolist() for p in parts] == [[n] * n for n in sizes]
    assert all(p.dtype == torch.int64 for p in parts)
