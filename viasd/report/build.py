"""Rebuild every table and figure from the run store (never from anything else).

For each exp, the cells are re-composed with Hydra (:func:`viasd.experiments.compose_cells`),
their run ids computed exactly as the runner does, and the finished runs read from the local
run store. Outputs go to ``<out>/<scale>/`` with the scale in every title, so a smoke report
can never overwrite local- or paper-scale files. Every speedup is against the ``ar`` run of the
identical workload (:mod:`viasd.report.baseline`); each output lists its runs, the ``ar`` run
each speedup used, the missing cells and, for cells without a matched ``ar`` run, the command
that creates it (``<name>.sources.json``). Runs that differ only in ``seed`` are repeats: tables
print mean ± 95% CI (Student t), figures draw error bars. Tables: Markdown + LaTeX; figures:
PNG + PDF (matplotlib / seaborn).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scipy import stats

from viasd.experiments import compose_cells_with_overrides
from viasd.registry import Registry
from viasd.report.baseline import (
    PRIMARY,  # noqa: F401  (re-exported for notebooks)
    ar_index,
    matched_ar,
    quality,
    speedup,
    target_calls_per_token,
    tier_shares,
)
from viasd.runner import identity
from viasd.tracking.store import RunStore, atomic_write_json, atomic_write_text, run_id_for

REPORTS: Registry[Callable[..., list[str]]] = Registry("report")

__all__ = ["REPORTS", "build_all", "collect", "quality", "tier_shares", "mean_ci"]


def collect(exp: str, scale: str, store: RunStore, overrides: list[str] | None = None) -> tuple[list[dict], list[str]]:
    """Finished runs of every cell of ``exp`` at ``scale`` and the run ids of missing cells.

    Each run: ``run_id``, ``config`` (composed DictConfig), ``identity`` (resolved dict),
    ``summary``, ``ar`` (the matched ``ar`` run dict or None), ``speedup`` (vs that run),
    ``ar_command`` (the command creating the missing ``ar`` run, else None).
    """
    index = ar_index(store)
    base = [o for o in (overrides or []) if not o.lstrip("+").startswith(("exp=", "exp.scale="))]
    runs, missing = [], []
    for cell, cfg in compose_cells_with_overrides(base, exp_name=exp, scale=scale):
        ident = identity(cfg)
        rid = run_id_for(ident)
        if not store.is_finished(rid):
            missing.append(rid)
            continue
        summary = json.loads((store.path(rid) / "summary.json").read_text())
        ar = {"run_id": rid, "summary": summary} if summary.get("method") == "ar" else matched_ar(ident, index)
        cmd = None
        if ar is None:
            keep = [o for o in base + cell if not o.split("=", 1)[0].lstrip("+~").startswith("method")]
            cmd = "python -m experiments.run method=ar " + " ".join(keep)
        runs.append({"run_id": rid, "config": cfg, "identity": ident, "summary": summary, "ar": ar,
                     "speedup": speedup(summary, ar["summary"]) if ar else math.nan, "ar_command": cmd})
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
                missing: list[str], note: str = "", scale: str = "") -> list[str]:
    """Write ``name.md`` and ``name.tex`` plus ``name.sources.json``; returns the paths."""
    title = f"{title} ({scale} scale)" if scale else title
    src = _sources(runs, missing, scale)
    md = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    md += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
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
    esc = lambda s: str(s).replace("_", r"\_").replace("%", r"\%").replace("&", r"\&").replace("±", r"$\pm$")  # noqa: E731
    tex = [r"\begin{table}[t]", r"\centering", r"\caption{" + esc(title) + "}", r"\begin{tabular}{" + "l" * len(header) + "}",
           r"\toprule", " & ".join(esc(h) for h in header) + r" \\", r"\midrule"]
    tex += [" & ".join(esc(_fmt(c)) for c in r) + r" \\" for r in rows]
    tex += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{name}.md", "\n".join(md) + "\n")
    atomic_write_text(out / f"{name}.tex", "\n".join(tex) + "\n")
    atomic_write_json(out / f"{name}.sources.json", src)
    return [str(out / f"{name}.md"), str(out / f"{name}.tex")]


def save_figure(fig, out: Path, name: str, runs: list[dict], missing: list[str], scale: str = "") -> list[str]:
    """Save a matplotlib figure as PNG and PDF with its source list (scale added to the title)."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    if scale and fig._suptitle is None:
        fig.suptitle(f"{scale} scale", fontsize=7, x=0.01, ha="left", color="gray")
    fig.text(0.99, 0.995, f"{len(runs)} runs from the run store", ha="right", va="top", fontsize=6, color="gray")
    paths = []
    for ext in ("png", "pdf"):
        fig.savefig(out / f"{name}.{ext}", dpi=150, bbox_inches="tight")
        paths.append(str(out / f"{name}.{ext}"))
    plt.close(fig)
    atomic_write_json(out / f"{name}.sources.json", _sources(runs, missing, scale))
    return paths


