"""Spec-Bench answer files from finished runs, and Spec-Bench's speed metric over them.

What this module owns: the one translation of a run's ``examples.jsonl`` into Spec-Bench's model
answer jsonl (one line per question: ``question_id``, ``category``, ``answer_id``, ``model_id``,
``tstamp`` and one choice holding ``turns``, ``decoding_steps``, ``new_tokens``, ``wall_time``,
``accept_lengths``), so Spec-Bench's ``evaluation/speed.py`` reads viasd runs; and the same metric
computed here (:func:`speed`): the mean over questions of per-question tokens/s, its ratio to the
baseline file's, and the mean accepted length over all decoding steps.

viasd decodes the first turn of each question (``task=specbench``), so ``turns`` holds one answer.
``accept_lengths`` are the tokens each round emitted (recorded per example since runs carry
``accept_lengths``); for older runs the run's rounds are filled evenly with its tokens and the choice
says ``"accept_lengths_exact": false`` — the mean accepted length is then still exact, the per-step
spread is not. Spec-Bench groups its 13 categories into six: multi-turn conversation (MT-bench's eight),
translation, summarization, QA, math reasoning and RAG (:data:`GROUPS`).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from viasd.errors import ConfigError

#: Spec-Bench's six task groups → the question-file categories in each (MT-bench's eight are one).
GROUPS: dict[str, tuple[str, ...]] = {
    "multi-turn conversation": ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                "humanities"),
    "translation": ("translation",),
    "summarization": ("summarization",),
    "qa": ("qa",),
    "math_reasoning": ("math_reasoning",),
    "rag": ("rag",),
}


def _accept_lengths(rec: dict[str, Any]) -> tuple[list[int], bool]:
    """Tokens emitted per round of one example, and whether they are the recorded ones."""
    new, rounds = int(rec.get("new_tokens") or 0), int(rec.get("rounds") or 0)
    recorded = rec.get("accept_lengths")
    if isinstance(recorded, list) and sum(recorded) == new:
        return [int(a) for a in recorded], True
    if rounds <= 0:
        return ([1] * new, False) if new else ([], False)
    base, extra = divmod(new, rounds)
    return [base + (i < extra) for i in range(rounds)], False


def answers(run_id: str, records: list[dict[str, Any]], categories: dict[str, str] | None, default_category: str,
            model_id: str | None = None) -> list[dict[str, Any]]:
    """Spec-Bench answer lines of a run's example records (``categories``: example id → category).

    Raises one ConfigError line when a record has no timing (``wall_s`` missing or not > 0).
    """
    untimed = [str(r.get("id")) for r in records if not (isinstance(r.get("wall_s"), (int, float)) and r["wall_s"] > 0)]
    if untimed:
        raise ConfigError(f"run {run_id} has no timing for {len(untimed)} of its {len(records)} examples "
                          f"(first: id {untimed[0]}): Spec-Bench files need each example's wall time; export a run "
                          "decoded by `python -m experiments.run` (replays and trace-only runs are not timed)")
    out = []
    for rec in records:
        lengths, exact = _accept_lengths(rec)
        choice = {"index": 0, "turns": [str(rec.get("raw_output") or rec.get("prediction") or "")],
                  "decoding_steps": [int(rec.get("rounds") or len(lengths))], "new_tokens": [int(rec["new_tokens"])],
                  "wall_time": [float(rec["wall_s"])], "accept_lengths": lengths}
        if not exact:
            choice["accept_lengths_exact"] = False
        qid = str(rec["id"])
        out.append({"question_id": int(qid) if qid.isdigit() else qid,
                    "category": (categories or {}).get(qid, default_category), "answer_id": uuid.uuid4().hex[:22],
                    "model_id": model_id or run_id, "choices": [choice], "tstamp": time.time()})
    return out


def write_answers(path: str | Path, lines: Iterable[dict[str, Any]]) -> Path:
    """Write answer lines as jsonl (sorted by question id, as Spec-Bench's reorg step leaves them)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted(lines, key=lambda a: (str(type(a["question_id"])), a["question_id"]))
    path.write_text("".join(json.dumps(a) + "\n" for a in rows), encoding="utf-8")
    return path


def read_answers(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def in_group(answer: dict[str, Any], group: str | None) -> bool:
    """Whether an answer line counts for ``group`` (None or ``overall``: every line)."""
    if group in (None, "overall"):
        return True
    return answer["category"] in GROUPS.get(group, (group,))


def speed(lines: list[dict[str, Any]], base: list[dict[str, Any]] | None = None,
          group: str | None = None) -> dict[str, float]:
    """Spec-Bench's speed metric over answer lines: ``tokens_per_s`` (mean of each question's
    ``Σ new_tokens / Σ wall_time``), ``mean_accepted`` (mean of every step's accept length), and with a
    baseline file ``base_tokens_per_s`` and ``speedup`` (the ratio of the two means). The baseline's
    tokens are its ``new_tokens`` (Spec-Bench re-tokenizes the baseline's text, which counts the same
    tokens when the text round-trips through the tokenizer)."""
    rows = [a for a in lines if in_group(a, group)]
    per = [sum(a["choices"][0]["new_tokens"]) / sum(a["choices"][0]["wall_time"]) for a in rows]
    steps = [x for a in rows for x in a["choices"][0]["accept_lengths"]]
    out = {"n": len(rows), "tokens_per_s": sum(per) / len(per) if per else math.nan,
           "mean_accepted": sum(steps) / len(steps) if steps else math.nan}
    if base is not None:
        b = [a for a in base if in_group(a, group)]
        bper = [sum(a["choices"][0]["new_tokens"]) / sum(a["choices"][0]["wall_time"]) for a in b]
        out["base_tokens_per_s"] = sum(bper) / len(bper) if bper else math.nan
        out["speedup"] = out["tokens_per_s"] / out["base_tokens_per_s"] if bper else math.nan
    return out


def group_rows(lines: list[dict[str, Any]], base: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """:func:`speed` per Spec-Bench group present in ``lines`` (the six of :data:`GROUPS`), then overall."""
    present = {a["category"] for a in lines}
    groups = [g for g, cats in GROUPS.items() if present & set(cats)]
    if present - {c for cats in GROUPS.values() for c in cats}:  # another task's run: its own category
        groups += sorted(present - {c for cats in GROUPS.values() for c in cats})
    return [{"group": g, **speed(lines, base, g)} for g in [*groups, "overall"]]


def find_run(stores, spec: str) -> dict[str, Any]:
    """The finished run ``spec`` names (its id, or a unique prefix of one) in ``stores`` (a RunStores)."""
    found = stores.find(spec)
    if found is not None:
        return found
    hits = sorted({r["run_id"] for r in stores.finished_runs() if r["run_id"].startswith(spec)})
    if len(hits) == 1:
        return stores.find(hits[0])
    if hits:
        raise ConfigError(f"run {spec!r} matches {len(hits)} finished runs ({', '.join(hits[:4])}…); name one")
    raise ConfigError(f"no finished run {spec!r} in {', '.join(str(s.root) for s in stores.stores)} "
                      "(give a run id or a unique prefix of one; `python -m experiments.store check` lists the store)")


def run_categories(config: dict[str, Any]) -> tuple[dict[str, str] | None, str]:
    """Example id → Spec-Bench category for a ``task=specbench`` run (read from the task's question
    file), else ``(None, task name)``: another task's examples all get its name as category."""
    task = config.get("task") or {}
    name = str(task.get("name") or "unknown")
    if (task.get("kind") or name) != "specbench":
        return None, name
    from viasd.tasks import build_task

    return {e.id: str(e.meta["category"]) for e in build_task(task).examples()}, name


def export_run(stores, spec: str, out: str | Path | None = None) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    """Write the Spec-Bench answer file of finished run ``spec`` → ``(path, answer lines, run record)``;
    ``out`` defaults to ``<run id>.jsonl`` in the current folder."""
    run = find_run(stores, spec)
    records = stores.examples(run["run_id"])
    if not records:
        raise ConfigError(f"run {run['run_id']} has no examples to export")
    cats, default = run_categories(run["config"])
    lines = answers(run["run_id"], records, cats, default, model_id=run["run_id"])
    path = write_answers(out or f"{run['run_id']}.jsonl", lines)
    return path, lines, run
