"""Figures (PNG + PDF): legends outside the data, × on speedup axes, labelled ar = 1× lines,
integer γ ticks, error bars over seeds."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from viasd.analysis.stats import Paired, mean_ci, share_ci
from viasd.report.common import (
    PAIRED_HEADER,
    PAIRED_NOTE,
    REPORTS,
    Stat,
    _label,
    paired_cells,
    paired_group,
    repeat_groups,
    save_figure,
    stat,
    write_table,
)
from viasd.tracking.baseline import (
    ar_index,
    matched_ar,
    quality,
    speedup,
    tier_counts,
    tier_shares,
    workload_key,
)
from viasd.tracking.store import RunStore


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
    groups = sorted(repeat_groups(runs), key=lambda g: OmegaConf.select(g[0]["config"], xkey))
    return ([OmegaConf.select(g[0]["config"], xkey) for g in groups], [stat([r["speedup"] for r in g]) for g in groups])


def _kl_cis(summary: dict) -> tuple[Paired, Paired, Paired]:
    """``(KL(p‖q), KL(p‖q')+KL(q'‖q), gap)`` with bootstrap 95% intervals over calibration texts
    (estimates without intervals for runs made before ``per_text`` was recorded)."""
    t = summary.get("per_text") or {}
    if not all(t.get(k) for k in ("kl_p_q", "kl_p_slim", "kl_slim_q")):
        via = summary["kl_p_slim"] + summary["kl_slim_q"]
        return Paired(0, summary["kl_p_q"]), Paired(0, via), Paired(0, summary["pythagorean_gap"])
    direct, a, b = (np.asarray(t[k], dtype=float) for k in ("kl_p_q", "kl_p_slim", "kl_slim_q"))
    return mean_ci(direct), mean_ci(a + b), mean_ci(direct - a - b)


@REPORTS.register("fig_kl")
def fig_kl(runs, missing, out, store, scale):
    plt, sns = _plot_setup()
    fig, ax = plt.subplots(figsize=(5, 3))
    tasks = [r["summary"]["task"] for r in runs]
    cis = [_kl_cis(r["summary"]) for r in runs]
    x = range(len(runs))
    for off, j, label in ((-0.2, 0, "KL(p||q)"), (0.2, 1, "KL(p||q') + KL(q'||q)")):
        vals = [c[j].estimate for c in cis]
        err = [[0 if math.isnan(c[j].lo) else v - c[j].lo for v, c in zip(vals, cis)],
               [0 if math.isnan(c[j].hi) else c[j].hi - v for v, c in zip(vals, cis)]]
        ax.bar([i + off for i in x], vals, 0.4, label=label, yerr=err, capsize=2)
    ax.set_xticks(list(x), tasks, rotation=20)
    ax.set_ylabel("nats / token")
    _legend_outside(ax)
    ax.set_title(f"KL geometry of the routed slim verifier ({scale}; bars: 95% CI over texts)", fontsize=9)
    paths = save_figure(fig, out, "fig_kl", runs, missing, scale)
    keys = ("kl_p_q", "kl_p_slim", "kl_slim_q", "kl_q_slim", "pythagorean_gap")
    rows = [[r["summary"].get("pair"), r["summary"]["task"], r["summary"].get("keep_ratio"), r["summary"].get("n_tokens"),
             len((r["summary"].get("per_text") or {}).get("kl_p_q") or [])]
            + [r["summary"].get(k) for k in keys] + [c[2].interval(3), r["summary"].get("tv_p_q"),
                                                     r["summary"].get("tv_slim_q")] for r, c in zip(runs, cis)]
    header = ["pair", "task", "keep", "tokens", "texts", "KL(p‖q)", "KL(p‖q')", "KL(q'‖q)", "KL(q‖q')",
              "gap KL(p‖q)−KL(p‖q')−KL(q'‖q)", "gap 95% CI", "TV(p,q)", "TV(q',q)"]
    note = ("p: draft, q': the target's routed slim verifier, q: target (teacher-forced on each task's text). "
            "The paper's geometry needs gap ≥ 0; KL(q'‖q) < KL(p‖q) means the slim verifier is nearer the "
            "target than the draft is. Intervals: bootstrap 95% over the calibration texts (rows of equal length).")
    return paths + write_table(out, "fig_kl", "KL geometry per task", header, rows, runs, missing, note, scale)


@REPORTS.register("fig_tiers")
def fig_tiers(runs, missing, out, store, scale):
    plt, sns = _plot_setup()
    fig, ax = plt.subplots(figsize=(5, 3))
    groups = repeat_groups(runs)
    labels = [g[0]["summary"]["task"] for g in groups]
    shares = [_tier_share_cis(store, g) for g in groups]
    names = {"tier1": "tier 1: draft accepted", "tier2": "tier 2: slim rewrote", "tier3": "tier 3: full model"}
    width = 0.27  # grouped, not stacked: each share's interval drawn around that share
    for j, tier in enumerate(("tier1", "tier2", "tier3")):
        vals = [s[tier].estimate for s in shares]
        ax.bar([i + (j - 1) * width for i in range(len(labels))], vals, width, label=names[tier], capsize=2,
               yerr=[[v - s[tier].lo for v, s in zip(vals, shares)], [s[tier].hi - v for v, s in zip(vals, shares)]])
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("share of emitted tokens")
    _legend_outside(ax)
    ax.set_title(f"VIA-SD: tokens per tier ({scale}; bars: 95% CI over examples)", fontsize=9)
    plt.setp(ax.get_xticklabels(), rotation=20)
    paths = save_figure(fig, out, "fig_tiers", runs, missing, scale)
    return paths + _via_table(out, "fig_tiers", "VIA-SD tokens per tier", runs, missing, scale, "", [], store)


def _tier_share_cis(store: RunStore, group: list[dict]) -> dict[str, Paired]:
    """Each tier's share of the emitted tokens over the examples of a repeat group, with its bootstrap
    interval over examples (:func:`~viasd.analysis.stats.share_ci`)."""
    counts = [tier_counts(e) for r in group for e in (store.examples(r["run_id"]) if store is not None else [])]
    total = [float(sum(c.values())) for c in counts]
    if not sum(total):  # no example records: the repeats' mean share, without an interval
        return {t: Paired(0, float(stat([tier_shares(r["summary"])[t] for r in group])), math.nan, math.nan)
                for t in ("tier1", "tier2", "tier3")}
    return {t: share_ci([c[t] for c in counts], total) for t in ("tier1", "tier2", "tier3")}


def _ref_runs(runs: list[dict], store: RunStore) -> list[dict]:
    """The finished sd runs of the frontier's workload (for labelled reference points)."""
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
        ar = matched_ar(x["config"], index, x["root"])
        m = x["config"].get("method", {})
        ax.scatter(speedup(s, (ar or {}).get("summary")), quality(s)[1], marker="x", color="C3",
                   label=f"{s['method']} γ={m.get('gamma')}, drafter={(m.get('drafter') or {}).get('name')}")
    _ar_line(ax)
    ax.set_xlabel("speedup over ar (×)")
    ax.set_ylabel(quality(runs[0]["summary"])[0] if runs else "quality")
    ax.set_title(f"Speed–quality frontier over τ_accept × τ_slim ({scale})")
    _legend_outside(ax)
    paths = save_figure(fig, out, "fig_thresholds", runs, missing, scale)
    note = "τ > 1 switches a gate off; τ_accept = τ_slim > 1 is the lossless end (sd with the same drafter)."
    return paths + _via_table(out, "fig_thresholds", "VIA-SD τ frontier", runs, missing, scale, note,
                              ["method.tau_accept", "method.tau_slim", "method.tau_escalate"], store)


