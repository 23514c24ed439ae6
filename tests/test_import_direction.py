"""The import direction of docs/architecture.md, checked on every module's source."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "specdec"

# package part -> parts of ours it may import (top-level modules: config, forward, host)
ALLOWED = {
    "kernels": set(),
    "cuda_graph": set(),
    "attention": {"kernels", "forward"},
    "models": {"attention", "forward", "config"},
    "eagle": {"attention", "kernels", "cuda_graph", "models", "forward", "host", "config"},
    "config": set(),
    "forward": set(),
    "host": {"forward"},
}
SUBSYSTEM = {"kernels", "cuda_graph", "attention", "models", "eagle", "config", "forward", "host"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "specdec" and len(parts) > 1:
                found.add(parts[1])
    return found


def _part(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_import_direction():
    violations = []
    for path in PKG.rglob("*.py"):
        part = _part(path)
        if part not in ALLOWED:
            continue
        for dep in _imports(path) - {part}:
            if dep not in ALLOWED[part]:
                violations.append(f"{path.relative_to(PKG)} imports specdec.{dep}")
    assert not violations, "\n".join(violations)


def test_subsystem_never_imports_engine():
    offenders = [
        str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
        if _part(p) in SUBSYSTEM and {"engine", "server", "cli", "benchmark", "bench_serving", "train"} & _imports(p)
    ]
    assert not offenders


def test_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("from specdec.engine.engine import Engine\nimport specdec.eagle.worker\n")
    assert _imports(bad) == {"engine", "eagle"}
