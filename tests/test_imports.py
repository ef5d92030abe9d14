"""Imports inside the package point one way: no module imports, directly or through others, a module
that imports it back. Every import statement counts, those inside functions too (a lazy import that
dodges a cycle is still a cycle). The graph comes from the source (``ast``), not from running it.

An edge goes to the module an import names: ``from oreal_fast.a import b`` is an edge to
``oreal_fast.a.b`` when that is a module, else to ``oreal_fast.a``. Python also runs a package's
``__init__`` before any of its submodules; those implicit edges are left out, since every package
that re-exports its submodules would otherwise be a cycle of one."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "oreal_fast"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(node: ast.AST, module: str, is_package: bool, modules: dict) -> list[str]:
    """The package modules one import statement names (see the module docstring)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep] + ([base] if base else []))
    names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    return [n for n in names if n in modules]


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its source."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_imported(node, name, path.name == "__init__.py", modules))
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 30 and "oreal_fast.trainer" in graph  # the walk saw the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("edges,cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b", "d"}, "b": set(), "d": {"e"}, "e": {"d"}}, ["d", "e", "d"]),
])
def test_find_cycle_finds_one_when_there_is_one(edges, cycle):
    assert find_cycle(edges) == cycle


def test_a_lazy_import_inside_a_function_is_an_edge():
    graph = import_graph()
    # oreal_fast.train imports the trainer inside a function, to keep the CLI's start light
    assert "oreal_fast.trainer" in graph["oreal_fast.train"]
    # names imported from a submodule make an edge to that submodule
    assert "oreal_fast.rollout.build" in graph["oreal_fast.rollout"]
