"""pass@1 of generated code, executed in the project sandbox, as an offline ``evaluate`` metric.

Loaded by path (``viasd.tasks.metrics.load_metric("code_pass_at_1")``). Each prediction is
the program under test (for HumanEval: prompt + completion; for MBPP: the completion, then
the setup code) and each reference is the checks, run in the harness after it, against its
names (for HumanEval: ``test + "\\ncheck(entry_point)"``; for MBPP: the asserts). Both run in
:func:`viasd.tasks.sandbox.run_program`; a sample passes iff the checks ran to completion
(an early exit, ``SystemExit`` or a signal is a failure, whatever the exit status). One
sample per problem, so pass@1 is the fraction passing, on a 0-100 scale.
"""

from __future__ import annotations

import evaluate

from viasd.tasks.metrics.info import metric_info
from viasd.tasks.sandbox import run_programs

_DESCRIPTION = "pass@1 (0-100): the program's checks ran to completion in the sandbox."
_KWARGS = """
Args:
    predictions: list of programs (code to test).
    references: list of checks, run (in the harness) after the program, against its names.
    timeout_s: wall-clock limit per program (default 10).
    memory_mb: memory limit per sample (default 1024).
    workers: programs run in parallel (default: CPU count, at most 8).
    unsafe_exec: run without the sandbox when it is unavailable (default False: refuse).
    per_example: also return "per_example" ({"pass@1": 0 or 100} dicts) and "results"
        ({"passed", "status", "reason", "detail", "seconds"} per program).
Returns:
    {"pass@1": float}
"""
_CITATION = "Chen, M. et al. (2021). Evaluating Large Language Models Trained on Code."


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class CodePassAt1(evaluate.Metric):
    """Sandboxed functional correctness."""

    def _info(self) -> evaluate.MetricInfo:
        return metric_info(_DESCRIPTION, _CITATION, _KWARGS, "https://github.com/openai/human-eval")

    def _compute(
        self,
        predictions,
        references,
        timeout_s=10.0,
        memory_mb=1024,
        workers=None,
        unsafe_exec=False,
        per_example=False,
    ):
        results = run_programs(
            predictions,
            references,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            workers=workers,
            unsafe=unsafe_exec,
        )
        passed = [100.0 * r.passed for r in results]
        result = {"pass@1": sum(passed) / max(len(passed), 1)}
        if per_example:
            result["per_example"] = [{"pass@1": p} for p in passed]
            result["results"] = [
                {
                    "passed": r.passed,
                    "status": r.status,
                    "reason": r.reason,
                    "detail": r.detail,
                    "seconds": r.seconds,
                }
                for r in results
            ]
        return result
