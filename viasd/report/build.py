"""Rebuild every table and figure from the run store (never from anything else).

For each exp, the cells are re-composed with Hydra (:func:`viasd.harness.grid.exp_cells`: the
exp's sweeper params expanded by Hydra's own override parser), their run ids computed exactly as
the runner does, and the finished runs read from the local run store. Outputs go to ``<out>/<scale>/`` with the scale in every title, so a smoke report
can never overwrite local- or paper-scale files. Every speedup is against the ``ar`` run of the
identical workload (:mod:`viasd.tracking.baseline`); each output lists its runs, the ``ar`` run
each speedup used, the missing cells and, for cells without a matched ``ar`` run, the command
that creates it (``<name>.sources.json``). Runs that differ only in ``seed`` are repeats: tables
print mean ± 95% CI (Student t), figures draw error bars. Tables: Markdown + LaTeX; figures:
PNG + PDF (matplotlib / seaborn).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from viasd.harness.grid import CONF_DIR
from viasd.report import figures, interleaved, tables  # noqa: F401  (each registers its reports in REPORTS)
from viasd.report.common import REPORTS, collect, mean_ci  # noqa: F401  (re-exported)
from viasd.tracking.baseline import PRIMARY, quality, tier_shares  # noqa: F401  (re-exported)
from viasd.tracking.store import RunStore


def scales() -> list[str]:
    """The scales an exp can be run and reported at (``conf/scale/<scale>.yaml``)."""
    return sorted(p.stem for p in (CONF_DIR / "scale").glob("*.yaml"))


def build_all(out: Path, store: RunStore, scale: str = "local", names: list[str] | None = None,
              overrides: list[str] | None = None) -> dict[str, Any]:
    """Rebuild the requested (default: all) reports into ``out/<scale>/``; returns ``{name: paths or error}``."""
    result: dict[str, Any] = {}
    dest = Path(out) / scale
    for name in names or REPORTS.names():
        if not (CONF_DIR / "scale" / name / f"{scale}.yaml").is_file():
            result[name] = f"skipped: {name} has no {scale} scale (conf/scale/{name}/{scale}.yaml)"
            continue
        runs, missing = collect(name, scale, store, overrides)
        if not runs:
            result[name] = f"skipped: no finished runs ({len(missing)} cells missing; run +exp={name} scale={scale})"
            continue
        result[name] = REPORTS.get(name)(runs, missing, dest, store, scale)
    return result
