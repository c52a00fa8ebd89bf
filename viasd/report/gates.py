"""Which VIA-SD gate can win: every gate reading replayed on one trajectory, with quality as bounds.

``experiments.replay … report=DIR/NAME figure=gates`` writes this instead of the plain frontier
(:mod:`viasd.report.replayed`). Each replayed policy is one point: its predicted (load-free) speedup
over ``ar`` on the same trajectory, and its quality as the interval :func:`~viasd.analysis.stats.
quality_bounds` allows: a problem the policy never left the trajectory on scores as ``ar`` did, a
diverged one anywhere in the metric's range (replay cannot tell; only a decode can). The lossless
methods and the oracle gate never diverge, so they sit exactly at ``ar``'s quality. Points are
grouped by the gate *reading*: the paper's thresholds (agreement ``ratio``), ``slim_rel``, the
margin-searched mask, learned gates (by λ) and the oracle bound.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from viasd.analysis.stats import quality_bounds
from viasd.report.common import write_table
from viasd.report.replayed import priced_by, save_replayed_figure

HEADER = ["policy", "gate reading", "predicted speedup", "quality bound [lo, hi]", "problems diverged",
          "divergences / 100 tokens", "tier 1 / 2 / 3"]

#: Reading → colour, in legend order; the lossless methods are red squares (C3).
READINGS = {"thresholds (ratio)": "C0", "thresholds (slim_rel)": "C1", "margin-searched mask": "C2",
            "learned": "C4", "oracle": "k"}


def _overrides(r: dict[str, Any]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in r.get("overrides", []) if "=" in o)


def reading(r: dict[str, Any]) -> str:
    """The gate reading of a replayed policy: ``lossless``, ``oracle``, ``learned λ=…``,
    ``margin-searched mask``, ``thresholds (slim_rel)`` or ``thresholds (ratio)``."""
    if r.get("method_impl", r.get("method")) != "via_sd":
        return "lossless"
    ov = _overrides(r)
    gate = ov.get("method.gate", "oracle" if "oracle" in str(r.get("method", "")) else "thresholds")
    if gate == "oracle":
        return "oracle"
    if gate == "learned":
        lam = re.search(r"lam([0-9.]+?)(?:\.pt)?$", ov.get("method.gate_path", ""))
        return f"learned λ={lam.group(1)}" if lam else "learned"
    if ov.get("method.slim.objective") == "margin":
        return "margin-searched mask"
    return f"thresholds ({ov.get('method.agreement', 'ratio')})"


def _colour(read: str) -> str:
    return "C3" if read == "lossless" else READINGS.get(read, READINGS["learned"] if read.startswith("learned")
                                                       else "C7")


def with_bounds(results: list[dict[str, Any]], ar_scores: list[float]) -> list[dict[str, Any]]:
    """Each result with ``quality_lo``/``quality_hi`` (:func:`quality_bounds` over the examples it
    replayed, ``ar_scores`` indexed by trajectory example) and its ``reading``."""
    out = []
    for r in results:
        idx = r.get("replayed_examples") or list(range(len(ar_scores)))
        pos = {i: j for j, i in enumerate(idx)}
        lo, hi = quality_bounds([ar_scores[i] for i in idx], {pos[i] for i in r.get("diverged_examples", [])})
        out.append({**r, "quality_lo": lo, "quality_hi": hi, "reading": reading(r)})
    return out


def best_points(rows: list[dict[str, Any]], ar_quality: float) -> dict[str, dict[str, Any]]:
    """Per reading, the fastest policy whose quality bound's floor is ``ar``'s quality (no problem ``ar``
    solved can be lost), as ``{reading: row}``; the learned gates are one reading here. A via_sd policy
    whose gate never trusted a token (tiers 1 and 2 both off: ``sd`` with a slim pass) is no gate and is
    left out."""
    best: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = "learned" if r["reading"].startswith("learned") else r["reading"]
        if key != "lossless" and not (r.get("tier_share/tier1", 0) or r.get("tier_share/tier2", 0)):
            continue
        sp = r.get("predicted_speedup", math.nan)
        if r["quality_lo"] >= ar_quality - 1e-9 and not math.isnan(sp) and sp > best.get(key, {}).get(
                "predicted_speedup", -math.inf):
            best[key] = r
    return best


def write_gates(results: list[dict[str, Any]], ar_scores: list[float], metric: str, out: Path, name: str,
                run_id: str, scale: str = "", replayed: dict[str, Any] | None = None) -> list[str]:
    """Write ``name.md``/``.tex``/``.png``/``.pdf`` (+ sources): every replayed policy's predicted speedup
    and quality bound, grouped by gate reading, beside the lossless methods and ``ar``.

    ``results``: :func:`viasd.analysis.replay.replay` outputs over ``run_id``'s trajectory (with
    ``replayed_examples``/``diverged_examples``); ``ar_scores``: that run's per-example ``metric`` (0–100);
    ``replayed``: the replay command and cost file, kept in the sources as a frontier's are
    (:func:`viasd.report.replayed.write_frontier`), so ``report --check`` holds it to its cost file.
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = sorted(with_bounds(results, ar_scores), key=lambda r: (r["reading"], -r.get("predicted_speedup", 0)))
    idx = results[0].get("replayed_examples") if results else None
    ar_q = sum(ar_scores[i] for i in idx) / len(idx) if idx else sum(ar_scores) / max(1, len(ar_scores))
    n = results[0]["n_examples"] if results else 0
    table = [[r["method"], r["reading"], r.get("predicted_speedup", math.nan),
              f"[{r['quality_lo']:.1f}, {r['quality_hi']:.1f}]", f"{len(r.get('diverged_examples', []))}/{n}",
              r.get("divergences_per_100"),
              " / ".join(f"{100 * r.get(f'tier_share/tier{t}', math.nan):.0f}%" for t in (1, 2, 3))
              if "tier_share/tier1" in r else "lossless"] for r in rows]
    best = best_points(rows, ar_q)
    lines = [f"- {k}: " + (f"{v['predicted_speedup']:.2f}× ({v['method']})" if v else "none") for k, v in
             ((k, best.get(k)) for k in ["lossless", *READINGS])]
    note = (f"Replayed over the trajectory of `{run_id}` ({n} problems; `python -m experiments.replay … "
            f"figure=gates`, docs/replay.md): no decoding. ar's {metric} on these problems: {ar_q:.1f}. Quality "
            f"bound: a problem the policy never left ar's trajectory on scores as ar did; a diverged one is unknown "
            f"until decoded (0–100). Predicted speedup: the cost model's, against ar replayed on the same trajectory. "
            f"{priced_by((replayed or {}).get('cost')).strip()} The fastest policy per reading whose floor is ar's "
            f"{metric} (no problem ar solved can be lost) and whose gate trusts some tokens (tier 1 or 2 on):\n\n"
            + "\n".join(lines))
    runs = [{"run_id": run_id, "ar": None, "ar_command": None}]
    paths = write_table(out, name, f"Gate readings replayed ({len(results)} policies)", HEADER, table, runs, [],
                        note, scale)

    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    ax.axhline(ar_q, color="C3", ls="--", lw=0.8)
    ax.plot(1.0, ar_q, ls="", marker="*", ms=10, color="C3")
    ax.annotate("ar", (1.0, ar_q), xytext=(4, 6), textcoords="offset points", fontsize=7, color="C3")
    for r in rows:
        sp, c = r.get("predicted_speedup", math.nan), _colour(r["reading"])
        if r["reading"] == "lossless":
            ax.plot(sp, ar_q, ls="", marker="s", ms=5, color=c)
            continue
        marker = "*" if r["reading"] == "oracle" else "D" if r["reading"].startswith("learned") else "o"
        ax.errorbar(sp, r["quality_lo"], yerr=[[0], [r["quality_hi"] - r["quality_lo"]]], fmt=marker,
                    ms=9 if marker == "*" else 4, color=c, alpha=0.75, elinewidth=0.6, capsize=1.5)
    named = sorted((r.get("predicted_speedup", math.nan), r["method"]) for r in rows if r["reading"] == "lossless")
    span = max(1.0, max((r["quality_hi"] for r in rows), default=ar_q) - min((r["quality_lo"] for r in rows),
                                                                              default=ar_q))
    for i, (sp, method) in enumerate(named):  # lossless methods named, staggered below ar's line
        ax.annotate(method, (sp, ar_q), xytext=(sp, ar_q - span * (0.08 + 0.07 * (i % 4))), fontsize=7,
                    ha="center", color="C3", arrowprops=dict(arrowstyle="-", color="C3", lw=0.5),
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.9))
    ax.set(xlabel="predicted speedup over ar (×)", ylabel=f"{metric}: floor (marker) to ceiling (bar)")
    handles = [Line2D([], [], ls="", marker="s", ms=5, color="C3", label="lossless (exactly ar's quality)"),
               Line2D([], [], ls="--", color="C3", lw=0.8, label=f"ar ({ar_q:.1f})")]
    present = {("learned" if r["reading"].startswith("learned") else r["reading"]) for r in rows}
    handles += [Line2D([], [], ls="", marker="*" if k == "oracle" else "D" if k == "learned" else "o",
                       ms=8 if k == "oracle" else 4, color=c, label=k if k != "oracle" else "oracle gate (bound)")
                for k, c in READINGS.items() if k in present]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False)
    ax.set_title(f"gate readings replayed over {run_id} ({n} problems)", fontsize=8)
    fig.tight_layout()
    return paths + save_replayed_figure(fig, out, name, runs, scale, replayed)
