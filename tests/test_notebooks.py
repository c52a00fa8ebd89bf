"""Notebooks execute against a run store (so they cannot rot) and show and save their plots.

The grid runs on the built-in prompts (``task=prompts``), so no offline data is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers.app import run_app
from viasd.paths import PROJECT_ROOT

NOTEBOOKS = sorted((PROJECT_ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_and_shows_images(path, runs_dir, tmp_path, monkeypatch, synthetic_data):
    monkeypatch.setenv("VIASD_NOTEBOOK_SCALE", "smoke")
    monkeypatch.setenv("VIASD_NOTEBOOK_OVERRIDES", "task=prompts")
    monkeypatch.setenv("VIASD_NOTEBOOK_OUT", str(tmp_path / "figs"))
    r = run_app("+exp=table4", "scale=smoke", "task=prompts", runs=runs_dir, data=synthetic_data)
    assert r.returncode == 0, r.stderr[-3000:]
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(PROJECT_ROOT)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert "table4: 2 runs (2 yours, 0 committed), 0 missing" in "".join(str(o.get("text", "")) for o in outputs)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "no inline plot"
    assert "ablation_masks.png" in {p.name for p in (tmp_path / "figs").glob("*.png")}


def test_notebook_plots_the_committed_runs_in_a_fresh_clone(runs_dir, tmp_path):
    """``python -m experiments.notebook`` with an empty run store and no data folder plots the committed
    local-scale runs (results/runs: table2, table5) and writes the executed copy beside the figures."""
    env = {**os.environ, "VIASD_RUNS_DIR": str(runs_dir), "VIASD_DATA_DIR": str(tmp_path / "no-data"),
           "PYTHONPATH": str(PROJECT_ROOT), "WANDB_MODE": "disabled"}
    env.pop("VIASD_NOTEBOOK_SCALE", None)
    r = subprocess.run([sys.executable, "-m", "experiments.notebook"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = runs_dir / "_notebooks" / "local"
    assert {"main_results.png", "drafters.png"} <= {p.name for p in out.glob("*.png")}, r.stdout
    text = "".join(str(o.get("text", "")) for c in nbformat.read(out / "ablations.ipynb", as_version=4).cells
                   if c.cell_type == "code" for o in c.get("outputs", []))
    assert "table2: 25 runs (0 yours, 25 committed), 0 missing" in text
