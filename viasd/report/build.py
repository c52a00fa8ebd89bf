"""Rebuild every table and figure from the run store (never from anything else).

For each exp, the cells are re-composed with Hydra (:func:`viasd.experiments.compose_cells`),
their run ids computed exactly as the runner does, and the finished runs read from the local
run store. Each output lists the runs it came from (``<name>.sources.json``) and the cells that
are missing. Tables: Markdown + LaTeX; figures: PNG + PDF (matplotlib / seaborn).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from viasd.registry import Registry
from viasd.tracking.store import RunStore, atomic_write_json, atomic_write_text, run_id_for

REPORTS: Registry[Callable[..., list[str]]] = Registry("report")

#: Preferred quality metric per task (first match wins).
PRIMARY = {"xsum": "rougeL", "cnndm": "rougeL", "wmt14_deen": "bleu", "gsm8k": "accuracy", "nq_open": "exact_match",
           "squad": "f1", "humaneval": "pass@1", "mbpp": "pass@1"}


def quality(summary: dict[str, Any]) -> tuple[str, float]:
    """``(metric name, value)`` of a run's primary task metric (NaN if none)."""
    task = summary.get("task", "")
    metrics = {k[len("metric/"):]: v for k, v in summary.items() if k.startswith("metric/")}
    if not metrics:
        return "", math.nan
    key = PRIMARY.get(task)
    if key not in metrics:
        key = next((k for k in metrics if key and key.lower() in k.lower()), sorted(metrics)[0])
    v = metrics[key]
    return key, (math.nan if v is None else float(v))


def collect(exp: str, scale: str, store: RunStore, overrides: list[str] | None = None) -> tuple[list[dict], list[str]]:
    """Finished runs of every cell of ``exp`` at ``scale`` and the labels of missing cells."""
    from viasd.experiments import compose_cells
    from viasd.runner import identity

    runs, missing = [], []
    for cfg in compose_cells(list(overrides or []), exp_name=exp, scale=scale):
        rid = run_id_for(identity(cfg))
        if store.is_finished(rid):
            runs.append({"run_id": rid, "config": cfg, "summary": json.loads((store.path(rid) / "summary.json").read_text())})
        else:
            missing.append(rid)
    return runs, missing


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def write_table(out: Path, name: str, title: str, header: list[str], rows: list[list[Any]], runs: list[dict],
                missing: list[str], note: str = "") -> list[str]:
    """Write ``name.md`` and ``name.tex`` plus ``name.sources.json``; returns the paths."""
    md = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    md += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    md += ["", f"Runs: {len(runs)} from the run store" + (f"; missing cells: {len(missing)}" if missing else "") + "."]
    if note:
        md += ["", note]
    md += ["", "Source runs: " + ", ".join(f"`{r['run_id']}`" for r in runs)]
    esc = lambda s: str(s).replace("_", r"\_").replace("%", r"\%").replace("&", r"\&")  # noqa: E731
    tex = [r"\begin{table}[t]", r"\centering", r"\caption{" + esc(title) + "}", r"\begin{tabular}{" + "l" * len(header) + "}",
           r"\toprule", " & ".join(esc(h) for h in header) + r" \\", r"\midrule"]
    tex += [" & ".join(esc(_fmt(c)) for c in r) + r" \\" for r in rows]
    tex += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{name}.md", "\n".join(md) + "\n")
    atomic_write_text(out / f"{name}.tex", "\n".join(tex) + "\n")
    atomic_write_json(out / f"{name}.sources.json", {"runs": [r["run_id"] for r in runs], "missing": missing})
    return [str(out / f"{name}.md"), str(out / f"{name}.tex")]


