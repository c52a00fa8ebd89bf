"""Summarization tasks: XSum and CNN/DailyMail (article → summary, ROUGE-1/2/L/Lsum).

Each kind maps its rows to :class:`~viasd.tasks.base.Example` and its hub rows to the offline
file's layout; its configuration and defaults are ``conf/task/<name>.yaml``.
"""

from __future__ import annotations

from typing import Any

from viasd.tasks.base import TASKS, Example, Task
from viasd.tasks.scoring import ptb_detokenize

__all__ = ["XSumTask", "CnnDmTask"]


class _SummarizationTask(Task):
    metric = "rouge"
    options = ("detokenize",)  # undo PTB tokenization of the document and reference
    doc_field = "document"
    ref_field = "summary"

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        doc, ref = str(row[self.doc_field]), str(row[self.ref_field])
        if self.cfg.get("detokenize"):
            doc, ref = ptb_detokenize(doc), ptb_detokenize(ref)
        fields = {**row, self.doc_field: doc}
        return Example(
            id=str(row.get("id", index)),
            prompt=self.format("prompt_template", fields),
            reference=ref,
            meta={"plain_prompt": self.format("plain_template", fields)},
        )


@TASKS.register("xsum")
class XSumTask(_SummarizationTask):
    """XSum: one-sentence summaries of BBC articles, ROUGE-1/2/L/Lsum."""

    def normalize_hub_row(self, row: dict[str, Any]) -> dict[str, Any]:
        bbc_id = str(row.get("id", ""))
        return {"document": row["document"], "summary": row["summary"],
                "id": int(bbc_id) if bbc_id.isdigit() else bbc_id}


@TASKS.register("cnndm")
class CnnDmTask(_SummarizationTask):
    """CNN/DailyMail: multi-sentence news highlights, ROUGE-1/2/L/Lsum.

    The default offline file is SummEval's 100 test articles, which are PTB-tokenized;
    ``detokenize: true`` undoes that for the prompt and the reference.
    """

    doc_field = "article"
    ref_field = "highlights"

    def row_key(self, index: int, row: dict[str, Any]) -> str:
        """The article's SHA1 (SummEval ids are ``dm-test-<sha1>``; the hub's are ``<sha1>``)."""
        return str(row.get("id", index)).rsplit("-", 1)[-1]

    def normalize_hub_row(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"id": row["id"], "article": row["article"], "highlights": row["highlights"],
                "references": [row["highlights"]]}
