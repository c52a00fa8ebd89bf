"""ROUGE-1/2/L/Lsum as an offline ``evaluate`` metric (wraps ``rouge_score``).

Loaded by path (``viasd.tasks.metrics.load_metric("rouge")``), so it never touches the hub.
Scores are F-measures averaged over examples and reported on a 0-100 scale. Stemming is on
by default. ROUGE-Lsum needs one sentence per line: both sides are split with the project's
regex splitter (:func:`viasd.tasks.scoring.split_sentences`), so no nltk punkt data is
needed. A reference may be one string or a list of strings (the best one counts).
"""

from __future__ import annotations

import evaluate
from rouge_score import rouge_scorer

from viasd.tasks.metrics.info import metric_info
from viasd.tasks.scoring import split_sentences

_DESCRIPTION = "ROUGE-1/2/L/Lsum F-measure (0-100) via rouge_score, with a regex sentence split for Lsum."
_KWARGS = """
Args:
    predictions: list of generated texts.
    references: list of reference texts, or of lists of reference texts (best one counts).
    rouge_types: subset of ["rouge1", "rouge2", "rougeL", "rougeLsum"] (default: all four).
    use_stemmer: Porter stemming (default True).
    per_example: also return "per_example", a list of {rouge_type: score} dicts.
Returns:
    {"rouge1": float, "rouge2": float, "rougeL": float, "rougeLsum": float} on 0-100.
"""
_CITATION = "Lin, C.-Y. (2004). ROUGE: A Package for Automatic Evaluation of Summaries."
_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class Rouge(evaluate.Metric):
    """ROUGE with stemming and an nltk-free Lsum sentence split."""

    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS, "https://github.com/google-research/google-research/tree/master/rouge", many_references=True)

    def _compute(self, predictions, references, rouge_types=None, use_stemmer=True, per_example=False):
        types = list(rouge_types or _TYPES)
        unknown = [t for t in types if t not in _TYPES]
        if unknown:
            raise ValueError(f"unknown rouge types {unknown}; choose from {list(_TYPES)}")
        scorer = rouge_scorer.RougeScorer(types, use_stemmer=use_stemmer)

        def prep(text: str) -> str:
            return "\n".join(split_sentences(text)) if "rougeLsum" in types else text

        rows = []
        for pred, ref in zip(predictions, references, strict=True):
            refs = [ref] if isinstance(ref, str) else list(ref)
            scores = scorer.score_multi([prep(r) for r in refs], prep(pred))
            rows.append({t: 100.0 * scores[t].fmeasure for t in types})
        n = max(len(rows), 1)
        result = {t: sum(r[t] for r in rows) / n for t in types}
        if per_example:
            result["per_example"] = rows
        return result
