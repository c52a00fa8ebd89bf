"""Paired statistics on shared examples (scipy.stats), as ``docs/metrics.md §6`` defines them.

Greedy outputs are deterministic, so seeds add nothing: the sample is the problems. Every
comparison of a run with its ``ar`` run pairs the two on the examples they share:

* :func:`mcnemar` — exact McNemar test for a binary score (pass@1, accuracy, exact match): a
  two-sided binomial test on the discordant pairs (``scipy.stats.binomtest``);
* :func:`paired_delta` — a continuous score (ROUGE, BLEU, F1): the mean paired difference with a
  paired bootstrap 95% interval (``scipy.stats.bootstrap``) and the Wilcoxon signed-rank p
  (``scipy.stats.wilcoxon``);
* :func:`speedup_ci` — the speedup over ``ar`` on the shared examples (total tokens / total seconds
  against ``ar``'s) with a bootstrap 95% interval over examples;
* :func:`wilson` — the Wilson 95% interval of a proportion (``binomtest(...).proportion_ci``);
* :func:`mean_ci` — a mean with its bootstrap 95% interval (KL geometry over calibration texts);
* :func:`quality_bounds` — what a replayed lossy policy's quality can be: problems that never left the
  ``ar`` trajectory score as ``ar`` did, a diverged one anywhere in the metric's range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

RESAMPLES = 2000


@dataclass
class Paired:
    """A paired comparison: ``n`` pairs, the estimate with its 95% interval, a p-value, the test."""

    n: int
    estimate: float
    lo: float = math.nan
    hi: float = math.nan
    p: float = math.nan
    test: str = ""
    detail: str = ""

    def interval(self, digits: int = 2) -> str:
        if math.isnan(self.lo):
            return "–"
        return f"[{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson 95% interval of ``k`` successes in ``n`` trials (NaN, NaN for ``n = 0``)."""
    if n == 0:
        return math.nan, math.nan
    ci = stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def is_binary(values) -> bool:
    """Whether every score is pass/fail: 0 or 1, or 0 or 100 (the tasks' per-example pass@1, accuracy
    and exact match are percentages)."""
    v = [x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return bool(v) and (all(x in (0, 1) for x in v) or all(x in (0, 100) for x in v))


def mcnemar(run: list[float], ar: list[float]) -> Paired:
    """Exact McNemar on paired binary scores (0/1 or 0/100): ``estimate`` = mean(run) − mean(ar); ``p``
    two-sided (1.0 without discordant pairs); ``detail``: the discordant counts ``b/c``."""
    a, b = np.asarray(run, dtype=float), np.asarray(ar, dtype=float)
    better, worse = int(((a > 0) & (b == 0)).sum()), int(((a == 0) & (b > 0)).sum())
    p = float(stats.binomtest(better, better + worse, 0.5).pvalue) if better + worse else 1.0
    delta = float(a.mean() - b.mean()) if len(a) else math.nan
    return Paired(len(a), delta, p=p, test="McNemar (exact)", detail=f"{better} better / {worse} worse")


def _bootstrap(data: tuple[np.ndarray, ...], statistic) -> tuple[float, float]:
    if len(data[0]) < 2:
        return math.nan, math.nan
    res = stats.bootstrap(data, statistic, paired=True, vectorized=True, n_resamples=RESAMPLES,
                          confidence_level=0.95, method="percentile", random_state=0)
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (lo, hi) if not (math.isnan(lo) or math.isnan(hi)) else (math.nan, math.nan)


def paired_delta(run: list[float], ar: list[float]) -> Paired:
    """Mean paired difference of a continuous score, its paired bootstrap 95% interval and the
    Wilcoxon signed-rank p (1.0 when every difference is 0)."""
    a, b = np.asarray(run, dtype=float), np.asarray(ar, dtype=float)
    d = a - b
    lo, hi = _bootstrap((d,), lambda x, axis: x.mean(axis=axis))
    p = float(stats.wilcoxon(d).pvalue) if np.any(d != 0) else 1.0
    return Paired(len(d), float(d.mean()) if len(d) else math.nan, lo, hi, p, "Wilcoxon signed-rank")


def quality_delta(run: list[float], ar: list[float]) -> Paired:
    """:func:`mcnemar` for binary scores, else :func:`paired_delta`."""
    return mcnemar(run, ar) if is_binary(run) and is_binary(ar) else paired_delta(run, ar)


def speedup_ci(tokens: list[float], seconds: list[float], ar_tokens: list[float], ar_seconds: list[float]) -> Paired:
    """Speedup over ``ar`` on shared examples — ``(Σ tokens / Σ seconds) / (Σ ar tokens / Σ ar seconds)``
    — with a bootstrap 95% interval over examples (the examples resampled in pairs)."""
    data = tuple(np.asarray(x, dtype=float) for x in (tokens, seconds, ar_tokens, ar_seconds))

    def ratio(t, s, at, as_, axis=-1):
        return (t.sum(axis) / s.sum(axis)) / (at.sum(axis) / as_.sum(axis))

    if not len(data[0]) or data[1].sum() <= 0 or data[3].sum() <= 0:
        return Paired(len(data[0]), math.nan, test="bootstrap")
    lo, hi = _bootstrap(data, ratio)
    return Paired(len(data[0]), float(ratio(*data)), lo, hi, test="bootstrap over examples")


def share_ci(part: list[float], total: list[float]) -> Paired:
    """``Σ part / Σ total`` over examples (e.g. one tier's share of the emitted tokens) with a
    bootstrap 95% interval over examples (each example's ``part`` and ``total`` resampled together)."""
    data = (np.asarray(part, dtype=float), np.asarray(total, dtype=float))
    if not len(data[0]) or data[1].sum() <= 0:
        return Paired(len(data[0]), math.nan, test="bootstrap")
    lo, hi = _bootstrap(data, lambda p, t, axis=-1: p.sum(axis) / t.sum(axis))
    return Paired(len(data[0]), float(data[0].sum() / data[1].sum()), lo, hi, test="bootstrap over examples")


def mean_ci(values) -> Paired:
    """The mean of ``values`` (e.g. a per-text KL) with its bootstrap 95% interval over them."""
    data = np.asarray(values, dtype=float)
    if not len(data):
        return Paired(0, math.nan, test="bootstrap")
    lo, hi = _bootstrap((data,), lambda x, axis: x.mean(axis=axis))
    return Paired(len(data), float(data.mean()), lo, hi, test="bootstrap over texts")


def quality_bounds(ar_scores: list[float], diverged: set[int], floor: float = 0.0, ceiling: float = 100.0
                   ) -> tuple[float, float]:
    """The lowest and highest mean score a policy replayed over ``ar``'s trajectory can have.

    ``ar_scores``: per-example scores of the ``ar`` run (length n, in trajectory order); ``diverged``:
    indices of the examples the policy left the trajectory on. An example that never diverges emits
    ``ar``'s tokens, so it scores as ``ar`` did; a diverged one is unknown until decoded: ``floor`` in the
    lower bound, ``ceiling`` in the upper (the tasks' per-example scores are percentages, 0–100).
    Returns (lo, hi); both equal ``ar``'s mean when nothing diverged.
    """
    n = len(ar_scores)
    if n == 0:
        return math.nan, math.nan
    kept = sum(s for i, s in enumerate(ar_scores) if i not in diverged)
    k = sum(1 for i in range(n) if i in diverged)
    return (kept + k * floor) / n, (kept + k * ceiling) / n
