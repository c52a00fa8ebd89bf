"""What every report shares: the report registry, collecting an exp's runs with their matched
``ar`` runs, repeats as mean ± 95% CI, and writing tables/figures with their source lists.

Outputs go to ``<out>/<scale>/`` with the scale in every title; each lists its runs, the ``ar``
run each speedup used, the missing cells and the command creating a missing ``ar`` run
(``<name>.sources.json``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf
from scipy import stats

from viasd.analysis.paired import compare_to_ar, load_run
from viasd.harness.grid import exp_cells
from viasd.harness.identity import find_as_recorded
from viasd.harness.interleave import variant_label
from viasd.harness.runner import identity
from viasd.registry import Registry
from viasd.tracking.baseline import (
    ar_index,
    matched_ar,
    quality,
    speedup,
    tier_shares,
)
from viasd.tracking.store import RunStore, RunStores, as_stores, run_id_for
from viasd.utils.fs import atomic_write_json, atomic_write_text

REPORTS: Registry[Callable[..., list[str]]] = Registry("report")

__all__ = ["REPORTS", "collect", "quality", "tier_shares", "mean_ci", "stat", "Stat", "repeat_groups"]


def collect(exp: str, scale: str, store: RunStore | RunStores, overrides: list[str] | None = None
            ) -> tuple[list[dict], list[str]]:
    """Finished runs of every cell of ``exp`` at ``scale`` and the run ids of missing cells.

    ``store``: one run store or several read as one (the user's and the results store); a run
    that does not prove itself (:mod:`viasd.tracking.proof`) counts as missing. Each run:
    ``run_id``, ``config`` (composed DictConfig), ``identity`` (resolved dict), ``summary``, ``meta``,
    ``ar`` (the matched ``ar`` run of the same store, or None), ``speedup`` (vs that run),
    ``ar_command`` (the command creating the missing ``ar`` run, else None), ``label`` (an
    interleaved cell's ``exp.variants`` label, else None).
    """
    stores = as_stores(store)
    index = ar_index(stores)
    base = [o for o in (overrides or []) if not o.lstrip("+").startswith(("exp=", "exp.scale=", "scale="))]
    runs, missing = [], []
    for cell, cfg in exp_cells([f"+exp={exp}", f"scale={scale}", *base]):
        ident = identity(cfg)
        rid = run_id_for(ident)
        found = stores.find(rid)
        if found is None and (recorded := find_as_recorded(stores, cfg, ident)) is not None:
            found, ident = recorded  # no data file here: the run recorded its hash (ids unchanged)
            rid = found["run_id"]
        if found is None:
            missing.append(rid)
            continue
        summary = found["summary"]
        timed = OmegaConf.select(cfg, "exp.entry", default="run") == "run"  # search/kl runs have no speedup
        ar = {"run_id": rid, "summary": summary} if summary.get("method") == "ar" else \
            (matched_ar(ident, index, found["root"]) if timed else None)
        cmd = None
        if ar is None and timed:
            keep = [o for o in cell if not o.split("=", 1)[0].lstrip("+~").startswith(("method", "exp", "scale"))]
            cmd = "python -m experiments.run method=ar " + " ".join(keep)
        runs.append({"run_id": rid, "config": cfg, "identity": ident, "summary": summary,
                     "meta": read_meta(found["path"]), "ar": ar,
                     "speedup": speedup(summary, ar["summary"]) if ar else math.nan, "ar_command": cmd,
                     "label": variant_label(cell, cfg)})
    return runs, missing


def mean_ci(values: list[float]) -> tuple[float, float]:
    """``(mean, half-width of the 95% CI)`` of repeat values (Student t; half-width 0 for one value)."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return math.nan, math.nan
    if len(vals) == 1:
        return vals[0], 0.0
    sem = statistics.stdev(vals) / math.sqrt(len(vals))
    return statistics.fmean(vals), float(stats.t.ppf(0.975, len(vals) - 1) * sem)


def repeat_groups(runs: list[dict]) -> list[list[dict]]:
    """Runs grouped by identity without ``seed`` (repeats of one cell), in first-seen order."""
    groups: dict[str, list[dict]] = {}
    for r in runs:
        key = json.dumps({k: v for k, v in r["identity"].items() if k not in ("seed", "exp")}, sort_keys=True,
                         default=str)
        groups.setdefault(key, []).append(r)
    return list(groups.values())


class Stat(float):
    """A mean that prints as ``mean ± ci`` when it came from several repeats."""

    def __new__(cls, mean: float, ci: float = 0.0, n: int = 1):
        obj = super().__new__(cls, mean)
        obj.ci, obj.n = ci, n
        return obj


def stat(values: list[float]) -> Stat:
    """Mean ± 95% CI of repeat values as a :class:`Stat`."""
    m, ci = mean_ci(values)
    n = sum(1 for v in values if v is not None and not (isinstance(v, float) and math.isnan(v)))
    return Stat(m, ci, n)


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, Stat) and v.n > 1:
        return f"{float(v):.{digits}f} ± {v.ci:.{digits}f}"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _sources(runs: list[dict], missing: list[str], scale: str) -> dict[str, Any]:
    return {"scale": scale, "runs": [r["run_id"] for r in runs], "missing": missing,
            "baselines": {r["run_id"]: (r["ar"] or {}).get("run_id") for r in runs},
            "missing_ar": sorted({r["ar_command"] for r in runs if r["ar_command"]})}


def write_table(out: Path, name: str, title: str, header: list[str], rows: list[list[Any]], runs: list[dict],
                missing: list[str], note: str = "", scale: str = "", extra: dict[str, Any] | None = None
                ) -> list[str]:
    """Write ``name.md`` and ``name.tex`` plus ``name.sources.json`` (``extra``: more keys for it, e.g. the
    cost files that priced a compared table); returns the paths."""
    title = f"{title} ({scale} scale)" if scale else title
    src = {**_sources(runs, missing, scale), **(extra or {})}
    table = pd.DataFrame([[_fmt(c) for c in r] for r in rows], columns=header, dtype=str)
    md = [f"# {title}", "", table.to_markdown(index=False, disable_numparse=True)]
    md += ["", f"Runs: {len(runs)} from the run store" + (f"; missing cells: {len(missing)}" if missing else "") + "."
           + (" Values are mean ± 95% CI over seeds." if any(isinstance(c, Stat) and c.n > 1 for r in rows for c in r)
              else "")]
    if note:
        md += ["", note]
    md += ["", "Source runs: " + ", ".join(f"`{r['run_id']}`" for r in runs)]
    ars = sorted({v for v in src["baselines"].values() if v})
    if ars:
        md += ["", "Speedups are against the ar runs of the identical workload: " + ", ".join(f"`{a}`" for a in ars)]
    if src["missing_ar"]:
        md += ["", "No matched ar run for some cells (speedup –); create them with:", ""]
        md += [f"    {c}" for c in src["missing_ar"]]
    tex = [table.to_latex(index=False, escape=True, caption=title, position="t").replace("±", r"$\pm$")]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{name}.md", "\n".join(md) + "\n")
    atomic_write_text(out / f"{name}.tex", "".join(tex))
    atomic_write_json(out / f"{name}.sources.json", src)
    return [str(out / f"{name}.md"), str(out / f"{name}.tex")]


def save_figure(fig, out: Path, name: str, runs: list[dict], missing: list[str], scale: str = "") -> list[str]:
    """Save a matplotlib figure as PNG and PDF with its source list (scale added to the title)."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    if scale and fig._suptitle is None:
        fig.suptitle(f"{scale} scale", fontsize=7, x=0.01, ha="left", color="gray")
    fig.text(0.99, 0.995, f"{len(runs)} runs from the run store", ha="right", va="top", fontsize=6, color="gray")
    no_ar = sum(1 for r in runs if r.get("ar_command"))
    if no_ar:
        fig.text(0.99, 0.965, f"{no_ar} runs without a matched ar run (no speedup): see {name}.sources.json",
                 ha="right", va="top", fontsize=6, color="C3")
    paths = []
    for ext in ("png", "pdf"):
        # no creation date: a figure rebuilt from the same runs is the same bytes
        fig.savefig(out / f"{name}.{ext}", dpi=150, bbox_inches="tight",
                    metadata={"CreationDate": None} if ext == "pdf" else None)
        paths.append(str(out / f"{name}.{ext}"))
    plt.close(fig)
    atomic_write_json(out / f"{name}.sources.json", _sources(runs, missing, scale))
    return paths


#: The paired columns every method table adds (``docs/metrics.md §6``; :func:`paired_cells`).
PAIRED_HEADER = ["n (examples)", "speedup 95% CI", "predicted speedup [95% CI]", "Δ quality vs ar [95% CI]",
                 "p vs ar (test)"]


PAIRED_NOTE = ("n: the examples each speedup and quality delta is paired on (the run's and its ar run's). "
               "Intervals: bootstrap 95% over examples; p: exact McNemar for binary scores, Wilcoxon signed-rank "
               "otherwise; the predicted speedup prices each example's forward calls with the pair's measured cost "
               "file (`python -m experiments.bench --cost-curve`), so machine load cannot move it.")


def paired_cells(cmp: dict[str, Any] | None) -> list[Any]:
    """The interval cells of one comparison (:func:`~viasd.analysis.paired.compare_to_ar`): speedup
    CI, predicted (load-free) speedup with its CI, quality Δ with its CI, p-value and test."""
    if cmp is None:
        return ["–"] * 4
    sp, pr, q = cmp["speedup"], cmp["predicted"], cmp["quality"]
    pred = f"{pr.estimate:.2f} {pr.interval()}" if not math.isnan(pr.estimate) else "– (no cost file)"
    delta = (f"{q.estimate:+.3f}" + (f" {q.interval(3)}" if not math.isnan(q.lo) else "")) if q.n else "–"
    p = f"{q.p:.3g} ({q.test}{'; ' + q.detail if q.detail else ''})" if q.n else "–"
    return [sp.interval(), pred, delta, p]


def paired_group(store: RunStore, group: list[dict]) -> dict[str, Any] | None:
    """Paired numbers of a repeat group against its matched ``ar`` runs, the examples of every
    repeat pooled (each paired with its own ``ar`` run's); None without a matched ``ar`` run."""
    runs, ars, first = [], [], None
    for j, r in enumerate(group):
        run = load_run(store, r["run_id"])
        ar = load_run(store, r["ar"]["run_id"]) if r.get("ar") else None
        if run is None or ar is None:
            continue
        first = first or (run, ar)
        runs += [{**e, "id": f"{j}:{e['id']}"} for e in run["examples"]]
        ars += [{**e, "id": f"{j}:{e['id']}"} for e in ar["examples"]]
    if first is None:
        return None
    return compare_to_ar(store, {**first[0], "examples": runs}, {**first[1], "examples": ars})


#: The column a table of code-task runs gets: the sandbox level their programs ran at (meta ``isolation``).
ISOLATION = "code isolation"
#: A code-task run scored before runs recorded the level (the committed ones were scored by root on the
#: project's machine, which the runs themselves do not prove).
NOT_RECORDED = "not recorded (scored before the field)"


def code_isolation(summary: dict[str, Any], meta: dict[str, Any] | None) -> str | None:
    """The isolation level a run's generated programs ran at (``root namespaces``, ``rootless
    namespaces``, ``unsafe``; :data:`NOT_RECORDED` for a run older than the field); None for a run
    that executed no code (no ``pass@1``)."""
    if "metric/pass@1" not in summary:
        return None
    return (meta or {}).get("isolation") or NOT_RECORDED


def with_isolation(header: list[str], rows: list[list[Any]], levels: list[str | None]
                   ) -> tuple[list[str], list[list[Any]]]:
    """``header`` and ``rows`` with the :data:`ISOLATION` column (one level per row, from
    :func:`code_isolation`) when any row executed code; unchanged otherwise."""
    if all(level is None for level in levels):
        return header, rows
    return header + [ISOLATION], [[*r, level or "–"] for r, level in zip(rows, levels, strict=True)]


def read_meta(path: str | Path) -> dict[str, Any]:
    """A run folder's ``meta.json`` ({} when absent)."""
    meta = Path(path) / "meta.json"
    return json.loads(meta.read_text()) if meta.is_file() else {}


def _label(r: dict, keys: list[str]) -> str:
    values = ((k.split(".")[-1], OmegaConf.select(r["config"], k)) for k in keys)
    return ", ".join(f"{k}={v}" for k, v in values if v is not None)  # keys older runs lack are left out


