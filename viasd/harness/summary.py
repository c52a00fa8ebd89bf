"""A run's summary: corpus statistics from its examples, the speedup over its matched ``ar`` run,
and the table printed at the end of a run — with no ``nan`` in it: a missing value prints as
``–`` and a missing ``ar`` run as the command that creates it (:func:`ar_command`, checked by
composing it) — and the warning when most outputs were cut off at ``max_new_tokens`` (:func:`cut_off_warning`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from viasd.engine.result import aggregate  # noqa: F401  (re-exported: a run's corpus statistics)
from viasd.tracking.baseline import ar_index, matched_ar, speedup, speedup_at_quality, workload_key
from viasd.tracking.store import RunStore

SUMMARY_KEYS = ("method", "pair", "task", "n_examples", "new_tokens", "wall_s", "tokens_per_s",
                "rejection_rate", "target_calls_per_token", "mean_accepted", "speedup_vs_ar", "speedup_at_quality")

# Keys of an example record that are not decoding statistics.
EXAMPLE_ONLY = ("id", "prompt", "prediction", "raw_output", "reference", "token_ids", "score", "interleave_slot")

# Override prefixes dropped from a cell's command line to name its ar run: the method, and the exp/scale/hydra keys
# that would start a grid instead of one run.
DROPPED_FOR_AR = ("method", "drafter@method", "exp", "scale", "hydra", "dry_run", "dry_run_strict")


def matched_speedups(summary: dict[str, Any], resolved: dict[str, Any], store: RunStore,
                     delta: float) -> dict[str, Any]:
    """``speedup_vs_ar``, ``speedup_at_quality`` and ``ar_run_id`` against the matched ``ar`` run."""
    ar = {"run_id": summary.get("run_id"), "summary": summary} if summary.get("method") == "ar" else \
        matched_ar(resolved, ar_index(store))
    if ar is None:
        return {"speedup_vs_ar": math.nan, "speedup_at_quality": math.nan, "ar_run_id": None}
    return {"speedup_vs_ar": speedup(summary, ar["summary"]),
            "speedup_at_quality": speedup_at_quality(summary, ar["summary"], delta), "ar_run_id": ar["run_id"]}


def ar_command(overrides: list[str] | None, resolved: dict[str, Any], compose_identity) -> str | None:
    """``python -m experiments.run method=ar …``: the command line ``overrides`` with the method
    (and exp/scale/hydra) keys dropped, returned only when ``compose_identity(its overrides)``
    (a function composing them into an identity config) gives the workload of ``resolved``."""
    if overrides is None:
        return None
    keep = [o for o in overrides if not o.lstrip("+~").startswith(DROPPED_FOR_AR)]
    try:
        if workload_key(compose_identity(["method=ar", *keep])) != workload_key(resolved):
            return None
    except Exception:  # a command line that does not compose alone (an exp's cell): no command to give
        return None
    return " ".join(["python -m experiments.run", "method=ar", *keep])


def fmt(v: Any) -> str:
    """A summary value as printed: 4 significant digits, ``–`` for a missing value (never ``nan``)."""
    if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "–"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def print_summary(summary: dict[str, Any], path: Path, ar_hint: str | None = None) -> None:
    """Print a small summary table to stdout; without a matched ``ar`` run, how to make one."""
    rows = [(k, summary.get(k)) for k in SUMMARY_KEYS] + [(k, v) for k, v in summary.items() if k.startswith("metric/")]
    width = max(len(k) for k, _ in rows)
    print("\n" + "-" * (width + 20))
    for k, v in rows:
        print(f"{k:<{width}}  {fmt(v)}")
    print("-" * (width + 20))
    print(f"run folder: {path}")
    if summary.get("method") != "ar" and not summary.get("ar_run_id"):
        how = f"create it with: {ar_hint}" if ar_hint else \
            "create it by running method=ar with the same pair, task, generation settings and seed"
        print(f"no matched ar run for a speedup (–); {how}")


def cut_off_warning(new_tokens: list[int], max_new_tokens: int, scored: bool) -> str | None:
    """A warning when most outputs (over half of ``new_tokens``, one count per example) stopped at
    ``max_new_tokens`` — cut off, not finished — so a scored task's quality reads low (HumanEval pass@1 of
    programs cut mid-function); None otherwise or for an unscored task."""
    cut = sum(n >= max_new_tokens for n in new_tokens)
    if not scored or not new_tokens or cut * 2 <= len(new_tokens):
        return None
    return (f"warning: {cut}/{len(new_tokens)} outputs stopped at generation.max_new_tokens={max_new_tokens}, cut off "
            "before they finished; their scores count them as cut (a program cut mid-function fails); raise "
            "generation.max_new_tokens for the task's quality")
