"""The project's own ``evaluate`` metric modules, loaded by local path (never from the hub).

Each sub-folder ``<name>/<name>.py`` is a regular :class:`evaluate.Metric` module:

* ``rouge`` — ROUGE-1/2/L/Lsum (rouge_score, stemming, regex sentence split for Lsum)
* ``bleu`` — sacrebleu corpus BLEU and chrF
* ``gsm8k_accuracy`` — final-number accuracy for GSM8K
* ``squad_qa`` — SQuAD-normalized exact match and F1 over several references
* ``code_pass_at_1`` — pass@1 with programs executed in :mod:`viasd.tasks.sandbox`

All report 0-100. :func:`load_metric` works with ``HF_HUB_OFFLINE=1`` and
``HF_DATASETS_OFFLINE=1``.
"""

from __future__ import annotations

import difflib
import functools
import threading
from pathlib import Path

from viasd.errors import ConfigError

METRICS_DIR = Path(__file__).resolve().parent
_lock = threading.Lock()

__all__ = ["METRICS_DIR", "available_metrics", "load_metric", "metric_path"]


def available_metrics() -> list[str]:
    """Names of the metric modules shipped with the project."""
    return sorted(p.name for p in METRICS_DIR.iterdir() if (p / f"{p.name}.py").is_file())


def metric_path(name: str) -> Path:
    """Folder of metric ``name``; unknown names raise a ConfigError with a suggestion."""
    path = METRICS_DIR / name
    if not (path / f"{name}.py").is_file():
        known = available_metrics()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown metric {name!r}.{hint} Known metrics: {', '.join(known)}")
    return path


@functools.cache
def _load(name: str):
    import evaluate

    return evaluate.load(str(metric_path(name)), keep_in_memory=True)


def load_metric(name: str):
    """The :class:`evaluate.EvaluationModule` for metric ``name``, loaded by path (cached)."""
    metric_path(name)
    with _lock:
        return _load(name)