def _label(r: dict, keys: list[str]) -> str:
    from omegaconf import OmegaConf

    return ", ".join(f"{k.split('.')[-1]}={OmegaConf.select(r['config'], k)}" for k in keys)


@REPORTS.register("table1")
def table1(runs, missing, out: Path, store: RunStore, scale: str) -> list[str]:
    rows = []
    for r in runs:
        s = r["summary"]
        rnd = [b["kl_q_slim"] for b in s.get("baselines", {}).get("random", [])]
        fk = s.get("baselines", {}).get("first_k", {})
        eo = s.get("baselines", {}).get("every_other", {})
        rows.append([s["pair"], f"{s['budget']}/{s['n_layers']}", s["objective"], str(s["layers"]), s["kl_q_slim"],
                     s["top1_agreement"], min(rnd) if rnd else math.nan, fk.get("kl_q_slim"), eo.get("kl_q_slim"),
                     s["search_seconds"] / 60, s["n_trials"]])
    return write_table(out, "table1", "Table 1 — DIMR search per pair and budget",
                       ["pair", "kept", "objective", "kept layers", "KL(q||q')", "top-1 agr.", "best of random KL",
                        "first_k KL", "every_other KL", "search min", "trials"], rows, runs, missing, scale=scale)


def _method_table(name: str, title: str, runs, missing, out: Path, scale: str, extra_keys: list[str]) -> list[str]:
    rows = []
    for group in sorted(repeat_groups(runs), key=lambda g: (g[0]["summary"]["pair"], g[0]["summary"]["task"])):
        s = group[0]["summary"]
        qname, _ = quality(s)
        rows.append([s["pair"], s["task"], s["method"] + (f" ({_label(group[0], extra_keys)})" if extra_keys else ""),
                     len(group), stat([r["summary"].get("rejection_rate") for r in group]),
                     stat([target_calls_per_token(r["summary"]) for r in group]),
                     stat([r["speedup"] for r in group]), stat([r["summary"].get("tokens_per_s") for r in group]),
                     f"{qname}={_fmt(stat([quality(r['summary'])[1] for r in group]), 2)}" if qname else "–"])
    return write_table(out, name, title, ["pair", "task", "method", "seeds", "rejection rate", "full-model calls/token",
                                          "speedup vs ar (×)", "tokens/s", "quality"], rows, runs, missing, scale=scale)


@REPORTS.register("table2")
def table2(runs, missing, out, store, scale):
    return _method_table("table2", "Table 2 — main results", runs, missing, out, scale, [])


@REPORTS.register("table3")
def table3(runs, missing, out, store, scale):
    return _method_table("table3", "Table 3 — encoder-decoder (T5)", runs, missing, out, scale, [])


@REPORTS.register("table4")
def table4(runs, missing, out, store, scale):
    return _method_table("table4", "Table 4 — slim-verifier ablation", runs, missing, out, scale, ["method.slim.mask"])


@REPORTS.register("table5")
def table5(runs, missing, out, store, scale):
    return _method_table("table5", "Table 5 — VIA-SD over each drafter", runs, missing, out, scale,
                         ["method.drafter.name"])


def _plot_setup():
    """seaborn's paper theme; the backend is left to matplotlib (inline in notebooks, Agg headless)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return plt, sns


def _legend_outside(ax, **kw) -> None:
    """A legend to the right of the axes, never over the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False, **kw)


def _ar_line(ax, axis: str = "x") -> None:
    """The ``ar`` = 1× reference line, labelled."""
    (ax.axvline if axis == "x" else ax.axhline)(1.0, color="gray", lw=0.8, ls="--", label="ar (1×)")


def _series(runs: list[dict], xkey: str) -> tuple[list[Any], list[Stat]]:
    """``(x values, speedup Stats)`` over repeat groups, sorted by the config value at ``xkey``."""
    from omegaconf import OmegaConf

    groups = sorted(repeat_groups(runs), key=lambda g: OmegaConf.select(g[0]["config"], xkey))
    return ([OmegaConf.select(g[0]["config"], xkey) for g in groups], [stat([r["speedup"] for r in g]) for g in groups])


