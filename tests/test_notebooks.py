"""Notebooks execute against a run store (so they cannot rot)."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from viasd.experiments import run_exp
from viasd.paths import PROJECT_ROOT

NOTEBOOKS = sorted((PROJECT_ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, runs_dir, monkeypatch, synthetic_data):
    monkeypatch.setenv("VIASD_NOTEBOOK_SCALE", "smoke")
    assert run_exp(["+exp=table4", "exp.scale=smoke"]) == 0
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(PROJECT_ROOT)}}).execute()
    outputs = "".join(str(o.get("text", "")) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "table4: 4 runs, 0 missing" in outputs
