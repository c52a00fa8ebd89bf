"""Translation task: WMT14 newstest2014 German→English (sacrebleu BLEU and chrF).

The configuration and defaults are ``conf/task/wmt14_deen.yaml``.
"""

from __future__ import annotations

from typing import Any

from viasd.tasks.base import TASKS, Example, Task

__all__ = ["Wmt14DeEnTask"]


@TASKS.register("wmt14_deen")
class Wmt14DeEnTask(Task):
    """WMT14 newstest2014 German→English, sacrebleu BLEU and chrF."""

    metric = "bleu"

    key_field = "de"

    def normalize_hub_row(self, row: dict[str, Any]) -> dict[str, Any]:
        tr = row.get("translation") or {}
        return {"src_lang": "de", "tgt_lang": "en", "de": tr.get("de", ""), "en": tr.get("en", "")}

    def offline_row(self, index: int, row: dict[str, Any]) -> dict[str, Any]:
        return {"id": index, **row}

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        return Example(
            id=str(row.get("id", index)),
            prompt=self.format("prompt_template", row),
            reference=str(row["en"]),
            meta={"plain_prompt": self.format("plain_template", row)},
        )
