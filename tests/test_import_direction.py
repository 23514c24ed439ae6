"""The import direction of docs/architecture.md, and no import cycles, checked on every module's source.

Every import counts, those inside functions too: a lazy import still ties two modules together.
"""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "specdec"

SUBSYSTEM = {"kernels", "cuda_graph", "attention", "models", "eagle", "ngram", "config", "forward", "host"}
HOST = SUBSYSTEM | {"engine"}
# package part -> parts of ours it may import (the top-level modules config, forward, host are parts too)
ALLOWED = {
    "kernels": set(),
    "cuda_graph": set(),
    "ngram": {"eagle", "kernels", "forward", "host", "config"},
    "config": set(),
    "forward": set(),
    "host": {"forward"},
    "attention": {"kernels", "forward"},
    "models": {"attention", "forward", "config"},
    "eagle": {"attention", "kernels", "cuda_graph", "models", "forward", "host", "config"},
    "engine": SUBSYSTEM,
    # the edge: each takes the engine and below, never another edge part; only cli takes them all
    "server": HOST,
    "train": HOST,
    "bench": HOST,
    "cli": HOST | {"server", "train", "bench"},
    "__init__": {"config", "engine"},
}
ROOT_MODULES = {"__init__", "config", "forward", "host"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _imported_modules(path: Path) -> set[str]:
    """The specdec modules ``path`` imports: ``from a.b import c`` names module a.b.c when it exists."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = _module_name(path).split(".")
                package = here if path.name == "__init__.py" else here[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in MODULES else base)
    return {name for name in found if name == "specdec" or name.startswith("specdec.")}


def _part(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_every_part_is_known():
    root = {p.stem for p in PKG.glob("*.py")}
    assert root <= ROOT_MODULES, f"the package root holds only {sorted(ROOT_MODULES)}, found {sorted(root)}"
    assert {_part(m) for m in MODULES} <= set(ALLOWED)


def test_import_direction():
    violations = []
    for module, path in MODULES.items():
        part = _part(module)
        for dep in {_part(m) for m in _imported_modules(path)} - {part}:
            if dep not in ALLOWED[part]:
                violations.append(f"{module} imports specdec.{dep}")
    assert not violations, "\n".join(sorted(violations))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    graph = {m: _imported_modules(p) - {m} for m, p in MODULES.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_checker_sees_a_violation_and_a_cycle(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("from specdec.engine.engine import Engine\nimport specdec.eagle.worker\n"
                   "def f():\n    from specdec.models import llama\n")
    assert _imported_modules(bad) == {"specdec.engine.engine", "specdec.eagle.worker", "specdec.models.llama"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
