"""Runs compared with one ``ar`` run on the examples they share.

Subsets chosen by example id nest: with the same task seed, ``task.n_examples=10`` picks ids
that ``task.n_examples=40`` also picks. So one long ``ar`` run can be the baseline of shorter
runs of other methods on the same workload (pair, task, generation, seed, threads, inputs —
everything but the method and the subset size). This module owns that comparison:

* speed: tokens/s summed over the shared example ids only (new tokens / decode seconds), and
  its ratio to the ``ar`` run's on the same ids;
* the lossless promise: per example, are the token ids those of ``ar``?
* quality: the mean of each shared example's primary score (``pass@1``, ``accuracy``, …).

Every row names its run id and the table names the ``ar`` run it divides by.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from viasd.errors import ConfigError
from viasd.report.common import write_table
from viasd.tracking.baseline import PRIMARY, workload_key
from viasd.tracking.store import RunStore, RunStores, as_stores
from viasd.utils.fs import atomic_write_json

HEADER = ["method", "run", "shared examples", "new tokens", "tokens/s", "speedup vs ar (same examples)",
          "rejection rate", "examples == ar tokens", "quality (same examples)", "ar quality (same examples)"]


def _finished(store: RunStore | RunStores, run_id: str) -> dict[str, Any]:
    stores = as_stores(store)
    found = stores.find(run_id)
    if found is not None:
        return {**found, "examples": RunStore(found["root"]).examples(run_id)}
    v = stores.verdict(run_id)
    roots = ", ".join(str(s.root) for s in stores.stores)
    why = f"its folder {v.path} is {v.state}: {v.reason}" if v is not None else f"no such folder in {roots}"
    raise ConfigError(f"no finished run {run_id!r} ({why}); list the runs with `python -m experiments.store check`")


def _workload(config: dict[str, Any]) -> dict[str, Any]:
    """The workload part of a run config (:func:`~viasd.tracking.baseline.workload_key`) without the subset size."""
    out = json.loads(workload_key(config))
    out["task"] = {k: v for k, v in (out.get("task") or {}).items() if k != "n_examples"}
    return out


def _differences(a: Any, b: Any, at: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted({*a, *b}) for d in _differences(a.get(k), b.get(k), f"{at}.{k}" if at else k)]
    return [] if a == b else [at]


def _score(example: dict[str, Any], task: str) -> float:
    score = example.get("score") or {}
    key = PRIMARY.get(task)
    value = score.get(key) if key in score else next(iter(score.values()), None)
    return math.nan if value is None else float(value)


def _row(run: dict[str, Any], ar: dict[str, Any], ids: list[str]) -> list[Any]:
    by_id = {e["id"]: e for e in run["examples"]}
    ar_by_id = {e["id"]: e for e in ar["examples"]}
    tokens = sum(by_id[i]["new_tokens"] for i in ids)
    secs = sum(by_id[i]["wall_s"] for i in ids)
    ar_rate = sum(ar_by_id[i]["new_tokens"] for i in ids) / max(sum(ar_by_id[i]["wall_s"] for i in ids), 1e-9)
    rate = tokens / max(secs, 1e-9)
    drafted = sum(by_id[i].get("drafted", 0) for i in ids)
    rejected = sum(by_id[i].get("rejected", 0) for i in ids)
    same = sum(by_id[i]["token_ids"] == ar_by_id[i]["token_ids"] for i in ids)
    task = run["summary"].get("task", "")
    scores = [_score(by_id[i], task) for i in ids]
    ar_scores = [_score(ar_by_id[i], task) for i in ids]
    return [run["summary"].get("method"), run["run_id"], len(ids), tokens, rate, rate / ar_rate,
            rejected / drafted if drafted else math.nan, f"{same}/{len(ids)}",
            sum(scores) / len(scores) if scores else math.nan, sum(ar_scores) / len(ar_scores) if ar_scores else math.nan]


def shared_table(store: RunStore, ar_id: str, run_ids: list[str], ignore: tuple[str, ...] = ()
                 ) -> tuple[list[list[Any]], list[dict[str, Any]], str]:
    """Rows (:data:`HEADER`) of the ``ar`` run and each run on the example ids it shares with ``ar``.

    Returns ``(rows, runs, note)``; a run of another workload (anything but method and subset
    size differs) is a :class:`ConfigError` naming the differing keys, unless each differing
    key is under one of ``ignore`` (e.g. ``pair.draft``: a draft model loaded but unused by
    ``ar`` and by a model-free drafter); the note names the keys ignored.
    """
    ar = _finished(store, ar_id)
    if ar["summary"].get("method") != "ar":
        raise ConfigError(f"{ar_id} is a {ar['summary'].get('method')!r} run; pass an ar run as the baseline")
    ar_ids = [e["id"] for e in ar["examples"]]
    rows, runs = [_row(ar, ar, ar_ids)], [ar]
    ignored: set[str] = set()
    for run_id in run_ids:
        run = _finished(store, run_id)
        diff = _differences(_workload(ar["config"]), _workload(run["config"]))
        ignored.update(d for d in diff if any(d == k or d.startswith(k + ".") for k in ignore))
        diff = [d for d in diff if d not in ignored]
        if diff:
            raise ConfigError(f"{run_id} is not the workload of {ar_id} (differs in {', '.join(diff[:5])}); "
                              f"compare runs of one pair/task/generation/seed")
        ids = [e["id"] for e in run["examples"] if e["id"] in set(ar_ids)]
        if len(ids) < len(run["examples"]):
            raise ConfigError(f"{run_id} has examples the ar run {ar_id} lacks; run ar on a superset "
                              f"(a larger task.n_examples with the same task.seed)")
        rows.append(_row(run, ar, ids))
        runs.append(run)
    runs = [{"run_id": r["run_id"], "ar": {"run_id": ar_id}, "ar_command": None} for r in runs]
    note = (f"Baseline: `{ar_id}` ({len(ar_ids)} examples). Each row's speed and quality are over the examples "
            f"it shares with that run (nested id-hash subsets); tokens/s = new tokens / decode seconds summed "
            f"over those examples."
            + (f" Differences ignored: {', '.join(sorted(ignored))}." if ignored else ""))
    return rows, runs, note


def write_shared(out: Path, name: str, title: str, store: RunStore, ar_id: str, run_ids: list[str],
                 scale: str = "", ignore: tuple[str, ...] = ()) -> list[str]:
    """Write ``name.md``/``.tex``/``.sources.json`` under ``out``; returns the paths."""
    rows, runs, note = shared_table(store, ar_id, run_ids, ignore)
    paths = write_table(out, name, title, HEADER, rows, runs, [], note=note, scale=scale)
    atomic_write_json(out / f"{name}.rows.json", {"header": HEADER, "rows": rows})
    return paths