def _via_table(out, name: str, title: str, runs, missing, scale: str, note: str, keys: list[str],
               store: RunStore) -> list[str]:
    """A figure's numbers as a table: one row per repeat group with its ``keys`` values, speed,
    quality next to its ``ar`` run's, target calls per token and the tier shares."""
    rows = []
    groups = sorted(repeat_groups(runs), key=lambda g: [str(OmegaConf.select(g[0]["config"], k)) for k in keys])
    for g in groups:
        cfg, shares, ar = g[0]["config"], [tier_shares(r["summary"]) for r in g], g[0]["ar"]
        cmp = paired_group(store, g)
        cells = paired_cells(cmp)
        rows.append([g[0]["summary"].get("pair"), g[0]["summary"].get("task"),
                     *(OmegaConf.select(cfg, k) for k in keys),
                     stat([r["summary"].get("tokens_per_s") for r in g]), stat([r["speedup"] for r in g]),
                     cmp["n"] if cmp else "–", *cells[:2],
                     stat([quality(r["summary"])[1] for r in g]), quality(ar["summary"])[1] if ar else None,
                     *cells[2:], stat([r["summary"].get("target_calls_per_token") for r in g]),
                     *(stat([s[t] for s in shares]) for t in ("tier1", "tier2", "tier3"))])
    metrics = sorted({quality(r["summary"])[0] for r in runs} - {""})
    metric = metrics[0] if len(metrics) == 1 else "quality"
    header = ["pair", "task", *(k.split(".")[-1].replace("tau_", "τ_") for k in keys), "tokens/s", "speedup vs ar",
              *PAIRED_HEADER[:3], metric, f"ar {metric}", *PAIRED_HEADER[3:], "target calls / token",
              "tier 1", "tier 2", "tier 3"]
    return write_table(out, name, title, header, rows, runs, missing, " ".join(x for x in (note, PAIRED_NOTE) if x),
                       scale)