def save_figure(fig, out: Path, name: str, runs: list[dict], missing: list[str]) -> list[str]:
    """Save a matplotlib figure as PNG and PDF with its source list."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig.text(0.99, 0.995, f"{len(runs)} runs from the run store", ha="right", va="top", fontsize=6, color="gray")
    paths = []
    for ext in ("png", "pdf"):
        fig.savefig(out / f"{name}.{ext}", dpi=150, bbox_inches="tight")
        paths.append(str(out / f"{name}.{ext}"))
    plt.close(fig)
    atomic_write_json(out / f"{name}.sources.json", {"runs": [r["run_id"] for r in runs], "missing": missing})
    return paths


def _ar_speed(runs: list[dict], store_runs: list[dict] | None = None) -> dict[tuple[str, str], float]:
    """tokens/s of the ``ar`` run per (pair, task)."""
    out = {}
    for r in runs + (store_runs or []):
        s = r["summary"]
        if s.get("method") == "ar":
            out.setdefault((s["pair"], s["task"]), s.get("tokens_per_s", math.nan))
    return out


def _speedup(s: dict, ar: dict) -> float:
    base = ar.get((s.get("pair"), s.get("task")))
    return s.get("tokens_per_s", math.nan) / base if base else math.nan


def tier_shares(s: dict) -> dict[str, float]:
    """Share of emitted tokens per VIA-SD tier (tier 3 includes the verifier's own token)."""
    t1 = s.get("tier1_accepted", 0) or 0
    t2 = (s.get("tier2_regenerated", 0) or 0) + (s.get("slim_bonus", 0) or 0)
    t3 = (s.get("tier3_accepted", 0) or 0) + (s.get("escalations", 0) or 0)
    tot = t1 + t2 + t3
    return {"tier1": t1 / tot, "tier2": t2 / tot, "tier3": t3 / tot} if tot else {"tier1": 0, "tier2": 0, "tier3": 0}


def _label(r: dict, keys: list[str]) -> str:
    from omegaconf import OmegaConf

    return ", ".join(f"{k.split('.')[-1]}={OmegaConf.select(r['config'], k)}" for k in keys)


def _ar_from_store(store: RunStore) -> list[dict]:
    return [r for r in store.finished_runs() if r["summary"].get("method") == "ar"]


@REPORTS.register("table1")
def table1(runs, missing, out: Path, store: RunStore) -> list[str]:
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
                        "first_k KL", "every_other KL", "search min", "trials"], rows, runs, missing)


def _method_table(name: str, title: str, runs, missing, out: Path, store: RunStore, extra_keys: list[str]) -> list[str]:
    ar = _ar_speed(runs, _ar_from_store(store))
    rows = []
    for r in sorted(runs, key=lambda r: (r["summary"]["pair"], r["summary"]["task"])):
        s = r["summary"]
        qname, q = quality(s)
        rows.append([s["pair"], s["task"], s["method"] + (f" ({_label(r, extra_keys)})" if extra_keys else ""),
                     s.get("rejection_rate"), _speedup(s, ar), s.get("tokens_per_target_call"), s.get("tokens_per_s"),
                     f"{qname}={_fmt(q, 2)}" if qname else "–"])
    return write_table(out, name, title, ["pair", "task", "method", "rejection rate", "speedup vs ar",
                                          "tokens/target call", "tokens/s", "quality"], rows, runs, missing)


@REPORTS.register("table2")
def table2(runs, missing, out, store):
    return _method_table("table2", "Table 2 — main results", runs, missing, out, store, [])


@REPORTS.register("table3")
def table3(runs, missing, out, store):
    return _method_table("table3", "Table 3 — encoder-decoder (T5)", runs, missing, out, store, [])


@REPORTS.register("table4")
def table4(runs, missing, out, store):
    return _method_table("table4", "Table 4 — slim-verifier ablation", runs, missing, out, store, ["method.slim.mask"])


@REPORTS.register("table5")
def table5(runs, missing, out, store):
    return _method_table("table5", "Table 5 — VIA-SD over each drafter", runs, missing, out, store,
                         ["method.drafter.name"])


def _plot_setup():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return plt, sns


@REPORTS.register("fig_kl")
def fig_kl(runs, missing, out, store):
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
    ax.legend()
    ax.set_title("KL geometry of the routed slim verifier")
    return save_figure(fig, out, "fig_kl", runs, missing)


