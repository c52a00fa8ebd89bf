"""``python -m experiments.score_code --task humaneval|mbpp --samples FILE.jsonl`` — pass@1 of code samples.

Scores generated code in the project sandbox (:mod:`viasd.tasks.sandbox`), as human-eval's
``evaluate_functional_correctness`` does: ``FILE.jsonl`` has one ``{"task_id", "completion"}``
per line (several lines per task allowed; pass@1 is the mean over tasks of the fraction
passing). ``--samples`` may also be a finished run's folder or its ``examples.jsonl`` (rows
``{"id", "prediction"}``), then the task comes from the run's ``config.yaml`` unless
``--task`` is given. Prints pass@1 (0-100) and writes ``<samples>_results.jsonl``: each row
as read plus ``passed`` (bool), ``status`` and ``result`` (the reason); the printed line names the isolation
level the programs ran at (``root namespaces``, ``rootless namespaces``, ``unsafe``). For HumanEval the
program is ``prompt + completion``; for MBPP the completion alone; the task's tests are the
checks. Bad input prints one line naming the fix and exits with status 2.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from viasd.errors import ConfigError
from viasd.tasks import build_task
from viasd.tasks.base import Task
from viasd.tasks.sandbox import isolation_level, run_programs
from viasd.utils.fs import atomic_write_text

__all__ = ["main", "read_samples", "score_samples"]

CODE_TASKS = ("humaneval", "mbpp")


def read_samples(path: Path) -> tuple[list[dict[str, Any]], Path, dict[str, Any] | None]:
    """(rows, the samples file, the run's task config or None) for a samples file or run folder."""
    run_cfg = None
    if path.is_dir():
        path = path / "examples.jsonl"
    if not path.is_file():
        raise ConfigError(
            f"samples file not found: {path}; pass a .jsonl of {{task_id, completion}} or a run folder"
        )
    cfg_file = path.parent / "config.yaml"
    if path.name == "examples.jsonl" and cfg_file.is_file():
        run_cfg = (yaml.safe_load(cfg_file.read_text()) or {}).get("task")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}:{lineno}: expected a JSON object per line")
            tid, code = row.get("task_id", row.get("id")), row.get("completion", row.get("prediction"))
            if tid is None or not isinstance(code, str):
                raise ConfigError(
                    f'{path}:{lineno}: each row needs "task_id" and a string "completion" '
                    '(or a run\'s "id" and "prediction")'
                )
            rows.append(row)
    if not rows:
        raise ConfigError(f"{path} has no samples")
    return rows, path, run_cfg


def _task(name: str | None, run_cfg: dict[str, Any] | None, problems: str | None) -> Task:
    cfg = dict(run_cfg or {})
    if name:
        if run_cfg and run_cfg.get("name") != name:
            cfg = {}
        cfg["name"] = name
    if cfg.get("name") not in CODE_TASKS and cfg.get("kind") not in CODE_TASKS:
        raise ConfigError(f"--task must be one of {', '.join(CODE_TASKS)} (got {cfg.get('name')!r})")
    cfg["n_examples"] = None  # every problem, matched by id below
    if (cfg.get("kind") or cfg["name"]) == "mbpp":
        cfg["task_id_range"] = None
    if problems:
        cfg["offline_file"] = str(Path(problems).resolve())
        cfg["source"] = "offline"
    return build_task(cfg)


def score_samples(task: Task, rows: list[dict[str, Any]], workers: int | None = None,
                  timeout_s: float | None = None) -> tuple[float, list[dict[str, Any]]]:  # fmt: skip
    """(pass@1 on 0-100, rows with ``passed``/``status``/``result`` added) for ``rows`` of ``task``.

    Refuses (ConfigError) before reading the task's problems when the sandbox is unavailable.
    """
    task.preflight()  # the one-line refusal comes before anything else can fail (e.g. the data cache)
    by_id = {e.id: e for e in task.examples()}
    ids = [str(r.get("task_id", r.get("id"))) for r in rows]
    unknown = sorted(set(ids) - set(by_id))
    if unknown:
        raise ConfigError(
            f"{len(unknown)} task ids are not in {task.name}'s problems (e.g. {unknown[:3]}); "
            "check --task or pass the problem file with --problems"
        )
    examples = [by_id[i] for i in ids]
    codes = [str(r.get("completion", r.get("prediction"))) for r in rows]
    results = run_programs(
        task.metric_predictions(codes, examples),
        task.metric_references(examples),
        timeout_s=timeout_s or task.cfg["timeout_s"],
        memory_mb=task.cfg["memory_mb"],
        workers=workers or task.cfg["workers"],
        unsafe=bool(task.cfg["unsafe_exec"]),
    )
    per_task: dict[str, list[bool]] = collections.defaultdict(list)
    out = []
    for tid, row, res in zip(ids, rows, results, strict=True):
        per_task[tid].append(res.passed)
        out.append({**row, "passed": res.passed, "status": res.status, "result": res.reason})
    pass1 = 100.0 * sum(sum(v) / len(v) for v in per_task.values()) / len(per_task)
    return pass1, out


def main(argv: list[str] | None = None) -> float:
    """Parse ``argv``, score, print pass@1 and write the results file; returns pass@1."""
    ap = argparse.ArgumentParser(prog="python -m experiments.score_code", description=__doc__.split("\n")[0])
    ap.add_argument("--samples", required=True, help="jsonl of {task_id, completion}, or a run folder")
    ap.add_argument("--task", choices=CODE_TASKS, help="default: the run's task")
    ap.add_argument("--problems", help="problem file (default: the task's offline file under VIASD_DATA_DIR)")
    ap.add_argument("--workers", type=int, help="programs run in parallel (default: CPUs, at most 8)")
    ap.add_argument("--timeout", type=float, help="seconds per program (default: the task's timeout_s)")
    args = ap.parse_args(argv)
    try:
        rows, path, run_cfg = read_samples(Path(args.samples))
        if args.task is None and run_cfg is None:
            raise ConfigError("--task humaneval|mbpp is needed for a samples file outside a run folder")
        task = _task(args.task, run_cfg, args.problems)
        pass1, out = score_samples(task, rows, args.workers, args.timeout)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    dest = path.with_name(path.name + "_results.jsonl")
    atomic_write_text(dest, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
    n_pass = sum(r["passed"] for r in out)
    level = isolation_level(bool(task.cfg["unsafe_exec"]))
    print(f"pass@1 = {pass1:.2f} ({task.name}: {n_pass}/{len(out)} samples passed; isolation: {level}); "
          f"results: {dest}")
    return pass1


if __name__ == "__main__":
    main()
