"""The package's structure: no import cycles (imports inside functions count too), imports
point one way through the layers the README draws, and no module grows past ~400 lines."""

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


#: The layers, lowest first (README "Layout"): a module imports only its own package or a lower layer.
LAYERS = (
    ("errors", "registry", "config", "paths", "utils"),  # base: shared types, registries, files
    ("core",),      # pure tensor math: sampling, acceptance rules, tier routing
    ("engine",),    # KV streams, routed forward, drafters, results
    ("models",),    # pairs and their loaders
    ("tasks",),     # datasets, prompts, metrics, sandbox
    ("tracking",),  # run store, baseline matching, W&B
    ("dimr",),      # slim-verifier masks and their search
    ("distill",),   # the embedded pair's trained draft
    ("methods",),   # the decoding loops and their registry
    ("analysis",),  # trace replay, cost model, paired statistics (no decoding)
    ("harness",),   # runner, exp grids, dry run, benchmark
    ("report",),    # tables and figures from the run store
    ("api",),       # the public Python API (viasd.api): wraps the layers below
)
MAX_LINES = 400


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of ``viasd.<package>…``; the top-level ``viasd`` package is base."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "errors"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS (and to the README's picture)")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Edges that point up a layer or sideways into another package of the same layer."""
    bad = []
    for mod, deps in graph.items():
        for dep in deps:
            lm, ld = layer_of(mod), layer_of(dep)
            same_pkg = mod.split(".")[:2] == dep.split(".")[:2]
            if ld > lm or (ld == lm and lm > 0 and not same_pkg):
                bad.append(f"{mod} -> {dep}")
    return sorted(bad)


def test_layer_check_finds_an_upward_import():
    assert layer_violations({"viasd.core.rules": {"viasd.methods.sd"}}) == ["viasd.core.rules -> viasd.methods.sd"]
    assert layer_violations({"viasd.methods.sd": {"viasd.core.rules", "viasd.methods.registry"}}) == []


def test_imports_point_one_way_through_the_layers():
    bad = layer_violations(import_graph())
    assert not bad, "imports against the layering (lower layers must not import higher ones):\n" + "\n".join(bad)


def test_no_module_over_400_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"
