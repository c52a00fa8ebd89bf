"""Runs compared with one ``ar`` run on the examples they share, every number paired.

Subsets chosen by example id nest: with the same task seed, ``task.n_examples=10`` picks ids
that ``task.n_examples=40`` also picks. So one long ``ar`` run can be the baseline of shorter
runs of other methods on the same workload (pair, task, generation, seed, threads, inputs —
everything but the method and the subset size). This module owns that comparison's table
(the numbers: :func:`viasd.analysis.paired.compare_to_ar`):

* speed: tokens/s summed over the shared example ids only (new tokens / decode seconds), its
  ratio to the ``ar`` run's on the same ids with a bootstrap 95% interval over examples, and the
  cost model's load-free prediction of that ratio (when the pair's cost file is in the store), and
  the same ratio in process CPU seconds (``cpu_s``, where both runs recorded it); the written
  sources record, per run, the cost file that priced its prediction by hash (``costs``), so
  ``report --check`` calls the table stale when that file is missing or changed;
* the rejection rate (Σ rejected / Σ drafted: ``docs/metrics.md``) and the target model's calls per
  new token, each a ratio of sums over the shared examples with a bootstrap 95% interval;
* the lossless promise: per example, are the token ids those of ``ar``?
* for code tasks, the sandbox's isolation level each run's programs ran at (``meta.json``;
  runs older than the field say so);
* quality: the mean of each shared example's primary score (``pass@1``, ``accuracy``, …), the
  paired difference to ``ar`` with its interval and p-value (McNemar exact for binary scores,
  Wilcoxon for continuous ones: ``docs/metrics.md §6``); for a corpus metric (BLEU), the corpus
  score of the shared examples with a paired bootstrap (:mod:`viasd.analysis.corpus`).

Every row names its run id and ``n``; the table names the ``ar`` run it divides by.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from viasd.analysis.corpus import CORPUS
from viasd.analysis.paired import (
    compare_to_ar,
    differences,
    load_run,
    load_unfinished,
    run_cost,
    workload_without_subset,
)
from viasd.analysis.stats import Paired, share_ci
from viasd.errors import ConfigError
from viasd.report.common import ISOLATION, code_isolation, paired_cells, with_isolation, write_table
from viasd.report.quality import metric_header, metric_table
from viasd.tracking.baseline import PRIMARY
from viasd.tracking.store import RunStore, RunStores, as_stores
from viasd.utils.fs import atomic_write_json

HEADER = ["method", "run", "shared examples", "new tokens", "tokens/s", "speedup vs ar (same examples)",
          "speedup 95% CI", "predicted speedup [95% CI]", "CPU-time speedup [95% CI]", "rejection rate [95% CI]",
          "target calls / token [95% CI]", "examples == ar tokens",
          "quality (same examples)", "ar quality (same examples)", "Δ quality [95% CI]", "p vs ar (test)"]


def _finished(store: RunStore | RunStores, run_id: str, unfinished: bool = False) -> dict[str, Any]:
    run = load_run(store, run_id)
    if run is not None:
        return run
    stores = as_stores(store)
    if unfinished:
        run = next((r for s in stores.stores if (r := load_unfinished(s, run_id)) is not None), None)
        if run is not None:
            return run
    v = stores.verdict(run_id)
    roots = ", ".join(str(s.root) for s in stores.stores)
    why = f"its folder {v.path} is {v.state}: {v.reason}" if v is not None else f"no such folder in {roots}"
    raise ConfigError(f"no finished run {run_id!r} ({why}); list the runs with `python -m experiments.store check`")


def _ratio_cell(ratio: Paired, digits: int) -> str:
    """``estimate [lo, hi]`` of a ratio of sums over examples; ``–`` where it is undefined (no draft)."""
    return "–" if math.isnan(ratio.estimate) else f"{ratio.estimate:.{digits}f} {ratio.interval(digits)}"


def _row(store: RunStore, run: dict[str, Any], ar: dict[str, Any], label: str | None = None
         ) -> tuple[list[Any], dict[str, Any] | None]:
    """One table row of ``run`` against ``ar`` and the record of the cost file that priced its predicted
    speedup (:meth:`~viasd.analysis.cost.CostModel.record`; None: no cost file, no prediction). Every row
    is priced by its baseline's cost file (the machine ``ar`` was decoded on), so one table has one
    price list and a row decoded on another machine compares with the rest."""
    cost = run_cost(store, ar)
    cmp = compare_to_ar(store, run, ar, cost)
    by_id = {e["id"]: e for e in run["examples"]}
    ids = cmp["ids"]
    tokens = sum(by_id[i]["new_tokens"] for i in ids)
    secs = sum(by_id[i]["wall_s"] for i in ids)
    col = (lambda key: [float(by_id[i].get(key) or 0) for i in ids])
    rejection = share_ci(col("rejected"), col("drafted"))
    calls = share_ci(col("target_calls"), col("new_tokens"))
    cells, cpu = paired_cells(cmp), cmp["cpu"]
    cpu_cell = (f"{cpu.estimate:.2f} {cpu.interval()}" + (f" (n={cpu.n})" if cpu.n != len(ids) else "")
                if not math.isnan(cpu.estimate) else "– (no cpu_s)")
    return [label or run["summary"].get("method"), run["run_id"], len(ids), tokens, tokens / max(secs, 1e-9),
            cmp["speedup"].estimate, *cells[:2], cpu_cell, _ratio_cell(rejection, 3), _ratio_cell(calls, 3),
            f"{cmp['same_tokens']}/{len(ids)}", cmp["quality_mean"], cmp["ar_quality_mean"], *cells[2:]
            ], (cost.record() if cost is not None and ids else None)


def decoded_apart(run: dict[str, Any], ar_id: str) -> bool:
    """Whether an interleaved ``run`` was decoded without its ``ar`` cell beside it (a cell added to an exp
    after the others finished: its ``meta.json`` ``schedule.decoded_with`` lacks ``ar_id``), so its wall and
    CPU-time speedups divide seconds measured in another process, under another load."""
    beside = ((run.get("meta") or {}).get("schedule") or {}).get("decoded_with")
    return isinstance(beside, list) and ar_id not in beside


def shared_table(store: RunStore, ar_id: str, run_ids: list[str], ignore: tuple[str, ...] = (),
                 unfinished: bool = False, labels: dict[str, str] | None = None
                 ) -> tuple[list[list[Any]], list[dict[str, Any]], str]:
    """Rows (:data:`HEADER`) of the ``ar`` run and each run on the example ids it shares with ``ar``.

    Returns ``(rows, runs, note)``; a run of another workload (anything but method and subset
    size differs) is a :class:`ConfigError` naming the differing keys, unless each differing
    key is under one of ``ignore`` (e.g. ``pair.draft``: a draft model loaded but unused by
    ``ar`` and by a model-free drafter); the note names the keys ignored. ``unfinished``: runs still
    being decoded count too, on their complete examples (an interim reading of an interleaved exp;
    each row on the ids it shares with ``ar``, and examples not yet scored have no quality).
    ``labels``: a row's name by run id (an interleaved exp's variant labels; default: the method).
    Each of ``runs`` carries ``cost``: the record of the cost file that priced its predicted speedup, and
    ``loaded``: the run it read (:func:`~viasd.analysis.paired.load_run`).
    """
    labels = labels or {}
    ar = _finished(store, ar_id, unfinished)
    if ar["summary"].get("method") != "ar":
        raise ConfigError(f"{ar_id} is a {ar['summary'].get('method')!r} run; pass an ar run as the baseline")
    ar_ids = [e["id"] for e in ar["examples"]]
    row, cost = _row(store, ar, ar, labels.get(ar_id))
    rows, runs, costs = [row], [ar], {ar_id: cost}
    ignored: set[str] = set()
    for run_id in run_ids:
        run = _finished(store, run_id, unfinished)
        diff = differences(workload_without_subset(ar["config"]), workload_without_subset(run["config"]))
        ignored.update(d for d in diff if any(d == k or d.startswith(k + ".") for k in ignore))
        diff = [d for d in diff if d not in ignored]
        if diff:
            raise ConfigError(f"{run_id} is not the workload of {ar_id} (differs in {', '.join(diff[:5])}); "
                              f"compare runs of one pair/task/generation/seed")
        ids = [e["id"] for e in run["examples"] if e["id"] in set(ar_ids)]
        if len(ids) < len(run["examples"]) and not unfinished:
            raise ConfigError(f"{run_id} has examples the ar run {ar_id} lacks; run ar on a superset "
                              f"(a larger task.n_examples with the same task.seed)")
        row, costs[run_id] = _row(store, run, ar, labels.get(run_id))
        rows.append(row)
        runs.append(run)
    apart = [labels.get(r["run_id"]) or r["run_id"] for r in runs[1:] if decoded_apart(r, ar_id)]
    _, rows = with_isolation(HEADER, rows, [code_isolation(r["summary"], r.get("meta")) for r in runs])
    runs = [{"run_id": r["run_id"], "ar": {"run_id": ar_id}, "ar_command": None, "cost": costs[r["run_id"]],
             "loaded": r} for r in runs]
    note = (f"Baseline: `{ar_id}` ({len(ar_ids)} examples). Each row's speed and quality are over the examples "
            f"it shares with that run (nested id-hash subsets; n = shared examples); tokens/s = new tokens / decode "
            f"seconds summed over those examples. Intervals: bootstrap 95% over examples (speedups, continuous "
            f"quality, rejection rate = Σ rejected / Σ drafted, target calls per new token); p: exact McNemar for binary scores, Wilcoxon signed-rank otherwise. The predicted speedup "
            f"prices each example's forward calls with the pair's measured cost file (load-free); the CPU-time "
            f"speedup divides process CPU seconds (`cpu_s`; one torch thread), which a descheduled process or a "
            f"paused machine does not advance, where the wall clock does."
            + _quality_note(str(ar["summary"].get("task", "")))
            + (f" Differences ignored: {', '.join(sorted(ignored))}." if ignored else "")
            + (f" Not decoded beside `{ar_id}` (added after it finished; meta.json `schedule.decoded_with`): "
               f"{', '.join(f'`{a}`' for a in apart)}: their speedup and CPU-time speedup compare two sessions' "
               f"loads; read their predicted speedup." if apart else ""))
    return rows, runs, note


def _quality_note(task: str) -> str:
    """The sentence naming the quality column's metric for ``task`` ('' when the task has none)."""
    metric = PRIMARY.get(task)
    if not metric:
        return ""
    if metric in CORPUS:
        return (f" Quality: corpus {metric} of the shared examples' predictions (not a mean of sentence scores), "
                "its difference by paired bootstrap resampling as `sacrebleu --paired-bs`.")
    return f" Quality: mean per-example {metric}."


