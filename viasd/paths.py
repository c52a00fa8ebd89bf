"""Where the project reads data and keeps caches.

* ``VIASD_DATA_DIR`` — the offline evaluation data (default: ``../shared/data`` next to the
  project root or the current directory, when present); ``python -m experiments.data fetch``
  fills it from the hub.
* ``VIASD_CACHE_DIR`` — converted models, trained drafts, DIMR masks (default:
  ``~/.cache/viasd``).
* ``VIASD_RUNS_DIR`` — the local run store (default: ``./runs``).
* ``VIASD_RESULTS_DIR`` — the read-only results store committed in the repository (default:
  ``results/runs/`` of the checkout), read beside the local one by the reports.
* ``VIASD_UNFINISHED_DIR`` — stashed examples of runs still decoding (default:
  ``results/unfinished/`` of the checkout; ``experiments.store stash`` / ``restore``), so a decode
  spread over machines resumes where the last one stopped. Never read by the reports.
"""

from __future__ import annotations

import os
from pathlib import Path

from viasd.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: Reserved folder of a run store holding its pairs' cost models (``viasd.analysis.cost``).
COST_DIR = "_cost"


def _data_candidates() -> list[Path]:
    env = os.environ.get("VIASD_DATA_DIR")
    if env:
        return [Path(env).expanduser()]
    found = [PROJECT_ROOT.parent / "shared" / "data", Path.cwd().resolve().parent / "shared" / "data"]
    return list(dict.fromkeys(found))  # each path once


def _fixes(task: str | None) -> str:
    name = task or "<task>"
    return (
        f"fetch it with `python -m experiments.data fetch {name}` (writes into VIASD_DATA_DIR), "
        f"point VIASD_DATA_DIR at a folder that has it, or read the hub directly with task.source=hub"
    )


def data_dir(required: bool = True, task: str | None = None) -> Path | None:
    """The offline data folder; raise a ConfigError naming ``VIASD_DATA_DIR`` and both fixes if absent."""
    candidates = _data_candidates()
    for c in candidates:
        if c.is_dir():
            return c
    if required:
        raise ConfigError(
            f"offline data folder not found (looked in {', '.join(str(c) for c in candidates)}); {_fixes(task)}"
        )
    return None


def default_data_dir() -> Path:
    """Where ``experiments.data fetch`` writes: ``VIASD_DATA_DIR``, else ``../shared/data``."""
    return _data_candidates()[0]


def data_file(relpath: str, task: str | None = None) -> Path:
    """Path of one offline data file; a missing file is a ConfigError naming the path once and both fixes."""
    p = data_dir(task=task) / relpath
    if not p.is_file():
        raise ConfigError(f"data file not found: {p}; {_fixes(task)}")
    return p


def cache_dir() -> Path:
    """Cache root for converted models, drafts and masks (created on demand)."""
    p = Path(os.environ.get("VIASD_CACHE_DIR", Path.home() / ".cache" / "viasd"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def runs_dir() -> Path:
    """Root of the local run store."""
    return Path(os.environ.get("VIASD_RUNS_DIR", "runs")).resolve()


def results_dir() -> Path:
    """Root of the results store committed in the repository (read-only for runs; ``experiments.store publish``)."""
    return Path(os.environ.get("VIASD_RESULTS_DIR", PROJECT_ROOT / "results" / "runs")).resolve()


def unfinished_dir() -> Path:
    """Root of the stash of unfinished runs committed in the repository (``experiments.store stash``)."""
    return Path(os.environ.get("VIASD_UNFINISHED_DIR", PROJECT_ROOT / "results" / "unfinished")).resolve()
