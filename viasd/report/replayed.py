"""A replayed frontier (``experiments.replay … report=DIR/NAME``) as a table and a figure.

One row / point per replayed policy (:func:`viasd.analysis.replay.replay` results): the predicted
(load-free) speedup over ``ar`` on the same trajectory, tier shares, tier-1 and tier-2 precision
with their Wilson 95% intervals and ``n``, divergences from the trajectory per 100 tokens, and
whether the counters are exact. The figure draws predicted speedup against divergences per 100
tokens and against tier-1 precision (with its interval). ``faster_cascades`` policies are triangles
coloured by deferral rule; their tier 1 is the tokens the rule kept from the drafter (``π = p``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from viasd.report.common import save_figure, write_table
from viasd.utils.fs import atomic_write_json

HEADER = ["policy", "predicted speedup", "target calls / token", "tier 1 / 2 / 3", "tier-1 precision [95% CI] (n)",
          "tier-2 precision [95% CI] (n)", "divergences / 100 tokens", "tokens to first divergence", "exact"]


def _prec(r: dict[str, Any], tier: int) -> str:
    n = r.get(f"precision/tier{tier}_n", 0)
    if not n:
        return "– (0)"
    return (f"{r[f'precision/tier{tier}']:.3f} [{r[f'precision/tier{tier}_lo']:.3f}, "
            f"{r[f'precision/tier{tier}_hi']:.3f}] ({n})")


def _rule(r: dict[str, Any]) -> str | None:
    """The deferral rule of a replayed ``faster_cascades`` policy (its ``method.rule`` override, else the
    method's default ``opt``); None for any other method."""
    if r.get("method_impl") != "faster_cascades":
        return None
    return next((o.split("=", 1)[1] for o in r.get("overrides", []) if o.startswith("method.rule=")), "opt")


def _share(r: dict[str, Any]) -> str:
    if _rule(r) is not None:  # tier 1: tokens the rule kept from the drafter (π = p); tier 3: from the target
        n1, n3 = (r.get(f"precision/tier{t}_n", 0) for t in (1, 3))
        return f"{100 * n1 / max(1, n1 + n3):.0f}% / – / {100 * n3 / max(1, n1 + n3):.0f}%"
    if "tier_share/tier1" not in r:
        return "lossless"
    return " / ".join(f"{100 * r[f'tier_share/tier{t}']:.0f}%" for t in (1, 2, 3))


def _drafter(r: dict[str, Any]) -> str:
    """The drafter a replayed policy used (its ``method.drafter.name`` override, else the method's default)."""
    for o in r.get("overrides", []):
        if o.startswith(("method.drafter.name=", "drafter@method.drafter=")):
            return o.split("=", 1)[1]
    return {"sd_ngram": "ngram", "sd_hybrid": "hybrid"}.get(r.get("method"), "model")


def _ranges(layers: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``0–2,5,7–8``."""
    out, start = [], None
    for i, v in enumerate(layers):
        if start is None:
            start = v
        if i + 1 == len(layers) or layers[i + 1] != v + 1:
            out.append(f"{start}–{v}" if v > start else f"{v}")
            start = None
    return ",".join(out)


def _slim(r: dict[str, Any]) -> str:
    """The tier-2 verifier a replayed ``via_sd`` policy used: ``auto@0.8``, ``random@0.8``, ``independent``,
    ``full`` or an explicit layer list (as ranges)."""
    ov = dict(o.split("=", 1) for o in r.get("overrides", []) if "=" in o)
    mask, keep = ov.get("method.slim.mask", "auto"), ov.get("method.slim.keep_ratio", "0.8")
    if mask.startswith("["):
        return f"layers {_ranges([int(x) for x in mask.strip('[]').split(',') if x.strip()])}"
    return mask if mask in ("independent", "full") else f"{mask}@{keep}"


def _tier2_off(r: dict[str, Any]) -> bool:
    return any(o.startswith("method.tau_slim=") and float(o.split("=", 1)[1]) > 1 for o in r.get("overrides", []))


def write_frontier(results: list[dict[str, Any]], out: Path, name: str, run_id: str, scale: str = "",
                   replayed: dict[str, Any] | None = None) -> list[str]:
    """Write ``name.md``/``.tex``/``.png``/``.pdf`` (+ sources) of a replayed frontier under ``out``.

    ``replayed``: ``{"run", "command", "cost"}`` — the traced run, the replay command that made it and the
    cost file that priced it (:meth:`~viasd.analysis.cost.CostModel.record`: path, sha256, pair; None without
    one), kept in ``name.sources.json`` under ``"replay"`` for ``report --check`` (:mod:`viasd.report.frontier_cost`).
    """
    import matplotlib.pyplot as plt

    rows = [[r["method"], r.get("predicted_speedup", math.nan), r.get("target_calls_per_token"), _share(r),
             _prec(r, 1), _prec(r, 2), r.get("divergences_per_100"), r.get("tokens_to_first_divergence"),
             "yes" if r.get("exact") else "estimate"] for r in results]
    runs = [{"run_id": run_id, "ar": None, "ar_command": None}]
    n = results[0]["n_examples"] if results else 0
    note = (f"Replayed over the trajectory of `{run_id}` ({n} examples; `python -m experiments.replay`, "
            "docs/replay.md): no decoding. Predicted speedup: the cost model's, against `ar` replayed on the same "
            "trajectory (load-free). Precision: share of a tier's tokens equal to the target's greedy token, Wilson "
            "95% interval and n tokens. A policy is exact up to its first divergence from the trajectory. "
            "faster_cascades: tier 1 = tokens its deferral rule kept from the drafter (π = p), tier 3 = from the "
            "target." + priced_by((replayed or {}).get("cost")))
    paths = write_table(out, name, f"Replayed frontier ({len(results)} policies)", HEADER, rows, runs, [], note, scale)
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    via = [r for r in results if "tier_share/tier1" in r]
    # colour by drafter; a grid of one drafter (an ablation of the tier-2 verifier, table4) by its slim verifier
    key = _drafter if len({_drafter(r) for r in via}) > 1 or len({_slim(r) for r in via}) < 2 else _slim
    groups = list(dict.fromkeys(key(r) for r in via))
    palette = [c for c in (f"C{i}" for i in range(10)) if c != "C3"]  # C3: the lossless methods
    colors = {g: palette[i % len(palette)] for i, g in enumerate(groups)}
    hollow = any(_tier2_off(r) for r in via) and any(not _tier2_off(r) for r in via)
    rules = list(dict.fromkeys(_rule(r) for r in results if _rule(r) is not None))  # faster_cascades: by rule
    rule_colors = {g: palette[(len(groups) + i) % len(palette)] for i, g in enumerate(rules)}
    for r in results:
        sp = r.get("predicted_speedup", math.nan)
        rule = _rule(r)
        lossless = "tier_share/tier1" not in r and rule is None
        color = "C3" if lossless else rule_colors[rule] if rule is not None else colors[key(r)]
        face = "none" if hollow and not lossless and rule is None and _tier2_off(r) else color
        axes[0].plot(sp, r.get("divergences_per_100", math.nan), ls="",
                     marker="s" if lossless else "^" if rule is not None else "o",
                     ms=5 if lossless else 4, color=color, mfc=face, alpha=0.8)
        n1 = r.get("precision/tier1_n", 0)
        if n1:
            p, lo, hi = (r[f"precision/tier1{s}"] for s in ("", "_lo", "_hi"))
            axes[1].errorbar(sp, p, yerr=[[p - lo], [hi - p]], fmt="^" if rule is not None else "o", ms=4, color=color, mfc=face, alpha=0.7,
                             capsize=1)
    named = sorted((r.get("predicted_speedup", math.nan), r["method"]) for r in results
                   if not {"method=via_sd", "method=faster_cascades"} & set(r.get("overrides", []))
                   and not any("gamma" in o for o in r.get("overrides", [])))
    top = max([r.get("divergences_per_100") or 0 for r in results] + [1.0])
    axes[0].set_ylim(-0.05 * top, 1.05 * top)  # from 0 (nothing diverges: 0 to 1) with matplotlib's own margins
    for i, (sp, method) in enumerate(named):  # the lossless methods named, staggered above their squares (the
        # label's height a fraction of the axes: inside them also when nothing diverges)
        axes[0].annotate(method, (sp, 0), xytext=(sp, 0.35 + 0.15 * (i % 4)), textcoords=("data", "axes fraction"),
                         fontsize=7, ha="center", color="C3", arrowprops=dict(arrowstyle="-", color="C3", lw=0.5),
                         bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))
    if not any(r.get("precision/tier1_n", 0) for r in results):
        axes[1].text(0.5, 0.5, "no tier-1 tokens: every policy here is lossless", ha="center", va="center",
                     fontsize=8, color="C7", transform=axes[1].transAxes)
    axes[0].set(xlabel="predicted speedup over ar (×)", ylabel="divergences from ar per 100 tokens")
    axes[1].set(xlabel="predicted speedup over ar (×)", ylabel="tier-1 precision (Wilson 95% interval)"
                + ("\nfaster_cascades: tokens kept from the drafter" if rules else ""))
    what = "{} drafter" if key is _drafter else "tier 2: {}"
    handles = [Line2D([], [], ls="", marker="o", ms=4, color=c, label=f"via_sd, {what.format(g)}") for g, c in colors.items()]
    handles += [Line2D([], [], ls="", marker="^", ms=4, color=c, label=f"faster_cascades, rule {g}")
                for g, c in rule_colors.items()]
    if hollow:
        handles.append(Line2D([], [], ls="", marker="o", ms=4, color="C7", mfc="none", label="hollow: tier 2 off (τ_slim > 1)"))
    handles.append(Line2D([], [], ls="", marker="s", ms=5, color="C3", label="lossless methods (sd, sd_ngram,\n"
                          "sd_hybrid, cascade_sd)"))
    axes[1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    fig.suptitle(f"replayed frontier over {run_id}", fontsize=8)
    fig.tight_layout()
    return paths + save_replayed_figure(fig, out, name, runs, scale, replayed)


def save_replayed_figure(fig, out: Path, name: str, runs: list[dict], scale: str,
                         replayed: dict[str, Any] | None) -> list[str]:
    """Save a replay's figure (:func:`~viasd.report.common.save_figure`) and keep ``replayed`` (the replay
    command and the cost file that priced it) in ``name.sources.json`` under ``"replay"``."""
    paths = save_figure(fig, out, name, runs, [], scale)
    sources = out / f"{name}.sources.json"
    atomic_write_json(sources, {**json.loads(sources.read_text()), "replay": replayed})
    return paths


def priced_by(cost: dict[str, Any] | None) -> str:
    """The note's sentence naming the cost file that priced a frontier (its sha256 abbreviated)."""
    if not cost:
        return " No cost file priced it: no predicted speedups."
    pair = f", pair {cost['pair']}" if cost.get("pair") else ""
    other = (f" It was measured for another pair than the trace's ({cost['trace_pair']}; cost.allow_other_pair=true)."
             if cost.get("trace_pair") else "")
    return f" Priced by the cost file `{cost['path']}` (sha256 {str(cost['sha256'])[:12]}…{pair}).{other}"