def shared_header(rows: list[list[Any]]) -> list[str]:
    """The header of :func:`shared_table`'s rows: :data:`HEADER`, plus the code isolation column
    when the runs executed generated code (:func:`~viasd.report.common.with_isolation`)."""
    return HEADER + [ISOLATION] if rows and len(rows[0]) > len(HEADER) else HEADER


def write_shared(out: Path, name: str, title: str, store: RunStore, ar_id: str, run_ids: list[str],
                 scale: str = "", ignore: tuple[str, ...] = (), labels: dict[str, str] | None = None,
                 legend: str = "") -> list[str]:
    """Write ``name.md``/``.tex``/``.sources.json`` under ``out``; returns the paths. ``labels``: row
    names by run id; ``legend``: text put before the note (e.g. what each label runs)."""
    rows, runs, note = shared_table(store, ar_id, run_ids, ignore, labels=labels)
    note = f"{legend} {note}" if legend else note
    header = shared_header(rows)
    costs = {r["run_id"]: r["cost"] for r in runs}
    priced = {c["sha256"]: c for c in costs.values() if c}
    if priced:
        note += " Priced by " + "; ".join(f"the cost file `{c['path']}` (sha256 {c['sha256'][:12]}…)"
                                          for c in priced.values()) + "."
    paths = write_table(out, name, title, header, rows, runs, [], note=note, scale=scale, extra={"costs": costs})
    atomic_write_json(out / f"{name}.rows.json", {"header": header, "rows": rows})
    full = [r["loaded"] for r in runs]  # the runs the table read, ar first
    task = str(full[0]["summary"].get("task", ""))
    by_metric = metric_table(task, full, full[0], labels or {})
    if by_metric:
        paths += write_table(out, f"{name}_metrics", f"{title}: quality by metric", metric_header(task), by_metric,
                             runs, [], scale=scale, note=(
                                 f"Each cell: the run's score on the examples it shares with `{ar_id}` (0-100), ar's "
                                 "on the same examples in parentheses, the difference with its paired bootstrap 95% "
                                 "interval over examples, and p. Mean-of-example metrics: exact McNemar p for 0/100 "
                                 "scores, Wilcoxon signed-rank otherwise; corpus metrics (BLEU, chrF) recomputed on "
                                 "each resample from both runs' outputs on the same examples (paired bootstrap "
                                 "resampling, as `sacrebleu --paired-bs`). Read the differences, not the "
                                 "levels: a pair is compared with its own target's greedy output."))
    return paths
