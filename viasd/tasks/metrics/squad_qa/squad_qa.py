"""QA exact match and F1 with SQuAD v1.1 normalization, as an offline ``evaluate`` metric.

Loaded by path (``viasd.tasks.metrics.load_metric("squad_qa")``). Used for SQuAD and
NQ-Open: answers are lower-cased and stripped of punctuation, articles and extra spaces
(:func:`viasd.tasks.scoring.normalize_answer`); each prediction scores the best match over
its references. Both scores are on a 0-100 scale.
"""

from __future__ import annotations

import evaluate

from viasd.tasks.metrics.info import metric_info
from viasd.tasks.scoring import qa_exact_match, qa_f1

_DESCRIPTION = "SQuAD-normalized exact match and token F1 (0-100), best over several references."
_KWARGS = """
Args:
    predictions: list of answer strings.
    references: list of lists of acceptable answers (or single strings).
    per_example: also return "per_example", a list of {"exact_match", "f1"} dicts.
Returns:
    {"exact_match": float, "f1": float}
"""
_CITATION = "Rajpurkar, P. et al. (2016). SQuAD: 100,000+ Questions for Machine Comprehension of Text."


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class SquadQA(evaluate.Metric):
    """Exact match / F1 over multiple references."""

    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS, "https://rajpurkar.github.io/SQuAD-explorer/", many_references=True)

    def _compute(self, predictions, references, per_example=False):
        rows = [
            {"exact_match": 100.0 * qa_exact_match(p, r), "f1": 100.0 * qa_f1(p, r)}
            for p, r in zip(predictions, references, strict=True)
        ]
        n = max(len(rows), 1)
        result = {k: sum(r[k] for r in rows) / n for k in ("exact_match", "f1")}
        if per_example:
            result["per_example"] = rows
        return result