@REPORTS.register("fig_gamma")
def fig_gamma(runs, missing, out, store, scale):
    from matplotlib.ticker import MaxNLocator

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
    axes[0].legend().remove()
    _legend_outside(axes[1], handles=axes[0].get_legend_handles_labels()[0])  # methods and the ar line
    fig.suptitle(f"speedup and rejection vs γ ({scale})", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out, "fig_gamma", runs, missing, scale)


@REPORTS.register("fig_keep_ratio")
def fig_keep_ratio(runs, missing, out, store, scale):
    plt, sns = _plot_setup()
    k, sp = _series(runs, "method.slim.keep_ratio")
    groups = sorted(repeat_groups(runs), key=lambda g: OmegaConf.select(g[0]["config"], "method.slim.keep_ratio"))
    t3 = [stat([tier_shares(r["summary"])["tier3"] for r in g]) for g in groups]
    q = [stat([quality(r["summary"])[1] for r in g]) for g in groups]
    metric = quality(runs[0]["summary"])[0]
    fig, axes = plt.subplots(1, 3 if metric else 2, figsize=(10 if metric else 7, 3))
    axes[0].errorbar(k, [float(v) for v in sp], yerr=[v.ci for v in sp], marker="o", capsize=2, label="via_sd")
    axes[1].errorbar(k, [float(v) for v in t3], yerr=[v.ci for v in t3], marker="o", capsize=2)
    _ar_line(axes[0], "y")
    _legend_outside(axes[0])
    axes[0].set(xlabel="slim keep ratio", ylabel="speedup over ar (×)")
    axes[1].set(xlabel="slim keep ratio", ylabel="share of tokens escalated (tier 3)")
    if metric:  # quality next to its ar run's: a faster point that loses quality is not a gain
        axes[2].errorbar(k, [float(v) for v in q], yerr=[v.ci for v in q], marker="o", capsize=2, label="via_sd")
        ar_q = [quality(g[0]["ar"]["summary"])[1] for g in groups if g[0]["ar"]]
        if ar_q:
            axes[2].axhline(ar_q[0], color="gray", lw=0.8, ls="--", label=f"ar {metric}")
        axes[2].set(xlabel="slim keep ratio", ylabel=metric)
        _legend_outside(axes[2])
    fig.suptitle(f"VIA-SD vs slim keep ratio ({scale})", fontsize=9)
    fig.tight_layout()
    paths = save_figure(fig, out, "fig_keep_ratio", runs, missing, scale)
    return paths + _via_table(out, "fig_keep_ratio", "VIA-SD vs slim keep ratio", runs, missing, scale, "",
                              ["method.slim.keep_ratio"], store)


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
    by_pair: dict[str, dict[str, Paired]] = {}
    for g in repeat_groups(runs):
        s = g[0]["summary"]
        cmp = paired_group(store, g) if store is not None else None  # per-example bootstrap, repeats pooled
        by_pair.setdefault(s["pair"], {})[s["method"]] = (
            cmp["speedup"] if cmp else Paired(len(g), float(stat([r["speedup"] for r in g])), math.nan, math.nan))
    pairs = list(by_pair)
    fig, ax = plt.subplots(figsize=(5, 3))
    for m in ("sd", "via_sd"):
        vals = [by_pair[p].get(m, Paired(0, math.nan)) for p in pairs]
        est = [v.estimate for v in vals]
        ax.errorbar(pairs, est, yerr=[[e - v.lo for e, v in zip(est, vals)], [v.hi - e for e, v in zip(est, vals)]],
                    marker="o", capsize=2, label=m)
    _ar_line(ax, "y")
    ax.set(xlabel="pair (growing verifier/draft capacity gap)", ylabel="speedup over ar (×)")
    _legend_outside(ax)
    ax.set_title(f"gain vs capacity gap ({scale}; bars: 95% CI over examples)", fontsize=9)
    return save_figure(fig, out, "fig_gap", runs, missing, scale)


