"""pass@1 of generated code, executed in the project sandbox, as an offline ``evaluate`` metric.

Loaded by path (``viasd.tasks.metrics.load_metric("code_pass_at_1")``). Each prediction is
the program under test (for HumanEval: prompt + completion; for MBPP: the completion) and
each reference is the test code appended after it (for HumanEval:
``test + "\\ncheck(entry_point)"``; for MBPP: setup code + asserts). The joined program runs
in :func:`viasd.tasks.sandbox.run_program` (separate process, timeout, memory limit, no
network, temporary directory); it passes iff it exits with status 0. One sample per
problem, so pass@1 is the fraction passing, on a 0-100 scale.
"""

from __future__ import annotations

import datasets
import evaluate

from viasd.tasks.sandbox import run_programs

_DESCRIPTION = "pass@1 (0-100): the program plus its tests exits cleanly in the sandbox."
_KWARGS = """
Args:
    predictions: list of programs (code to test).
    references: list of test code, appended to the program after a newline.
    timeout_s: wall-clock limit per program (default 10).
    memory_mb: address-space limit per program (default 1024).
    workers: programs run in parallel (default: CPU count, at most 8).
    per_example: also return "per_example" ({"pass@1": 0 or 100} dicts) and "results"
        ({"status", "detail", "seconds"} per program).
Returns:
    {"pass@1": float}
"""
_CITATION = "Chen, M. et al. (2021). Evaluating Large Language Models Trained on Code."


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class CodePassAt1(evaluate.Metric):
    """Sandboxed functional correctness."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            reference_urls=["https://github.com/openai/human-eval"],
        )

    def _compute(
        self, predictions, references, timeout_s=10.0, memory_mb=1024, workers=None, per_example=False
    ):
        programs = [p + "\n" + r for p, r in zip(predictions, references, strict=True)]
        results = run_programs(programs, timeout_s=timeout_s, memory_mb=memory_mb, workers=workers)
        passed = [100.0 * r.passed for r in results]
        result = {"pass@1": sum(passed) / max(len(passed), 1)}
        if per_example:
            result["per_example"] = [{"pass@1": p} for p in passed]
            result["results"] = [
                {"status": r.status, "detail": r.detail, "seconds": r.seconds} for r in results
            ]
        return result
