"""Unscored prompt tasks for speed: Spec-Bench's 480 prompts and free prompts (built in or a file).

This module owns reading a user prompt file (:func:`read_prompt_file`). The configurations
and defaults are ``conf/task/{specbench,prompts}.yaml``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from viasd.errors import ConfigError
from viasd.tasks.base import TASKS, Example, Task
from viasd.tasks.builtin_prompts import BUILTIN_PROMPTS
from viasd.tasks.loading import check_text_file

__all__ = ["SpecBenchTask", "PromptsTask", "read_prompt_file"]


@TASKS.register("specbench")
class SpecBenchTask(Task):
    """Spec-Bench's 480 prompts (first turn), for speed measurements; not scored.

    ``categories`` (e.g. ``[translation, summarization]``) restricts the categories;
    ``reference`` carries the file's reference where it has one (else None).
    """

    key_field = "question_id"
    options = ("categories",)

    def filter_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        cats = self.cfg["categories"]
        if not cats:
            return rows
        cats = [cats] if isinstance(cats, str) else list(cats)
        known = sorted({str(r["category"]) for r in rows})
        bad = [c for c in cats if c not in known]
        if bad:
            raise ConfigError(f"task {self.name!r}: unknown categories {bad}; known: {', '.join(known)}")
        return [r for r in rows if r["category"] in cats]

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        fields = {**row, "prompt": str(row["turns"][0])}
        return Example(
            id=str(row["question_id"]),
            prompt=self.format("prompt_template", fields),
            reference=row.get("reference"),
            meta={"plain_prompt": self.format("plain_template", fields), "category": row["category"]},
        )


@TASKS.register("prompts")
class PromptsTask(Task):
    """Free prompts for smoke runs and speed: the built-in set, or a user file; not scored.

    ``path: null`` uses :data:`viasd.tasks.builtin_prompts.BUILTIN_PROMPTS`. ``path: FILE``
    reads ``.jsonl`` (one ``{"prompt": ...}`` object per line) or ``.txt`` (one prompt per
    line, blank lines skipped); a relative path is taken from the current directory.
    """

    options = ("path",)

    def load_rows(self) -> list[dict[str, Any]]:
        path = self.cfg["path"]
        if path is None:
            return [dict(p) for p in BUILTIN_PROMPTS]
        return read_prompt_file(Path(str(path)))

    def source(self) -> str:
        return "local"

    def make_example(self, index: int, row: dict[str, Any]) -> Example:
        fields = {**row, "prompt": str(row["prompt"])}
        meta = {"plain_prompt": self.format("plain_template", fields)}
        if "kind" in row:
            meta["kind"] = row["kind"]
        return Example(
            id=str(row.get("id", index)),
            prompt=self.format("prompt_template", fields),
            reference=row.get("reference"),
            meta=meta,
        )


def read_prompt_file(path: Path) -> list[dict[str, Any]]:
    """Rows ``{"id", "prompt", ...}`` of a ``.jsonl`` or ``.txt`` prompt file.

    Raises a ConfigError naming the file and the fix for a missing or empty file, a binary or
    undecodable one (with the byte offset, :func:`~viasd.tasks.loading.check_text_file`), a line
    that is not a JSON object with a non-empty string ``"prompt"``, or an unknown suffix.
    """
    fix = 'set task.path to a .jsonl file with one {"prompt": ...} per line or a .txt file with one prompt per line'
    p = path.expanduser().resolve()
    if not p.is_file():
        raise ConfigError(f"prompt file not found: {p}; {fix} (or task.path=null for the built-in prompts)")
    suffix = p.suffix.lower()
    if suffix not in (".jsonl", ".txt"):
        raise ConfigError(f"prompt file {p} has an unsupported suffix {suffix!r}; {fix}")
    check_text_file(p, "prompt file", fix)
    rows: list[dict[str, Any]] = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if suffix == ".txt":
                rows.append({"id": f"line{lineno}", "prompt": line.rstrip("\r\n")})
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{p}:{lineno}: not valid JSON ({e.msg}); {fix}") from None
            if not isinstance(obj, dict) or "prompt" not in obj:
                raise ConfigError(f'{p}:{lineno}: line has no "prompt" field; {fix}')
            if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
                raise ConfigError(f'{p}:{lineno}: "prompt" must be a non-empty string; {fix}')
            rows.append(
                {"id": str(obj.get("id", f"line{lineno}")), **{k: v for k, v in obj.items() if k != "id"}}
            )
    if not rows:
        raise ConfigError(f"prompt file {p} has no prompts; {fix}")
    return rows
