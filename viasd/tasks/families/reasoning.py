"""Math reasoning task: GSM8K with the standard 8-shot chain-of-thought prompt (final-answer accuracy).

The configuration and defaults are ``conf/task/gsm8k.yaml``; the exemplars are in
:mod:`viasd.tasks.fewshot`.
"""

from __future__ import annotations

from typing import Any

from viasd.errors import ConfigError
from viasd.tasks.base import TASKS, Example, Task
from viasd.tasks.fewshot import GSM8K_COT
from viasd.tasks.scoring import extract_gsm8k_gold

__all__ = ["Gsm8kTask"]


@TASKS.register("gsm8k")
class Gsm8kTask(Task):
    """GSM8K test problems with the standard 8-shot chain-of-thought prompt; final-answer accuracy.

    With a chat template the ``n_shot`` demonstrations are earlier user/assistant turns;
    without one they are "Q: … A: …" blocks before the question.
    """

    metric = "gsm8k_accuracy"
    key_field = "question"
    options = ("n_shot",)

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        n = self.cfg["n_shot"]
        if not isinstance(n, int) or not 0 <= n <= len(GSM8K_COT):
            raise ConfigError(
                f"task {self.name!r}: n_shot must be an integer in 0..{len(GSM8K_COT)}, got {n!r}"
            )

    def few_shot(self) -> list[tuple[str, str, str]]:
        return [
            (
                self.format("prompt_template", {"question": q}),
                self.format("plain_template", {"question": q}),
                a,
            )
            for q, a in GSM8K_COT[: self.cfg["n_shot"]]
        ]

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        return Example(
            id=str(index),
            prompt=self.format("prompt_template", row),
            reference=str(row["answer"]),
            meta={
                "plain_prompt": self.format("plain_template", row),
                "gold": extract_gsm8k_gold(str(row["answer"])),
            },
        )
