"""Where the project reads data and keeps caches.

* ``VIASD_DATA_DIR`` — the offline evaluation data (default: ``../shared/data`` next to the
  project root or the current directory, when present).
* ``VIASD_CACHE_DIR`` — converted models, trained drafts, DIMR masks (default:
  ``~/.cache/viasd``).
* ``VIASD_RUNS_DIR`` — the local run store (default: ``./runs``).
"""

from __future__ import annotations

import os
from pathlib import Path

from viasd.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def data_dir(required: bool = True) -> Path | None:
    """The offline data folder; raise a ConfigError naming ``VIASD_DATA_DIR`` if absent."""
    env = os.environ.get("VIASD_DATA_DIR")
    candidates = [Path(env)] if env else [PROJECT_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c
    if required:
        raise ConfigError(
            f"offline data folder not found (looked in {', '.join(str(c) for c in candidates)}); "
            "set VIASD_DATA_DIR=/path/to/shared/data"
        )
    return None


def data_file(relpath: str) -> Path:
    """Path of one offline data file; a missing file is a ConfigError naming the path and the fix."""
    base = data_dir()
    p = base / relpath
    if not p.is_file():
        raise ConfigError(f"data file not found: {p}. Set VIASD_DATA_DIR to the folder holding {relpath}")
    return p


def cache_dir() -> Path:
    """Cache root for converted models, drafts and masks (created on demand)."""
    p = Path(os.environ.get("VIASD_CACHE_DIR", Path.home() / ".cache" / "viasd"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def runs_dir() -> Path:
    """Root of the local run store."""
    return Path(os.environ.get("VIASD_RUNS_DIR", "runs")).resolve()
