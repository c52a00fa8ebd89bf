"""Sampling statistics live once, in tests/helpers: no test module defines its own copy."""

from __future__ import annotations

import ast
from pathlib import Path

SHARED = {"chi_square_pvalue", "exact_joint", "tiny_vocab_pair", "physically_pruned", "feed"}


def test_no_test_module_redefines_a_shared_helper():
    tests = Path(__file__).parent
    copies = []
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name in SHARED or "chi_square" in node.name or "chisquare" in node.name
            ):
                copies.append(f"{path.name}:{node.lineno} {node.name}")
    assert not copies, f"use tests/helpers instead of these copies: {copies}"
