"""Whether a replayed frontier is priced by the cost file it names (``python -m experiments.report --check``).

A frontier is the output of ``python -m experiments.replay … report=DIR/NAME`` (``NAME.md`` titled
"Replayed frontier", its ``NAME.sources.json`` with a ``"replay"`` entry: the traced run, the replay
command and the cost file's record — repository-relative ``path``, ``sha256`` of its bytes, the
``pair`` entry read; :meth:`~viasd.analysis.cost.CostModel.record`). Its predicted speedups are only
as good as that file, so :func:`frontier_problem` calls it stale when it names no cost file (every
frontier written before the record existed), when the file lies outside the repository (a fresh clone
cannot read it), is missing, or hashes differently now, or when the rows of its ``NAME.rows.json``
(``out=``) were priced by another file than its table. The fix is the replay command that re-prices it
(``docs/replay.md`` §9). :func:`compared_problem` does the same for a compared table's predicted
speedups (the cost files its sources record under ``costs``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from viasd.paths import COST_DIR, PROJECT_ROOT
from viasd.tracking.ids import file_sha256

TITLE = "# Replayed frontier"  # the first line of write_frontier's table (viasd.report.replayed)
COSTS = Path("results") / "runs" / COST_DIR  # the committed cost files, relative to the repository


def is_frontier(path: Path, src: dict[str, Any]) -> bool:
    """Whether the output ``path`` (folder/name) is a replayed frontier: its sources say so, or (written
    before they did) its Markdown table carries the frontier's title."""
    md = path.parent / f"{path.name}.md"
    return "replay" in src or (md.is_file() and md.read_text(errors="replace").startswith(TITLE))


def frontier_problem(path: Path, src: dict[str, Any], repo: Path = PROJECT_ROOT) -> tuple[str, str] | None:
    """``(reason, fix)`` when the frontier ``path`` (folder/name, sources ``src``) is not priced by the cost
    file it names as that file is now (see the module docstring); None when it is."""
    replayed = src.get("replay") or {}
    cost = replayed.get("cost") or {}
    run = replayed.get("run") or next(iter(src.get("runs") or []), "<run id>")
    pair = cost.get("pair") or run.split("__")[0]
    command = replayed.get("command") or _legacy_command(path, run, repo)
    if not cost.get("path") or not cost.get("sha256"):
        why = "" if "replay" in src else " (written before frontiers recorded theirs)"
        return f"names no cost file that priced its predicted speedups{why}", _fix(command, pair, repo)
    problem = cost_file_problem(cost, repo)
    if problem is not None:
        reason, kind = problem
        if kind == "outside":
            return reason, _fix(command, pair, repo, f"copy it under {COSTS}/, then ")
        return reason, (_fix(command, pair, repo) if kind == "missing" else f"re-price it: {command}")
    rows = path.parent / f"{path.name}.rows.json"
    if rows.is_file():
        other = [r.get("method") for r in json.loads(rows.read_text()) if r.get("cost_sha256") != cost["sha256"]]
        if other:
            return (f"{len(other)} rows of {rows.name} were priced by another cost file than its table "
                    f"(first: {other[0]})", f"re-price it: {command}")
    return None


def compared_problem(path: Path, src: dict[str, Any], repo: Path = PROJECT_ROOT) -> tuple[str, str] | None:
    """``(reason, fix)`` when a compared table ``path`` (``experiments.compare``'s, a verdict table) has
    predicted speedups not priced by the cost files its sources record (``costs``: run id →
    :meth:`~viasd.analysis.cost.CostModel.record`) as those files are now, or has a predicted column but
    records none (written before compared tables recorded them); None otherwise."""
    redo = (f"regenerate it (python -m experiments.compare --ar … --out {path.parent} --name {path.name}, or the "
            "exp report that wrote it) with the committed cost file")
    if "costs" not in src:
        md = path.parent / f"{path.name}.md"
        if md.is_file() and "| predicted speedup" in md.read_text(errors="replace"):
            return ("names no cost file that priced its predicted speedups (written before compared tables "
                    "recorded theirs)", redo)
        return None
    for rid, cost in (src.get("costs") or {}).items():
        problem = cost_file_problem(cost, repo) if cost else None
        if problem is not None:
            return f"{rid}: {problem[0]}", redo
    frontier = src.get("frontier")  # a live check (viasd.report.live_check): the frontier rows it quotes
    if frontier:
        rows = repo / frontier["rows"]
        again = (f"rerun its live check (python -m experiments.live_check {str(frontier['rows']).removesuffix('.rows.json')} "
                 f"{' '.join(k.removeprefix('p') for k in frontier.get('points') or {}) or '<rows>'} --out {path})")
        if not rows.is_file():
            return f"the frontier rows it quotes, {frontier['rows']}, are missing", again
        if file_sha256(rows) != frontier["sha256"]:
            return f"the frontier rows it quotes, {frontier['rows']}, changed since", again
    return None


def cost_file_problem(cost: dict[str, Any], repo: Path = PROJECT_ROOT) -> tuple[str, str] | None:
    """``(reason, kind)`` when the cost file a record names (:meth:`~viasd.analysis.cost.CostModel.record`:
    ``path``, ``sha256``) is not what priced it now, ``kind`` one of ``outside`` (not in ``repo``: a fresh
    clone cannot check it), ``missing``, ``changed`` (other bytes); None when it still is. Shared by the
    frontiers and the compared tables (:func:`compared_problem`)."""
    file = Path(cost["path"]) if Path(cost["path"]).is_absolute() else repo / cost["path"]
    if not file.resolve().is_relative_to(Path(repo).resolve()):
        return f"priced by {cost['path']}, outside the repository (a fresh clone cannot check it)", "outside"
    if not file.is_file():
        return f"its cost file {cost['path']} is missing", "missing"
    now = file_sha256(file)
    if now != cost["sha256"]:
        return (f"its cost file {cost['path']} changed since it priced it (sha256 {cost['sha256'][:12]}… recorded, "
                f"{now[:12]}… now)", "changed")
    return None


def _legacy_command(path: Path, run: str, repo: Path) -> str:
    """The replay command of a frontier written before it recorded one (its grid file is not known)."""
    try:
        where = path.resolve().relative_to(Path(repo).resolve())
    except ValueError:
        where = path
    rows = path.parent / f"{path.name}.rows.json"
    return (f"python -m experiments.replay run={run} grid=conf/replay/<its grid>.yaml "
            + (f"out={where}.rows.json " if rows.is_file() else "") + f"report={where} scale={path.parent.name}")


def _fix(command: str, pair: str, repo: Path, first: str = "") -> str:
    """Re-price with the committed cost file of ``pair`` (its ``cost=`` in ``command``), else measure one first."""
    files = sorted((Path(repo) / COSTS).glob(f"{pair}__*.json"))
    if not files:
        return (f"{first}measure the pair's cost file (`python -m experiments.bench --cost-curve pair={pair}`), commit "
                f"it under {COSTS}/ and re-price: {command}")
    command = re.sub(r" cost(_pair)?=('[^']*'|\S+)", "", command)
    return f"{first}re-price it: " + re.sub(r"(run=\S+)", rf"\1 cost={COSTS / files[0].name}", command, count=1)
