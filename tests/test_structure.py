"""The package's import graph has no cycles, counting imports inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "viasd"


def import_graph() -> dict[str, set[str]]:
    """Module → the package modules it imports anywhere in its source (top level or in a function)."""
    root = PACKAGE.parent
    mods = {".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): f
            for f in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod and not mod.startswith(t + "."):  # a package's own __init__ is not a cycle
                    graph[mod].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for w in sorted(graph[m]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (c := visit(w)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_viasd_has_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_models_do_not_import_distill():
    """viasd.models is a lower layer: the smollm2 loader that builds the draft is registered lazily."""
    graph = import_graph()
    bad = {m: sorted(t for t in graph[m] if t.startswith("viasd.distill")) for m in graph if m.startswith("viasd.models")}
    assert not any(bad.values()), f"models import distill: {bad}"
