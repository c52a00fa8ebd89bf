"""The ``evaluate.MetricInfo`` of the project's metric modules (one definition of their input schema).

Every metric compares text predictions with one reference string each; the metrics that accept
several acceptable references per prediction also take a list of strings.
"""

from __future__ import annotations

import datasets
import evaluate

__all__ = ["metric_info"]


def metric_info(description: str, citation: str, inputs_description: str, url: str,
                many_references: bool = False) -> evaluate.MetricInfo:  # fmt: skip
    """The MetricInfo of a metric whose inputs are string predictions and string references.

    ``many_references`` also accepts a list of references per prediction (tried first).
    """
    one = datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")})
    many = datasets.Features(
        {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
    )
    return evaluate.MetricInfo(
        description=description,
        citation=citation,
        inputs_description=inputs_description,
        features=[many, one] if many_references else one,
        reference_urls=[url],
    )
