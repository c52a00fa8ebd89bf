"""A run folder proves itself: the checks that make a folder of the run store a finished run.

A folder ``<store>/<name>/`` is a **finished run** only when all of these hold:

1. ``config.yaml`` is a mapping whose run id (:func:`~viasd.tracking.ids.run_ids_of`) is
   ``<name>`` — a folder copied under another name, or whose config was edited by hand, is not;
2. ``summary.json`` is a JSON object whose ``run_id`` (when it has one) is ``<name>``;
3. ``examples.jsonl`` holds only complete JSON records, exactly as many as the summary's
   ``examples_lines`` and (a decoding run) ``n_examples``, and its bytes hash to the summary's
   ``examples_sha256``;
4. the summary's ``new_tokens`` and ``tokens_per_s`` are those of its records (new tokens summed,
   over decode seconds summed): a summary edited by hand is not the run's;
5. ``meta.json`` (when present) is a JSON object, and the summary's ``record_sha256`` is
   :func:`record_sha256` of the summary's other fields and of ``meta.json``: every number of the
   summary (rejection rate, quality metrics, speedups, counts, timings…) and every field of the
   meta (runtime, threads, cpu, which the report prices a run by) is the one written at finish.

Summaries written before ``record_sha256`` existed (every run up to this rule) are held to 1–4 and
to the shape of 5 (a readable ``meta.json``); where their store lists them in
``<store>/_proofs.json`` (:data:`LEGACY_PROOFS`: ``{run id: record_sha256}``, the results store
committed in the repository lists each of its runs) their summary and meta are held to that
checksum too; every run's counters (:data:`SUMMED`), ``rejection_rate`` and ``mean_accepted`` are
also recomputed from its examples. Summaries written before ``examples_lines``/``examples_sha256`` existed are held to
3 without the checksum (their line count and complete records), so every run made by earlier code
stays valid without an upgrade step.

A folder without ``summary.json`` whose ``config.yaml`` names it is **unfinished** (an
interrupted attempt: the same command resumes after its complete records, keeping only the prefix
whose **checksum chain** holds: every record written since the chain exists carries
``record_chain`` (:data:`CHAIN_KEY`), the SHA-256 of the previous record's chain — the run id's for
the first — and of the record itself without its chain and its ``score``
(:func:`chain_of`); :func:`chained_prefix` is how many records keep it, so a record edited, moved
or copied in from another run is decoded again, never sealed); one without any of
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

from viasd.errors import ConfigError
from viasd.tracking.ids import config_hash, run_ids_of
from viasd.tracking.lock import is_lock_file

FINISHED, UNFINISHED, INVALID, EMPTY = "finished", "unfinished", "invalid", "empty"

#: Folders of a run store that hold no run (W&B's offline runs, bench outputs).
RESERVED = ("wandb", "bench", "cost_curve")

#: The files of a run's record (what ``publish`` copies; the lock files are not part of it).
RECORD_FILES = ("config.yaml", "meta.json", "examples.jsonl", "summary.json")


#: The file of a store listing the ``record_sha256`` of runs finished before the summary held it.
LEGACY_PROOFS = "_proofs.json"


def record_sha256(summary: dict[str, Any], meta: dict[str, Any] | None) -> str:
    """Hex SHA-256 of the canonical JSON (sorted keys, no spaces) of ``{"summary": summary without
    its record_sha256, "meta": meta}``: the checksum a finished run's summary carries."""
    body = {"summary": {k: v for k, v in summary.items() if k != "record_sha256"}, "meta": meta}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


#: The field of an example record holding its link of the run's checksum chain.
CHAIN_KEY = "record_chain"


