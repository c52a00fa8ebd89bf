"""Quality by metric of runs compared with one ``ar`` run: every metric a task reports, paired.

A compared table (:mod:`viasd.report.shared`) reads one primary score per example. A task scored by
several metrics — ROUGE-1/2/L for summaries, sacreBLEU and chrF for translation, exact match and F1 for
QA (:data:`TASK_METRICS`) — gets a second table beside it (``<name>_metrics``): per run and metric, its
value on the examples it shares with ``ar``, ``ar``'s on the same examples, and the difference with a
paired bootstrap 95% interval over examples and its p-value.

* Metrics that are a mean over examples (ROUGE, exact match, F1: the corpus score is the mean of the
  per-example scores) resample the per-example differences (:func:`~viasd.analysis.stats.quality_delta`:
  McNemar's exact p for 0/100 scores, Wilcoxon otherwise).
* Corpus metrics (BLEU, chrF: not a mean of sentence scores) are recomputed on each resample from both
  runs' outputs on the same resampled examples (:func:`~viasd.analysis.corpus.corpus_delta`: the paired
  bootstrap of ``sacrebleu --paired-bs``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from viasd.analysis.corpus import CORPUS, corpus_delta
from viasd.analysis.stats import quality_delta

#: The metrics reported per task (per-example score keys; corpus metrics in :data:`CORPUS`).
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "xsum": ("rouge1", "rouge2", "rougeL"),
    "cnndm": ("rouge1", "rouge2", "rougeL"),
    "wmt14_deen": ("bleu", "chrf"),
    "nq_open": ("exact_match", "f1"),
    "squad": ("exact_match", "f1"),
}


def metric_cells(task: str, run: dict[str, Any], ar: dict[str, Any], ids: list[str]) -> list[str]:
    """One row's cells: per metric of ``task``, ``value (ar value) Δ [95% CI] p`` over ``ids``
    (``run``, ``ar``: :func:`~viasd.analysis.paired.load_run` dicts); ``–`` for a metric not scored."""
    by_id, ar_by_id = {e["id"]: e for e in run["examples"]}, {e["id"]: e for e in ar["examples"]}
    cells = []
    for m in TASK_METRICS.get(task, ()):
        if m in CORPUS:
            if not ids:
                cells.append("–")
                continue
            value, base, d = corpus_delta(m, [str(by_id[i].get("prediction") or "") for i in ids],
                                          [str(ar_by_id[i].get("prediction") or "") for i in ids],
                                          [ar_by_id[i].get("reference") for i in ids])
        else:
            pairs = [((by_id[i].get("score") or {}).get(m), (ar_by_id[i].get("score") or {}).get(m)) for i in ids]
            pairs = [(float(a), float(b)) for a, b in pairs if a is not None and b is not None]
            if not pairs:
                cells.append("–")
                continue
            a, b = zip(*pairs)
            value, base, d = float(np.mean(a)), float(np.mean(b)), quality_delta(list(a), list(b))
        ci = "" if math.isnan(d.lo) else f" {d.interval(2)}"
        cells.append(f"{value:.2f} ({base:.2f}) {d.estimate:+.2f}{ci} p={d.p:.3g}")
    return cells


def metric_header(task: str) -> list[str]:
    """The header of :func:`metric_table`'s rows for ``task``."""
    return ["method", "run", "shared examples",
            *[f"{m}{' (corpus)' if m in CORPUS else ''}: run (ar) Δ [95% CI] p" for m in TASK_METRICS.get(task, ())]]


def metric_table(task: str, runs: list[dict[str, Any]], ar: dict[str, Any], labels: dict[str, str]
                 ) -> list[list[Any]]:
    """Rows of :func:`metric_header`: each of ``runs`` (the first may be ``ar`` itself) on the examples it
    shares with ``ar``; empty when ``task`` reports one metric only."""
    if task not in TASK_METRICS:
        return []
    ar_ids = [e["id"] for e in ar["examples"]]
    rows = []
    for run in runs:
        have = {e["id"] for e in run["examples"] if e.get("score") is not None or e.get("prediction") is not None}
        ids = [i for i in ar_ids if i in have]
        rows.append([labels.get(run["run_id"]) or run["summary"].get("method"), run["run_id"], len(ids),
                     *metric_cells(task, run, ar, ids)])
    return rows
