"""Re-scoring finished runs from their stored predictions (no decoding).

A scoring rule that changes (e.g. GSM8K's answer, read whole after its cue since issue 62) changes the
quality of runs already in a store. :func:`rescore_run` recomputes a finished run's per-example scores
from the ``prediction`` and ``reference`` its ``examples.jsonl`` holds, with the task's current
per-example scorer (:data:`RESCORERS`), and, where a score moved, rewrites the run's record so it still
proves itself (``viasd/tracking/proof.py``): the changed lines of ``examples.jsonl`` (only their
``score``; every other byte kept), the summary's ``metric/<name>``, ``examples_sha256`` and
``record_sha256``, the store's ``_proofs.json`` entry of a run older than ``record_sha256``, and a
``rescored`` entry in ``meta.json`` naming the rule and each example whose score moved (old → new).
:func:`rescore_store` does that for every finished run of a task and then recomputes the
``speedup_at_quality`` of each run whose matched ``ar`` run (``ar_run_id``) was re-scored. A run
that does not prove itself before is left alone; one that would not prove itself after is restored; a run
another run hashes as an input (a DIMR search's ``search.calibration_runs``) is left as scored and listed,
since rewriting its ``examples.jsonl`` would change that run's id.
Run ids never change: scoring is not part of a run's identity.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from viasd.tasks.scoring import extract_answer_number, extract_gsm8k_gold, numbers_equal
from viasd.tracking.baseline import speedup_at_quality
from viasd.tracking.proof import LEGACY_PROOFS, inspect, record_sha256, reserved
from viasd.utils.fs import atomic_write_bytes, atomic_write_text

__all__ = ["RESCORERS", "RULES", "rescore_run", "rescore_store"]


def _gsm8k(record: dict[str, Any]) -> dict[str, float]:
    gold = extract_gsm8k_gold(str(record.get("reference", "")))
    return {"accuracy": 100.0 * numbers_equal(extract_answer_number(str(record.get("prediction", ""))), gold)}


#: Per-example scorers by task name: ``record -> {metric: value}`` (the summary's ``metric/<name>`` is their mean).
RESCORERS: dict[str, Callable[[dict[str, Any]], dict[str, float]]] = {"gsm8k": _gsm8k}
#: The rule each scorer applies, recorded in a re-scored run's ``meta.json``.
RULES = {"gsm8k": "viasd.tasks.scoring.extract_answer_number: the answer read whole after its cue "
                  "(a fraction as a fraction, an expression by its value, a clock time no number)"}


def _json(obj: Any) -> str:
    """As the run store writes ``summary.json`` and ``meta.json``."""
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"


def _line(record: dict[str, Any]) -> str:
    """As the run store writes one line of ``examples.jsonl``."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def _write_proof(root: Path, run_id: str, sha: str) -> None:
    path = root / LEGACY_PROOFS
    proofs = json.loads(path.read_text(encoding="utf-8"))
    proofs[run_id] = sha
    atomic_write_text(path, json.dumps(proofs, indent=2, sort_keys=True) + "\n")