@REPORTS.register("fig_kl")
def fig_kl(runs, missing, out, store, scale):
    plt, sns = _plot_setup()
    fig, ax = plt.subplots(figsize=(5, 3))
    tasks = [r["summary"]["task"] for r in runs]
    direct = [r["summary"]["kl_p_q"] for r in runs]
    via = [r["summary"]["kl_p_slim"] + r["summary"]["kl_slim_q"] for r in runs]
    x = range(len(runs))
    ax.bar([i - 0.2 for i in x], direct, 0.4, label="KL(p||q)")
    ax.bar([i + 0.2 for i in x], via, 0.4, label="KL(p||q') + KL(q'||q)")
    ax.set_xticks(list(x), tasks, rotation=20)
    ax.set_ylabel("nats / token")
    _legend_outside(ax)
    ax.set_title(f"KL geometry of the routed slim verifier ({scale})")
    return save_figure(fig, out, "fig_kl", runs, missing, scale)


@REPORTS.register("fig_tiers")
def fig_tiers(runs, missing, out, store, scale):
    plt, sns = _plot_setup()
    fig, ax = plt.subplots(figsize=(5, 3))
    groups = repeat_groups(runs)
    labels = [g[0]["summary"]["task"] for g in groups]
    shares = [{t: stat([tier_shares(r["summary"])[t] for r in g]) for t in ("tier1", "tier2", "tier3")} for g in groups]
    bottom = [0.0] * len(groups)
    names = {"tier1": "tier 1: draft accepted", "tier2": "tier 2: slim rewrote", "tier3": "tier 3: full model"}
    for tier in ("tier1", "tier2", "tier3"):
        vals = [float(s[tier]) for s in shares]
        ax.bar(labels, vals, bottom=bottom, label=names[tier], yerr=[s[tier].ci for s in shares], capsize=2)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("share of emitted tokens")
    _legend_outside(ax)
    ax.set_title(f"VIA-SD: tokens per tier ({scale})")
    plt.setp(ax.get_xticklabels(), rotation=20)
    return save_figure(fig, out, "fig_tiers", runs, missing, scale)


def _ref_runs(runs: list[dict], store: RunStore) -> list[dict]:
    """The finished sd runs of the frontier's workload (for labelled reference points)."""
    from viasd.report.baseline import workload_key

    keys = {workload_key(r["identity"]) for r in runs}
    out = []
    for x in store.finished_runs():
        if x["summary"].get("method", "").startswith("sd") and workload_key(x["config"]) in keys:
            out.append(x)
    return out


@REPORTS.register("fig_thresholds")
def fig_thresholds(runs, missing, out, store, scale):
    plt, sns = _plot_setup()
    index = ar_index(store)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for g in repeat_groups(runs):
        sp = stat([r["speedup"] for r in g])
        q = stat([quality(r["summary"])[1] for r in g])
        ax.errorbar(float(sp), float(q), xerr=sp.ci, yerr=q.ci, fmt="o", color="C0", ms=4, capsize=2)
        ax.annotate(_label(g[0], ["method.tau_accept", "method.tau_slim"]).replace("tau_", "τ"), (float(sp), float(q)),
                    fontsize=5)
    for x in _ref_runs(runs, store):
        s = x["summary"]
        ar = matched_ar(x["config"], index)
        m = x["config"].get("method", {})
        ax.scatter(speedup(s, (ar or {}).get("summary")), quality(s)[1], marker="x", color="C3",
                   label=f"{s['method']} γ={m.get('gamma')}, drafter={(m.get('drafter') or {}).get('name')}")
    _ar_line(ax)
    ax.set_xlabel("speedup over ar (×)")
    ax.set_ylabel(quality(runs[0]["summary"])[0] if runs else "quality")
    ax.set_title(f"Speed–quality frontier over τ_accept × τ_slim ({scale})")
    _legend_outside(ax)
    return save_figure(fig, out, "fig_thresholds", runs, missing, scale)


@REPORTS.register("fig_gamma")
def fig_gamma(runs, missing, out, store, scale):
    from matplotlib.ticker import MaxNLocator
    from omegaconf import OmegaConf

    plt, sns = _plot_setup()
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3))
    for method in sorted({r["summary"]["method"] for r in runs}):
        rs = [r for r in runs if r["summary"]["method"] == method]
        g, sp = _series(rs, "method.gamma")
        axes[0].errorbar(g, [float(v) for v in sp], yerr=[v.ci for v in sp], marker="o", capsize=2, label=method)
        groups = sorted(repeat_groups(rs), key=lambda gr: OmegaConf.select(gr[0]["config"], "method.gamma"))
        rej = [stat([r["summary"].get("rejection_rate") for r in gr]) for gr in groups]
        axes[1].errorbar(g, [float(v) for v in rej], yerr=[v.ci for v in rej], marker="o", capsize=2, label=method)
    _ar_line(axes[0], "y")
    axes[0].set(xlabel="γ", ylabel="speedup over ar (×)")
    axes[1].set(xlabel="γ", ylabel="rejection rate")
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _legend_outside(axes[1])
    fig.suptitle(f"speedup and rejection vs γ ({scale})", fontsize=9)
    return save_figure(fig, out, "fig_gamma", runs, missing, scale)


