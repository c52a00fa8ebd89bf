"""GSM8K final-answer accuracy as an offline ``evaluate`` metric.

Loaded by path (``viasd.tasks.metrics.load_metric("gsm8k_accuracy")``). The number is taken
from each prediction with :func:`viasd.tasks.scoring.extract_answer_number` (``####``,
``\\boxed{}``, "the answer is", else the last number; the answer there read whole: a fraction as a
fraction, an expression by its value; commas, ``$`` and trailing text ignored) and compared exactly
with the gold number (the text after ``####`` in the reference, or the reference itself). Accuracy is on a 0-100 scale.
"""

from __future__ import annotations

import evaluate

from viasd.tasks.metrics.info import metric_info
from viasd.tasks.scoring import extract_answer_number, extract_gsm8k_gold, numbers_equal

_DESCRIPTION = "GSM8K accuracy (0-100): the prediction's final number equals the gold number."
_KWARGS = """
Args:
    predictions: list of model outputs (chain of thought allowed).
    references: list of GSM8K answer fields ("... #### 18") or bare numbers ("18").
    per_example: also return "per_example", a list of {"accuracy": 0 or 100} dicts, and
        "extracted", the numbers read from the predictions (None where none was found).
Returns:
    {"accuracy": float}
"""
_CITATION = "Cobbe, K. et al. (2021). Training Verifiers to Solve Math Word Problems."


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class Gsm8kAccuracy(evaluate.Metric):
    """Exact numeric match of the extracted final answer."""

    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS, "https://github.com/openai/grade-school-math")

    def _compute(self, predictions, references, per_example=False):
        extracted = [extract_answer_number(p) for p in predictions]
        correct = [
            100.0 * numbers_equal(x, extract_gsm8k_gold(r))
            for x, r in zip(extracted, references, strict=True)
        ]
        result = {"accuracy": sum(correct) / max(len(correct), 1)}
        if per_example:
            result["per_example"] = [{"accuracy": c} for c in correct]
            result["extracted"] = extracted
        return result
