"""Run ``python -m experiments.run …`` (the Hydra app, multiruns included) as the user does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from viasd.paths import PROJECT_ROOT


def run_app(*args: str, runs: Path, data: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m experiments.run ARGS`` from the checkout with its run store at ``runs`` and
    ``VIASD_DATA_DIR`` at ``data`` (when given); stdout/stderr captured as text."""
    env = {**os.environ, "VIASD_RUNS_DIR": str(runs), "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    if data is not None:
        env["VIASD_DATA_DIR"] = str(data)
    return subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
