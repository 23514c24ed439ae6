"""No import cycles inside specdec.models, counting imports inside functions too (a lazy import
that closes a loop is still a loop: the modules cannot be understood or tested apart)."""

import ast
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "specdec" / "models"


def _module_name(path: Path) -> str:
    rel = path.relative_to(MODELS.parents[1]).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in MODELS.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        if name == "specdec.models":
            continue  # the package's re-exports import everything by design
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name and t != "specdec.models")
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles_in_models():
    cycle = _find_cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_checker_sees_function_level_cycles():
    assert _find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
