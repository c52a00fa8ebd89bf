"""Corpus metrics (BLEU, chrF) of two runs on the same examples, paired.

BLEU and chrF are not a mean of sentence scores: a corpus score is computed from the summed sufficient
statistics of every sentence. This module owns their paired comparison: both runs' scores over the same
examples and the difference with the paired bootstrap resampling of Koehn (2004) that ``sacrebleu
--paired-bs`` runs (``sacrebleu.significance``), using sacrebleu's own metric objects with the settings
of the task's metric (``viasd/tasks/metrics/bleu``: 13a tokenization, chrF defaults). The p-value is the
two-sided one of that test: the share of resampled differences at least as far from their mean as the
observed difference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from viasd.analysis.stats import RESAMPLES, Paired

#: Score keys that name corpus metrics (per-example values of these are sentence scores, not the metric).
CORPUS = ("bleu", "chrf")


def _sacrebleu_metric(name: str):
    from sacrebleu.metrics import BLEU, CHRF

    return BLEU() if name == "bleu" else CHRF()


def _references(refs: list[Any]) -> list[list[str]]:
    """Reference streams (one list per reference position) of per-example references (a string or a list)."""
    per = [[r] if isinstance(r, str) else [str(x) for x in r] for r in refs]
    width = min(len(r) for r in per) if per else 1
    return [[r[k] for r in per] for k in range(width)]


def corpus_delta(name: str, run_preds: list[str], ar_preds: list[str], refs: list[Any]) -> tuple[float, float, Paired]:
    """``(run score, ar score, difference)`` of the corpus metric ``name`` (``bleu``/``chrf``, 0-100) over
    ``n`` paired examples, the difference with a paired bootstrap 95% interval and p (module doc).

    ``run_preds``, ``ar_preds``, ``refs``: length ``n``, aligned per example (``refs[i]`` a string or a
    list of strings).
    """
    metric, streams = _sacrebleu_metric(name), _references(refs)
    run_s = np.asarray(metric._extract_corpus_statistics(run_preds, streams), dtype=float)
    ar_s = np.asarray(metric._extract_corpus_statistics(ar_preds, streams), dtype=float)

    def score(stats: np.ndarray) -> float:
        return float(metric._compute_score_from_stats(list(stats.sum(0))).score)

    run, ar = score(run_s), score(ar_s)
    n = len(run_preds)
    if n < 2:
        return run, ar, Paired(n, run - ar)
    idx = np.random.default_rng(0).integers(0, n, size=(RESAMPLES, n))
    deltas = np.array([score(run_s[i]) - score(ar_s[i]) for i in idx])
    lo, hi = (float(x) for x in np.percentile(deltas, [2.5, 97.5]))
    observed = run - ar
    p = float((np.abs(deltas - deltas.mean()) >= abs(observed) - 1e-9).sum() + 1) / (RESAMPLES + 1)
    return run, ar, Paired(n, observed, lo, hi, min(p, 1.0) if observed else 1.0, "paired bootstrap")
