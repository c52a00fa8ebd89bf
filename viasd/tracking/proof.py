"""A run folder proves itself: the checks that make a folder of the run store a finished run.

A folder ``<store>/<name>/`` is a **finished run** only when all of these hold:

1. ``config.yaml`` is a mapping whose run id (:func:`~viasd.tracking.ids.run_ids_of`) is
   ``<name>`` — a folder copied under another name, or whose config was edited by hand, is not;
2. ``summary.json`` is a JSON object whose ``run_id`` (when it has one) is ``<name>``;
3. ``examples.jsonl`` holds only complete JSON records, exactly as many as the summary's
   ``examples_lines`` and (a decoding run) ``n_examples``, and its bytes hash to the summary's
   ``examples_sha256``;
4. the summary's ``new_tokens`` and ``tokens_per_s`` are those of its records (new tokens summed,
   over decode seconds summed): a summary edited by hand is not the run's.

Summaries written before ``examples_lines``/``examples_sha256`` existed are held to 1, 2, 4 and
to 3 without the checksum (their line count and complete records), so every run made by earlier
code stays valid without an upgrade step.

A folder without ``summary.json`` whose ``config.yaml`` names it is **unfinished** (an
interrupted attempt: the same command resumes after its complete records); one without any of
any file but its lock is **empty** (a run starting now holds only its lock there); anything else is
**invalid**, with the reason. :func:`reserved` names (``wandb``, ``bench``, ``cost_curve``, and
any name starting with ``_`` or ``.``: ``_traces``, ``_cost``, ``_invalid``…) are not run folders.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from viasd.tracking.ids import config_hash, run_ids_of
from viasd.tracking.lock import HOLDER_NAME, LOCK_NAME

FINISHED, UNFINISHED, INVALID, EMPTY = "finished", "unfinished", "invalid", "empty"

#: Folders of a run store that hold no run (W&B's offline runs, bench outputs).
RESERVED = ("wandb", "bench", "cost_curve")

#: The files of a run's record (what ``publish`` copies; the lock files are not part of it).
RECORD_FILES = ("config.yaml", "meta.json", "examples.jsonl", "summary.json")


def reserved(name: str) -> bool:
    """True for a store entry that is not a run folder (see the module doc)."""
    return name in RESERVED or name[:1] in ("_", ".")


@dataclass
class Verdict:
    """What a folder of the store is: ``state`` finished | unfinished | empty | invalid, and why not finished."""

    path: Path
    state: str
    reason: str = ""
    config: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    records: int = 0  # complete records in examples.jsonl (the resumable prefix when unfinished)

    @property
    def finished(self) -> bool:
        return self.state == FINISHED


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def _records(data: bytes) -> tuple[list[dict[str, Any]], int | None]:
    """The complete records of an examples file and the line number of the first incomplete one."""
    out = []
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        try:
            rec = json.loads(line)
        except ValueError:
            return out, n
        if not isinstance(rec, dict):
            return out, n
        out.append(rec)
    return out, None


def _config(path: Path) -> tuple[dict[str, Any] | None, str]:
    p = path / "config.yaml"
    if not p.is_file():
        return None, "no config.yaml"
    try:
        cfg = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as e:
        return None, f"config.yaml does not read ({type(e).__name__})"
    if not isinstance(cfg, dict):
        return None, "config.yaml is not a mapping"
    if path.name not in run_ids_of(cfg):
        if path.name.rsplit("__", 1)[-1] == config_hash(cfg):
            return cfg, "the folder name's pair/method/task are not its config.yaml's (renamed by hand?)"
        return cfg, (f"config.yaml hashes to {config_hash(cfg)}, not to the id in the folder name "
                     "(edited by hand, or copied under another name)")
    return cfg, ""


def _summary_problem(name: str, summary: dict[str, Any], data: bytes, records: list[dict[str, Any]],
                     bad_line: int | None) -> str:
    """Why ``summary`` is not the summary of these examples ("" when it is)."""
    if summary.get("run_id") not in (None, name):
        return f"summary.json names run {summary.get('run_id')}, not this folder"
    if bad_line is not None:
        return f"examples.jsonl line {bad_line} is not a complete record"
    # n_examples counts the examples of a decoding run (one record each); a DIMR search counts its
    # trials there, fewer than its records (baselines, screening), and has no new_tokens.
    for key in ("n_examples", "examples_lines") if "new_tokens" in summary else ("examples_lines",):
        if _number(summary.get(key)) and int(summary[key]) != len(records):
            return f"examples.jsonl holds {len(records)} complete records, the summary says {summary[key]}"
    sha = summary.get("examples_sha256")
    if sha is not None and sha != hashlib.sha256(data).hexdigest():
        return "examples.jsonl is not the file the summary was written for (checksum differs)"
    tokens = [r.get("new_tokens") for r in records]
    if records and all(_number(t) for t in tokens):
        new, wall = sum(tokens), sum(r.get("wall_s") for r in records if _number(r.get("wall_s")))
        if _number(summary.get("new_tokens")) and not math.isclose(summary["new_tokens"], new, rel_tol=1e-9):
            return f"summary new_tokens {summary['new_tokens']} is not its examples' {new}"
        tps = summary.get("tokens_per_s")
        if _number(tps) and wall > 0 and not math.isclose(tps, new / wall, rel_tol=1e-6):
            return f"summary tokens_per_s {tps:.6g} is not its examples' {new / wall:.6g} (edited by hand?)"
    return ""


def _check(path: Path) -> Verdict:
    if all(p.name in (LOCK_NAME, HOLDER_NAME) for p in path.iterdir()):
        return Verdict(path, EMPTY, "no run files (a run that stopped before writing any, or one starting now)")
    cfg, problem = _config(path)
    if problem:
        return Verdict(path, INVALID, problem, config=cfg)
    s = path / "summary.json"
    summary = None
    if s.is_file():  # read before the examples: the writer replaces examples.jsonl before it writes summary.json
        try:
            summary = json.loads(s.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return Verdict(path, INVALID, f"summary.json does not read ({type(e).__name__})", config=cfg)
        if not isinstance(summary, dict):
            return Verdict(path, INVALID, "summary.json is not a JSON object", config=cfg)
    e = path / "examples.jsonl"
    data = e.read_bytes() if e.is_file() else b""
    records, bad_line = _records(data)
    if summary is None:
        return Verdict(path, UNFINISHED, f"no summary.json ({len(records)} complete examples to resume from)",
                       config=cfg, records=len(records))
    problem = _summary_problem(path.name, summary, data, records, bad_line)
    if problem:
        return Verdict(path, INVALID, problem, config=cfg, summary=summary, records=len(records))
    return Verdict(path, FINISHED, config=cfg, summary=summary, records=len(records))


_CACHE: dict[Path, tuple[tuple, Verdict]] = {}


def _signature(path: Path) -> tuple:
    sig = []
    for name in RECORD_FILES:
        try:
            st = (path / name).stat()
            sig.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            sig.append(None)
    return tuple(sig)


def inspect(path: str | Path) -> Verdict:
    """The :class:`Verdict` on one folder (cached while its record files are unchanged); never raises."""
    path = Path(path)
    sig = _signature(path)
    hit = _CACHE.get(path)
    if hit is not None and hit[0] == sig:
        return hit[1]
    try:
        verdict = _check(path)
    except OSError as e:
        verdict = Verdict(path, INVALID, f"unreadable ({e.strerror or type(e).__name__})")
    _CACHE[path] = (sig, verdict)
    return verdict