@REPORTS.register("fig_tiers")
def fig_tiers(runs, missing, out, store):
    plt, sns = _plot_setup()
    fig, ax = plt.subplots(figsize=(5, 3))
    labels = [f"{r['summary']['task']}" for r in runs]
    shares = [tier_shares(r["summary"]) for r in runs]
    bottom = [0.0] * len(runs)
    for tier in ("tier1", "tier2", "tier3"):
        vals = [s[tier] for s in shares]
        ax.bar(labels, vals, bottom=bottom, label=tier)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("share of emitted tokens")
    ax.legend(["tier 1: draft accepted", "tier 2: slim rewrote", "tier 3: full model"],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    ax.set_title("VIA-SD: tokens per tier")
    plt.setp(ax.get_xticklabels(), rotation=20)
    return save_figure(fig, out, "fig_tiers", runs, missing)


@REPORTS.register("fig_thresholds")
def fig_thresholds(runs, missing, out, store):
    plt, sns = _plot_setup()
    ar = _ar_speed(runs, _ar_from_store(store))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for r in runs:
        s = r["summary"]
        _, q = quality(s)
        ax.scatter(_speedup(s, ar), q, color="C0")
        ax.annotate(_label(r, ["method.tau_accept", "method.tau_slim"]).replace("tau_", "τ"), (_speedup(s, ar), q),
                    fontsize=5)
    refs = [x for x in store.finished_runs() if x["summary"].get("method") in ("sd", "ar")
            and runs and x["summary"].get("task") == runs[0]["summary"]["task"]
            and x["summary"].get("pair") == runs[0]["summary"]["pair"]]
    for x in refs:
        s = x["summary"]
        _, q = quality(s)
        ax.scatter(_speedup(s, ar), q, marker="x", color="C3")
        ax.annotate(s["method"], (_speedup(s, ar), q), fontsize=6, color="C3")
    ax.set_xlabel("speedup over ar")
    ax.set_ylabel(quality(runs[0]["summary"])[0] if runs else "quality")
    ax.set_title("Speed–quality frontier over τ_accept × τ_slim")
    return save_figure(fig, out, "fig_thresholds", runs, missing)


@REPORTS.register("fig_gamma")
def fig_gamma(runs, missing, out, store):
    from omegaconf import OmegaConf

    plt, sns = _plot_setup()
    ar = _ar_speed(runs, _ar_from_store(store))
    fig, axes = plt.subplots(1, 2, figsize=(7, 3))
    for method in sorted({r["summary"]["method"] for r in runs}):
        rs = sorted((r for r in runs if r["summary"]["method"] == method),
                    key=lambda r: OmegaConf.select(r["config"], "method.gamma"))
        g = [OmegaConf.select(r["config"], "method.gamma") for r in rs]
        axes[0].plot(g, [_speedup(r["summary"], ar) for r in rs], marker="o", label=method)
        axes[1].plot(g, [r["summary"].get("rejection_rate") for r in rs], marker="o", label=method)
    axes[0].set(xlabel="γ", ylabel="speedup over ar")
    axes[1].set(xlabel="γ", ylabel="rejection rate")
    axes[0].legend()
    return save_figure(fig, out, "fig_gamma", runs, missing)


@REPORTS.register("fig_keep_ratio")
def fig_keep_ratio(runs, missing, out, store):
    from omegaconf import OmegaConf

    plt, sns = _plot_setup()
    ar = _ar_speed(runs, _ar_from_store(store))
    rs = sorted(runs, key=lambda r: OmegaConf.select(r["config"], "method.slim.keep_ratio"))
    k = [OmegaConf.select(r["config"], "method.slim.keep_ratio") for r in rs]
    fig, axes = plt.subplots(1, 2, figsize=(7, 3))
    axes[0].plot(k, [_speedup(r["summary"], ar) for r in rs], marker="o")
    axes[1].plot(k, [tier_shares(r["summary"])["tier3"] for r in rs], marker="o")
    axes[0].set(xlabel="slim keep ratio", ylabel="speedup over ar")
    axes[1].set(xlabel="slim keep ratio", ylabel="share of tokens escalated (tier 3)")
    return save_figure(fig, out, "fig_keep_ratio", runs, missing)


@REPORTS.register("fig_dimr")
def fig_dimr(runs, missing, out, store):
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
    ax.legend()
    ax.set_title("DIMR search convergence")
    return save_figure(fig, out, "fig_dimr", runs, missing)


@REPORTS.register("fig_gap")
def fig_gap(runs, missing, out, store):
    plt, sns = _plot_setup()
    ar = _ar_speed(runs)
    by_pair: dict[str, dict[str, float]] = {}
    for r in runs:
        s = r["summary"]
        by_pair.setdefault(s["pair"], {})[s["method"]] = _speedup(s, ar)
    pairs = list(by_pair)
    fig, ax = plt.subplots(figsize=(5, 3))
    for m in ("sd", "viasd"):
        ax.plot(pairs, [by_pair[p].get(m, math.nan) for p in pairs], marker="o", label=m)
    ax.set(xlabel="pair (growing verifier/draft capacity gap)", ylabel="speedup over ar")
    ax.legend()
    return save_figure(fig, out, "fig_gap", runs, missing)


def build_all(out: Path, store: RunStore, scale: str = "local", names: list[str] | None = None,
              overrides: list[str] | None = None) -> dict[str, Any]:
    """Rebuild the requested (default: all) reports; returns ``{name: paths or error}``."""
    result: dict[str, Any] = {}
    for name in names or REPORTS.names():
        runs, missing = collect(name, scale, store, overrides)
        if not runs:
            result[name] = f"skipped: no finished runs ({len(missing)} cells missing; run +exp={name})"
            continue
        result[name] = REPORTS.get(name)(runs, missing, out, store)
    return result