@REPORTS.register("fig_keep_ratio")
def fig_keep_ratio(runs, missing, out, store, scale):
    from omegaconf import OmegaConf

    plt, sns = _plot_setup()
    k, sp = _series(runs, "method.slim.keep_ratio")
    groups = sorted(repeat_groups(runs), key=lambda g: OmegaConf.select(g[0]["config"], "method.slim.keep_ratio"))
    t3 = [stat([tier_shares(r["summary"])["tier3"] for r in g]) for g in groups]
    fig, axes = plt.subplots(1, 2, figsize=(7, 3))
    axes[0].errorbar(k, [float(v) for v in sp], yerr=[v.ci for v in sp], marker="o", capsize=2, label="viasd")
    axes[1].errorbar(k, [float(v) for v in t3], yerr=[v.ci for v in t3], marker="o", capsize=2)
    _ar_line(axes[0], "y")
    _legend_outside(axes[0])
    axes[0].set(xlabel="slim keep ratio", ylabel="speedup over ar (×)")
    axes[1].set(xlabel="slim keep ratio", ylabel="share of tokens escalated (tier 3)")
    fig.suptitle(f"VIA-SD vs slim keep ratio ({scale})", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out, "fig_keep_ratio", runs, missing, scale)


@REPORTS.register("fig_dimr")
def fig_dimr(runs, missing, out, store, scale):
    plt, sns = _plot_setup()
    fig, ax = plt.subplots(figsize=(5, 3))
    for r in runs:
        # Screening drops one layer at a time: those masks are not of the searched budget, so
        # they seed the search but do not count towards its best-so-far curve.
        trials = [t for t in store.examples(r["run_id"]) if t["phase"] != "screen"]
        best, ys = math.inf, []
        for t in trials:
            best = min(best, t["objective"])
            ys.append(best)
        line, = ax.plot(range(len(ys)), ys, label=f"keep={r['summary']['keep_ratio']:.2f} (best so far)")
        ax.scatter(range(len(trials)), [t["objective"] for t in trials], s=6, alpha=0.4, color=line.get_color())
        first_bo = next((j for j, t in enumerate(trials) if t["phase"] == "bo"), None)
        if first_bo is not None:  # where the Bayesian-optimization phase starts
            ax.axvline(first_bo - 0.5, color=line.get_color(), lw=0.6, ls=":")
    ax.set(xlabel="masks of the budget evaluated (random phase | Bayesian optimization ··)",
           ylabel="objective (dots: each mask)", yscale="log")
    _legend_outside(ax)
    ax.set_title(f"DIMR search convergence ({scale})")
    return save_figure(fig, out, "fig_dimr", runs, missing, scale)


@REPORTS.register("fig_gap")
def fig_gap(runs, missing, out, store, scale):
    plt, sns = _plot_setup()
    by_pair: dict[str, dict[str, Stat]] = {}
    for g in repeat_groups(runs):
        s = g[0]["summary"]
        by_pair.setdefault(s["pair"], {})[s["method"]] = stat([r["speedup"] for r in g])
    pairs = list(by_pair)
    fig, ax = plt.subplots(figsize=(5, 3))
    for m in ("sd", "viasd"):
        vals = [by_pair[p].get(m, Stat(math.nan)) for p in pairs]
        ax.errorbar(pairs, [float(v) for v in vals], yerr=[getattr(v, "ci", 0.0) for v in vals], marker="o",
                    capsize=2, label=m)
    _ar_line(ax, "y")
    ax.set(xlabel="pair (growing verifier/draft capacity gap)", ylabel="speedup over ar (×)")
    _legend_outside(ax)
    ax.set_title(f"gain vs capacity gap ({scale})")
    return save_figure(fig, out, "fig_gap", runs, missing, scale)


def build_all(out: Path, store: RunStore, scale: str = "local", names: list[str] | None = None,
              overrides: list[str] | None = None) -> dict[str, Any]:
    """Rebuild the requested (default: all) reports into ``out/<scale>/``; returns ``{name: paths or error}``."""
    result: dict[str, Any] = {}
    dest = Path(out) / scale
    for name in names or REPORTS.names():
        runs, missing = collect(name, scale, store, overrides)
        if not runs:
            result[name] = f"skipped: no finished runs ({len(missing)} cells missing; run +exp={name} exp.scale={scale})"
            continue
        result[name] = REPORTS.get(name)(runs, missing, dest, store, scale)
    return result
