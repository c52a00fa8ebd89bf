"""The run store's baseline matching: every speed ratio to the ``ar`` run of the identical workload, and the sweep objective.

A run's *workload* is its resolved identity config (``config.yaml`` in the run store, inputs
hashes included) without the method and without what never changes a result (tracking,
hydra, the exp node) or belongs to the method (its slim-mask file; the pair's independent
``intermediate`` model, read only by ``slim.mask=independent``), but *with* the thread count:
same pair (dtype/backend included), task and subset, seed, generation settings, input files
and threads. The exp scale only picks
those values, so a run of the same values outside a grid matches too. The ``ar`` run of
the same workload is the only valid denominator of a speedup; when none is finished the caller
is told which command creates it — there is no fallback to "any ar run of this pair and task".
Over several stores (the user's and the committed results store) a run is paired with the
``ar`` run of its own store, so both numbers of a ratio come from one machine.

``speedup_at_quality`` is the sweep/tuning objective: the speedup over the matched ``ar`` run
when the run's primary quality metric is within ``delta`` of that run's, else 0.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from viasd.tracking.store import RunStore, RunStores

#: Identity keys that do not define the workload a speedup is measured on.
NON_WORKLOAD_KEYS = ("method", "tracking", "hydra", "exp")

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


def workload_key(identity: dict[str, Any]) -> str:
    """Canonical JSON of the workload part of a resolved identity config (see module doc)."""
    ident = {k: v for k, v in identity.items() if k not in NON_WORKLOAD_KEYS}
    if isinstance(ident.get("inputs"), dict):  # a method's own files (a slim mask) are not the workload
        ident["inputs"] = {k: v for k, v in ident["inputs"].items() if not k.startswith("method.")}
    if isinstance(ident.get("pair"), dict):  # only slim.mask=independent reads it: a method input too
        ident["pair"] = {k: v for k, v in ident["pair"].items() if k != "intermediate"}
    return json.dumps(ident, sort_keys=True, default=str)


def ar_index(store: RunStore | RunStores) -> dict[str, list[dict[str, Any]]]:
    """``{workload_key: [finished ar runs]}`` over the store(s), first root first (``run_id``,
    ``config``, ``summary``, ``root``). Only runs that prove themselves (:mod:`viasd.tracking.proof`)
    are listed: a stray, copied or edited folder is never a baseline."""
    out: dict[str, list[dict[str, Any]]] = {}
    stores = store.stores if isinstance(store, RunStores) else [store]
    for s in stores:
        for r in s.finished_runs(label="ar"):  # an ar run's id carries its label; a folder is proved before use
            if r["summary"].get("method") == "ar" and isinstance(r["config"], dict):
                out.setdefault(workload_key(r["config"]), []).append(r)
    return out


def matched_ar(identity: dict[str, Any], index: dict[str, list[dict[str, Any]]],
               root: Path | None = None) -> dict[str, Any] | None:
    """The finished ``ar`` run with the same workload as ``identity`` in the store ``root`` (the
    run's own: a speedup divides two runs measured on one machine; None: any root), or None."""
    for r in index.get(workload_key(identity), []):
        if root is None or Path(r["root"]) == Path(root):
            return r
    return None


def speedup(summary: dict[str, Any], ar_summary: dict[str, Any] | None) -> float:
    """tokens/s of a run over tokens/s of its matched ``ar`` run (NaN without one)."""
    if not ar_summary:
        return math.nan
    base, v = ar_summary.get("tokens_per_s"), summary.get("tokens_per_s")
    return float(v) / float(base) if base and v is not None else math.nan


def speedup_at_quality(summary: dict[str, Any], ar_summary: dict[str, Any] | None, delta: float) -> float:
    """Speedup over the matched ``ar`` run if quality ≥ ar quality − ``delta``, else 0 (NaN without ar).

    Runs without a quality metric (free prompts) count as within ``delta``.
    """
    sp = speedup(summary, ar_summary)
    if math.isnan(sp):
        return sp
    _, q = quality(summary)
    _, q_ar = quality(ar_summary or {})
    if math.isnan(q) or math.isnan(q_ar):
        return sp
    return sp if q >= q_ar - float(delta) else 0.0


def target_calls_per_token(summary: dict[str, Any]) -> float:
    """Full-model forward calls per emitted token (falls back to 1/tokens_per_target_call)."""
    v = summary.get("target_calls_per_token")
    if v is not None and not (isinstance(v, float) and math.isnan(v)):
        return float(v)
    tpc = summary.get("tokens_per_target_call")
    return 1.0 / float(tpc) if tpc else math.nan


def tier_counts(s: dict[str, Any]) -> dict[str, int]:
    """Emitted tokens per VIA-SD tier in a summary or an example record (tier 3 includes the
    verifier's own token)."""
    return {"tier1": s.get("tier1_accepted", 0) or 0,
            "tier2": (s.get("tier2_regenerated", 0) or 0) + (s.get("slim_bonus", 0) or 0),
            "tier3": (s.get("tier3_accepted", 0) or 0) + (s.get("escalations", 0) or 0)}


def tier_shares(s: dict[str, Any]) -> dict[str, float]:
    """Share of emitted tokens per VIA-SD tier (tier 3 includes the verifier's own token)."""
    c = tier_counts(s)
    tot = sum(c.values())
    return {k: (v / tot if tot else 0) for k, v in c.items()}