def chain_of(prev: str, record: dict[str, Any]) -> str:
    """Hex SHA-256 of ``prev`` (the previous record's chain; the run id for the first record) and the
    canonical JSON of ``record`` without :data:`CHAIN_KEY` and ``score`` (scores are merged in at
    finish and recomputed by every finish): the record's link of the chain."""
    body = {k: v for k, v in record.items() if k not in (CHAIN_KEY, "score")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(f"{prev}\n{text}".encode()).hexdigest()


def chained_prefix(run_id: str, records: list[dict[str, Any]]) -> tuple[int, str]:
    """How many leading ``records`` of run ``run_id`` hold the checksum chain, and why the next one
    does not ("" when all do)."""
    prev = run_id
    for i, rec in enumerate(records):
        link = rec.get(CHAIN_KEY)
        if link is None:
            return i, f"record {i + 1} carries no {CHAIN_KEY} (written before the chain existed)"
        if link != chain_of(prev, rec):
            return i, f"record {i + 1} is not the one written (its {CHAIN_KEY} differs: edited, moved or copied in?)"
        prev = link
    return len(records), ""


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
    try:
        ids = run_ids_of(cfg)
    except ConfigError as e:
        return cfg, f"config.yaml names no run folder ({e})"
    if path.name not in ids:
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


#: Summary counters that are the sums of the same field over the examples (checked where every
#: record has the field): what a run without ``record_sha256`` is recomputed by.
SUMMED = ("accepted", "bonus", "corrected", "drafted", "rejected", "rounds", "target_calls", "target_tokens",
          "draft_calls", "draft_tokens")


def _recomputed_problem(summary: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """Why the summary's counters, rejection rate and mean accepted are not those of its examples
    ("" when they are, or cannot be recomputed): the proof of the numbers of a run without a checksum."""
    sums = {}
    for key in SUMMED:
        vals = [r.get(key) for r in records]
        if records and all(_number(v) for v in vals) and _number(summary.get(key)):
            sums[key] = sum(vals)
            if not math.isclose(summary[key], sums[key], rel_tol=1e-9):
                return f"summary {key} {summary[key]} is not its examples' {sums[key]} (edited by hand?)"
    derived = {"rejection_rate": ("rejected", "drafted"), "mean_accepted": ("new_tokens", "rounds")}
    for key, (num, den) in derived.items():
        n = sums.get(num, summary.get(num) if num == "new_tokens" else None)
        if _number(summary.get(key)) and _number(n) and sums.get(den):
            if not math.isclose(summary[key], n / sums[den], rel_tol=1e-6):
                return f"summary {key} {summary[key]:.6g} is not its examples' {n / sums[den]:.6g} (edited by hand?)"
    return ""


def _meta(path: Path) -> tuple[dict[str, Any] | None, str]:
    """``meta.json`` of a run folder (None: absent) and why it does not read ("" when it does)."""
    p = path / "meta.json"
    if not p.is_file():
        return None, ""
    try:
        meta = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return None, f"meta.json does not read ({type(e).__name__}: truncated or edited by hand?)"
    return (meta, "") if isinstance(meta, dict) else (None, "meta.json is not a JSON object")


_LEGACY: dict[Path, tuple[tuple, dict[str, str]]] = {}


def legacy_proofs(root: Path) -> dict[str, str]:
    """``{run id: record_sha256}`` of the store ``root``'s :data:`LEGACY_PROOFS` file ({}: none)."""
    p = root / LEGACY_PROOFS
    try:
        st = p.stat()
    except OSError:
        return {}
    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
    if root not in _LEGACY or _LEGACY[root][0] != sig:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        _LEGACY[root] = (sig, data if isinstance(data, dict) else {})
    return _LEGACY[root][1]


def _checksum_problem(path: Path, summary: dict[str, Any], meta: dict[str, Any] | None) -> str:
    """Why the summary and meta are not the ones written at finish ("" when they are, or when the
    run predates the checksum and its store does not list it)."""
    want = summary.get("record_sha256") or legacy_proofs(path.parent).get(path.name)
    if want is None or want == record_sha256(summary, meta):
        return ""
    return ("summary.json or meta.json is not the one written when the run finished "
            "(record_sha256 differs: edited by hand?)")


def _check(path: Path) -> Verdict:
    if all(is_lock_file(p.name) for p in path.iterdir()):
        return Verdict(path, EMPTY, "no run files (a run that stopped before writing any, or one starting now)")
    cfg, problem = _config(path)
    if problem:
        return Verdict(path, INVALID, problem, config=cfg)
    s = path / "summary.json"
    summary = None
    if not s.is_file():
        _, problem = _meta(path)
        if problem:
            return Verdict(path, INVALID, problem, config=cfg)
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
    meta, problem = _meta(path)
    problem = problem or _summary_problem(path.name, summary, data, records, bad_line) or \
        _recomputed_problem(summary, records) or _checksum_problem(path, summary, meta)
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
    try:  # the store's legacy checksums hold some of its runs to them
        st = (path.parent / LEGACY_PROOFS).stat()
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