def rescore_run(path: str | Path, dry_run: bool = False) -> dict[str, Any] | None:
    """Re-score one finished run (see the module doc); returns ``{"run_id", "metric", "before", "after",
    "changed": {example id: [old, new]}}``, or None when its task has no re-scorer, it is not a
    finished run, or no score moved. ``dry_run``: report without writing."""
    path = Path(path)
    verdict = inspect(path)
    if not verdict.finished or verdict.summary is None:
        return None
    task = ((verdict.config or {}).get("task") or {}).get("name")
    scorer = RESCORERS.get(task)
    if scorer is None:
        return None
    lines = (path / "examples.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    if not records or not all(isinstance(r.get("score"), dict) and "prediction" in r for r in records):
        return None
    changed: dict[str, list[float]] = {}
    new_lines = []
    for line, rec in zip(lines, records, strict=True):
        score = scorer(rec)
        if any(rec["score"].get(k) != v for k, v in score.items()):
            metric = next(iter(score))
            changed[str(rec["id"])] = [rec["score"].get(metric), score[metric]]
            rec = {**rec, "score": {**rec["score"], **score}}
            line = _line(rec)
        new_lines.append(line)
    summary = dict(verdict.summary)
    metric = next(iter(scorer(records[0])))
    key = f"metric/{metric}"
    after = [json.loads(line)["score"][metric] for line in new_lines]
    mean = sum(after) / len(after)
    if not changed and (key not in summary or math.isclose(summary[key], mean, abs_tol=1e-12)):
        return None
    result = {"run_id": path.name, "metric": metric, "before": summary.get(key), "after": mean, "changed": changed}
    if dry_run:
        return result
    backup = {n: (path / n).read_bytes() for n in ("examples.jsonl", "summary.json", "meta.json")
              if (path / n).is_file()}
    proofs_file = path.parent / LEGACY_PROOFS
    legacy = "record_sha256" not in summary
    proofs_before = proofs_file.read_bytes() if legacy and proofs_file.is_file() else None
    data = "".join(new_lines).encode("utf-8")
    summary[key] = mean
    if "examples_sha256" in summary:
        summary["examples_sha256"] = hashlib.sha256(data).hexdigest()
    meta = json.loads(backup["meta.json"]) if "meta.json" in backup else None
    if meta is not None:
        meta["rescored"] = [*meta.get("rescored", []), {"metric": metric, "rule": RULES.get(task, task),
                                                        "before": result["before"], "after": mean,
                                                        "changed": changed}]
    summary = json.loads(_json(summary))
    if not legacy:
        summary["record_sha256"] = record_sha256(summary, meta)
    try:
        atomic_write_bytes(path / "examples.jsonl", data)
        if meta is not None:
            atomic_write_text(path / "meta.json", _json(meta))
        atomic_write_text(path / "summary.json", _json(summary))
        if legacy and proofs_before is not None and path.name in json.loads(proofs_before):
            _write_proof(path.parent, path.name, record_sha256(summary, meta))
        after_verdict = inspect(path)
        if not after_verdict.finished:
            raise RuntimeError(f"{path.name} would not prove itself after re-scoring: {after_verdict.reason}")
    except BaseException:
        for name, content in backup.items():
            (path / name).write_bytes(content)
        if proofs_before is not None:
            proofs_file.write_bytes(proofs_before)
        raise
    return result


def _requalify(path: Path, ar_summaries: dict[str, dict[str, Any]]) -> bool:
    """Recompute ``speedup_at_quality`` of the finished run ``path`` against its re-scored ``ar`` run;
    True when it moved (and was rewritten)."""
    verdict = inspect(path)
    if not verdict.finished or verdict.summary is None:
        return False
    summary = dict(verdict.summary)
    ar = ar_summaries.get(summary.get("ar_run_id") or "")
    if ar is None or "speedup_at_quality" not in summary or summary.get("method") == "ar":
        return False
    delta = float(((verdict.config or {}).get("tracking") or {}).get("quality_delta", 1.0))
    value = speedup_at_quality(summary, ar, delta)
    old = summary["speedup_at_quality"]
    if (old is None and math.isnan(value)) or (old is not None and math.isclose(old, value, abs_tol=1e-12)):
        return False
    summary["speedup_at_quality"] = None if math.isnan(value) else value
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8")) if (path / "meta.json").is_file() else None
    legacy = "record_sha256" not in summary
    summary = json.loads(_json(summary))
    if not legacy:
        summary["record_sha256"] = record_sha256(summary, meta)
    atomic_write_text(path / "summary.json", _json(summary))
    if legacy and path.name in json.loads((path.parent / LEGACY_PROOFS).read_text(encoding="utf-8")
                                          if (path.parent / LEGACY_PROOFS).is_file() else "{}"):
        _write_proof(path.parent, path.name, record_sha256(summary, meta))
    return True


def _run_ids_in(inputs: Any, names: set[str]) -> set[str]:
    """The run folders of ``names`` an ``inputs`` mapping of a run's config names (at any depth)."""
    if not isinstance(inputs, dict):
        return set()
    return {k for k in inputs if k in names} | {r for v in inputs.values() for r in _run_ids_in(v, names)}


def inputs_of_other_runs(root: Path, names: set[str]) -> dict[str, list[str]]:
    """``{run id: the runs whose identity hashes its files}`` for the runs of ``names`` that another run of the
    store read as an input (``search.calibration_runs``: a DIMR search hashes its calibration runs'
    ``examples.jsonl``), so rewriting them would change those runs' ids."""
    users: dict[str, list[str]] = {}
    for cfg_file in sorted(root.glob("*/config.yaml")):
        try:
            cfg = yaml.safe_load(cfg_file.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            continue
        for rid in _run_ids_in(cfg.get("inputs") if isinstance(cfg, dict) else None, names):
            users.setdefault(rid, []).append(cfg_file.parent.name)
    return users


def rescore_store(root: str | Path, tasks: list[str] | None = None, dry_run: bool = False
                  ) -> tuple[list[dict[str, Any]], list[str], dict[str, list[str]]]:
    """Re-score every finished run of ``tasks`` (default: every task with a re-scorer) in the store
    ``root``; returns the re-scored runs (:func:`rescore_run`), the runs whose ``speedup_at_quality``
    moved with their re-scored ``ar`` run, and the runs left as they were because other runs hash their
    files (:func:`inputs_of_other_runs`; would-be re-scored ones only), with those runs."""
    root = Path(root)
    tasks = tasks or sorted(RESCORERS)
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not reserved(p.name))
    candidates = [p for p in folders if p.name.split("__")[2:3] and p.name.split("__")[2] in tasks]
    users = inputs_of_other_runs(root, {p.name for p in candidates})
    done, kept = [], {}
    for p in candidates:
        if p.name in users:
            if rescore_run(p, dry_run=True) is not None:
                kept[p.name] = users[p.name]
            continue
        res = rescore_run(p, dry_run=dry_run)
        if res is not None:
            done.append(res)
    ars = {r["run_id"]: json.loads((root / r["run_id"] / "summary.json").read_text()) for r in done
           if "__ar__" in r["run_id"]}
    if dry_run or not ars:
        return done, [], kept
    moved = [p.name for p in folders if _requalify(p, ars)]
    return done, moved, kept

