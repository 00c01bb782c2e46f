"""No import circle in harness/ or kvstore/: the import graph, read with ast (every import statement, at any
depth, including those inside functions), has no cycle; and library.py does not import run.py."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "kvstore")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (`from pkg import name` counts as pkg.name when that is a
    module, else as the package pkg itself)."""
    files = {_module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for a in node.names:
                    target = f"{base}.{a.name}"
                    if target in files:
                        edges.add(target)
                    elif base in files:
                        edges.add(base)
        edges.discard(mod)
        graph[mod] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_graph_sees_known_edges():
    graph = import_graph()
    assert "harness.library.build" in graph["harness.run.conditions"]
    assert "harness.record.rows" in graph["harness.run.loop"]
    assert "kvstore.errors" in graph["kvstore.store.local"]


def test_find_cycle_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_harness_or_kvstore():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_library_does_not_import_run():
    assert "harness.run.loop" not in import_graph()["harness.library.build"]


def test_the_config_schema_is_a_leaf():
    """harness/config/schema.py imports no harness module but the exception family, the execution schema, the field
    declarations, the run identity and the exact default, and those import no harness module but the exception
    family."""
    graph = import_graph()
    leaves = ("harness.config.execution", "harness.config.fields", "harness.config.identity", "harness.config.exact")
    harness = {m for m in graph["harness.config.schema"] if m.startswith("harness")}
    assert harness <= {"harness.errors", *leaves}, harness
    for leaf in leaves:
        assert {m for m in graph[leaf] if m.startswith("harness")} <= {"harness.errors"}, leaf
