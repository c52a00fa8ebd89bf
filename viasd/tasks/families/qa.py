"""Question-answering tasks: Natural Questions (open, closed book) and SQuAD v1.1 (EM/F1).

The configurations and defaults are ``conf/task/{nq_open,squad}.yaml``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from viasd.tasks.base import TASKS, Example, Task

__all__ = ["NqOpenTask", "SquadTask"]


def _dedupe(items: Sequence[Any]) -> list[str]:
    return list(dict.fromkeys(str(x) for x in items))


@TASKS.register("nq_open")
class NqOpenTask(Task):
    """Natural Questions (open), closed-book; SQuAD-normalized EM/F1 against any answer."""

    metric = "squad_qa"
    key_field = "question"

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        q = str(row["question"]).strip()
        q = q if q.endswith("?") else q + "?"
        fields = {**row, "question": q}
        return Example(
            id=str(index),
            prompt=self.format("prompt_template", fields),
            reference=_dedupe(row["answer"]),
            meta={"plain_prompt": self.format("plain_template", fields)},
        )


@TASKS.register("squad")
class SquadTask(Task):
    """SQuAD v1.1 dev, reading comprehension; EM/F1 against the annotators' answers."""

    metric = "squad_qa"

    def normalize_hub_row(self, row: dict[str, Any]) -> dict[str, Any]:
        answers = row.get("answers")
        if isinstance(answers, dict):
            answers = list(answers.get("text", []))
        return {k: row[k] for k in ("id", "title", "context", "question")} | {"answers": list(answers or [])}

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        return Example(
            id=str(row.get("id", index)),
            prompt=self.format("prompt_template", row),
            reference=_dedupe(row["answers"]),
            meta={"plain_prompt": self.format("plain_template", row), "title": row.get("title")},
        )
