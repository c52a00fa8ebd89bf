"""Code tasks: HumanEval and MBPP, pass@1 with every program run in :mod:`viasd.tasks.sandbox`.

This module owns extracting the code from a reply (:func:`extract_code_block`), the sandbox
options every code task takes, and the refusal before generation when the sandbox is
unavailable. The configurations and defaults are ``conf/task/{humaneval,mbpp}.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from viasd.errors import ConfigError
from viasd.tasks.base import TASKS, Example, Task
from viasd.tasks.sandbox import isolation_level, require_isolation

__all__ = ["HumanEvalTask", "MbppTask", "extract_code_block"]


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\r?\n(.*?)(?:```|\Z)", re.S | re.I)


def extract_code_block(text: str) -> str | None:
    """The content of the first fenced code block in ``text`` (unclosed allowed), or None."""
    m = _FENCE.search(text)
    return m.group(1) if m else None


class _CodeTask(Task):
    metric = "code_pass_at_1"
    scores_from_records = False  # runs the programs, with the problem's prompt and tests from the data
    key_field = "task_id"
    options = ("timeout_s", "memory_mb", "workers", "unsafe_exec")  # the sandbox's, per program

    def preflight(self) -> str:
        """Raise a one-line ConfigError now if generated code could not be executed at scoring time.

        Refuses when the sandbox is unavailable here, unless ``unsafe_exec: true`` or
        ``VIASD_UNSAFE_EXEC=1`` waives it (see :func:`viasd.tasks.sandbox.require_isolation`).
        Returns how generated code will run: ``sandbox: root namespaces (isolated)``, ``sandbox:
        rootless namespaces (isolated)`` or ``sandbox: unsafe (…waived…)``.
        """
        unsafe = bool(self.cfg["unsafe_exec"])
        require_isolation(unsafe)
        level = isolation_level(unsafe)
        return f"sandbox: {level}" + (" (isolation unavailable, waived: generated code runs unsandboxed)"
                                      if level == "unsafe" else " (isolated)")

    def scoring_meta(self) -> dict[str, Any]:
        """``{"isolation": "root namespaces" | "rootless namespaces" | "unsafe"}``: the level the
        programs ran at (:func:`viasd.tasks.sandbox.isolation_level`)."""
        return {"isolation": isolation_level(bool(self.cfg["unsafe_exec"]))}

    def postprocess(self, text: str) -> str:
        """The code in the first fenced block if there is one, else the text cut at the stop strings.

        Only trailing whitespace is stripped: the first line of a completion is indented.
        """
        block = extract_code_block(text)
        if block is not None:
            return block.rstrip()
        return self.cut_at_stop(text).rstrip()

    def metric_kwargs(self) -> dict[str, Any]:
        return {
            "timeout_s": self.cfg["timeout_s"],
            "memory_mb": self.cfg["memory_mb"],
            "workers": self.cfg["workers"],
            "unsafe_exec": bool(self.cfg["unsafe_exec"]),
        }


@TASKS.register("humaneval")
class HumanEvalTask(_CodeTask):
    """HumanEval: complete a function from its signature and docstring; pass@1 in the sandbox.

    The program is ``prompt + completion``; the checks, run after it, ``test + "\\ncheck(entry_point)"``.
    A completion may be the function body (base models) or the whole function (chat models).
    """

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        return Example(
            id=str(row["task_id"]),
            prompt=self.format("prompt_template", row),
            reference=f"{row['test']}\ncheck({row['entry_point']})",
            meta={
                "plain_prompt": self.format("plain_template", row),
                "code_prompt": row["prompt"],
                "entry_point": row["entry_point"],
                "canonical_solution": row["canonical_solution"],
            },
        )

    def plain_prompt(self, example: Example) -> str:
        # Code completion continues the prompt exactly: no few-shot joins, no stripping.
        return str(example.meta["plain_prompt"])

    def metric_predictions(self, predictions: Sequence[str], examples: Sequence[Example]) -> list[str]:
        return [e.meta["code_prompt"] + p for p, e in zip(predictions, examples, strict=True)]


@TASKS.register("mbpp")
class MbppTask(_CodeTask):
    """MBPP (full), test split task_id 11-510 by default; pass@1 on the three asserts.

    The program is the completion, then ``test_setup_code`` (fixtures built from the program's
    classes run in its process); the checks are ``test_list``.
    """

    options = _CodeTask.options + ("task_id_range",)

    def filter_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rng = self.cfg["task_id_range"]
        if rng is None:
            return rows
        if not (isinstance(rng, (list, tuple)) and len(rng) == 2):
            raise ConfigError(f"task {self.name!r}: task_id_range must be [first, last] or null, got {rng!r}")
        lo, hi = int(rng[0]), int(rng[1])
        return [r for r in rows if lo <= int(r["task_id"]) <= hi]

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        tests = list(row["test_list"])
        fields = {**row, "tests": "\n".join(tests), "first_test": tests[0] if tests else ""}
        setup = str(row.get("test_setup_code") or "")
        return Example(
            id=str(row["task_id"]),
            prompt=self.format("prompt_template", fields),
            reference=f"{setup}\n" + "\n".join(tests),
            meta={
                "plain_prompt": self.format("plain_template", fields),
                "task_id": int(row["task_id"]),
                "canonical_solution": row["code"],
                "setup": setup,
                "tests": "\n".join(tests),
            },
        )

    def metric_predictions(self, predictions: Sequence[str], examples: Sequence[Example]) -> list[str]:
        # The setup code builds fixtures from the program's own classes (MBPP 367's trees): it runs
        # after the program, in the program's process; the asserts run apart (docs/sandbox.md).
        return [
            f"{p}\n\n{e.meta['setup']}" if e.meta["setup"] else p
            for p, e in zip(predictions, examples, strict=True)
        ]

    def metric_references(self, examples: Sequence[Example]) -> list[str]:
        return [str(e.meta["tests"]) for e in examples]

    def plain_prompt(self, example: Example) -> str:
        return str(example.meta["plain_prompt"])
