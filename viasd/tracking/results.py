"""The stores committed in the repository. ``results/runs/``: :func:`publish` copies finished runs
into it — the only writer; a normal run never writes there. It is read beside the local store by
:class:`~viasd.tracking.store.RunStores`, under the same validity rules.

``results/unfinished/``: :func:`stash` copies the complete examples of runs still decoding (or
interrupted) into it, and :func:`restore` copies them back into a local store, where the same
command resumes each after its last stashed example — so a decode spread over several machines (a
local store dies with its machine) loses at most what was decoded since the last stash. Reports
never read it; :func:`publish` removes a run's stash once the finished run is published."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from viasd.errors import ConfigError
from viasd.paths import COST_DIR as COST
from viasd.tracking.ids import run_id_problem
from viasd.tracking.proof import (
    FINISHED,
    LEGACY_PROOFS,
    RECORD_FILES,
    UNFINISHED,
    inspect,
    legacy_proofs,
    record_sha256,
    reserved,
)
from viasd.tracking.store import RunStore, RunStores, as_stores, find_run
from viasd.utils.fs import atomic_write_json

#: The record files of an unfinished run (it has no summary yet).
PARTIAL_FILES = ("config.yaml", "meta.json", "examples.jsonl")

#: A stash's proof: ``{"run_id", "sha256": {file: hex SHA-256 of its bytes}}`` of its partial files.
STASH_PROOF = "stash.json"


def stash_proof(run_id: str, files: dict[str, bytes]) -> bytes:
    """The bytes of a stash's :data:`STASH_PROOF` for its partial ``files``."""
    sums = {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())}
    return (json.dumps({"run_id": run_id, "sha256": sums}, indent=2, sort_keys=True) + "\n").encode()


def stash_problem(path: Path) -> str:
    """Why the stash folder ``path`` is not the files :func:`stash` wrote ("" when it is): its
    :data:`STASH_PROOF` must read and name the folder, and every partial file hash to it."""
    try:
        proof = json.loads((path / STASH_PROOF).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {STASH_PROOF} (not written by `experiments.store stash`; stash it again from its machine)"
    except (OSError, ValueError) as e:
        return f"{STASH_PROOF} does not read ({type(e).__name__})"
    if not isinstance(proof, dict) or proof.get("run_id") != path.name or not isinstance(proof.get("sha256"), dict):
        return f"{STASH_PROOF} is not the proof of stash {path.name}"
    for name in PARTIAL_FILES:
        p = path / name
        got = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
        if got != proof["sha256"].get(name):
            return f"{name} is not the file that was stashed (checksum differs: edited by hand?)"
    return ""


def publish(run_ids: list[str], source: RunStore | RunStores, dest: str | Path,
            stash_dir: str | Path | None = None) -> list[tuple[str, str]]:
    """Copy finished valid runs (their record files only: no locks, W&B or traces) into the results
    store ``dest``; returns ``(run_id, what happened)``. A run already there with the same files is
    left as it is; one that differs is a :class:`ConfigError` (remove it first to replace it). A run
    finished before ``record_sha256`` existed gets its checksum listed in ``dest/_proofs.json``.
    ``stash_dir``: a run's stash there (:func:`stash`) is removed once the run is in ``dest``."""
    dest = Path(dest)
    out = []
    for run_id in run_ids:
        found, what = _publish_one(run_id, source, dest)
        out += [(run_id, what), *_publish_cost(run_id, found, dest)]
        if stash_dir is not None and (Path(stash_dir) / run_id).is_dir():
            shutil.rmtree(Path(stash_dir) / run_id)
            out.append((run_id, f"its stash removed from {stash_dir}"))
    return out


def _publish_cost(run_id: str, found: dict, dest: Path) -> list[tuple[str, str]]:
    """Copy the cost files of the run's pair (``<store>/_cost/<pair>__*.json``, what its predicted
    speedups are priced with) into ``dest/_cost/`` when absent there; a committed one is kept."""
    pair = (found.get("summary") or {}).get("pair") or run_id.split("__")[0]
    out = []
    for f in sorted((Path(found["root"]) / COST).glob(f"{pair}__*.json")):
        target = dest / COST / f.name
        if target.is_file():
            if target.read_bytes() != f.read_bytes():
                out.append((run_id, f"kept the committed cost file {target} (the local one differs)"))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
        out.append((run_id, f"its pair's cost file published to {target}"))
    return out


def _publish_one(run_id: str, source: RunStore | RunStores, dest: Path) -> tuple[dict, str]:
    """Copy one finished run into ``dest``: ``(its find_run record, what happened)``."""
    found = find_run(run_id, source)
    if found is None:
        v = as_stores(source).verdict(run_id)
        why = f"it is {v.state}: {v.reason}" if v is not None else "no such folder"
        raise ConfigError(f"cannot publish {run_id}: not a finished valid run ({why})")
    target = dest / run_id
    files = {f: (found["path"] / f).read_bytes() for f in RECORD_FILES if (found["path"] / f).is_file()}
    if target.exists():
        if not all((target / f).is_file() and (target / f).read_bytes() == data for f, data in files.items()):
            raise ConfigError(f"{target} exists with other contents; remove it first to replace it")
        return found, f"already in {dest}"
    _write_folder(target, files)
    if "record_sha256" not in found["summary"]:  # a run older than the checksum: listed beside it
        meta = json.loads(files["meta.json"]) if "meta.json" in files else None
        summary = json.loads(files["summary.json"])
        atomic_write_json(dest / LEGACY_PROOFS, {**legacy_proofs(dest), run_id: record_sha256(summary, meta)})
    if inspect(target).state != FINISHED:
        raise ConfigError(f"{target} does not prove itself after copying: {inspect(target).reason}")
    return found, f"published to {target}"


def _snapshot(src: Path, records: int) -> dict[str, bytes]:
    """The partial record files of ``src`` with ``examples.jsonl`` cut after its first ``records``
    lines (a line being appended now is left out)."""
    files = {f: (src / f).read_bytes() for f in PARTIAL_FILES if (src / f).is_file()}
    lines = files.get("examples.jsonl", b"").splitlines(keepends=True)
    files["examples.jsonl"] = b"".join(lines[:records])
    return files


def _write_folder(target: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` as the folder ``target`` in one rename (an older folder there is replaced)."""
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    old = target.with_name(f".{target.name}.old")
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def stash(run_ids: list[str], source: RunStore, dest: str | Path) -> list[tuple[str, str]]:
    """Copy the complete examples of unfinished runs of ``source`` (also while they are being
    written: the examples complete now) with their config and meta into ``dest/<run_id>/``; returns
    ``(run_id, what happened)``, each stash with its checksums (:data:`STASH_PROOF`). A stash
    holding at least as many examples (and proving itself) is kept. A finished run is
    a :class:`ConfigError` naming ``publish``; an invalid, empty or absent one names its state."""
    dest = Path(dest)
    out = []
    for run_id in run_ids:
        v = source.verdict(run_id)
        if v is None:
            raise ConfigError(f"cannot stash {run_id}: no such folder")
        if v.finished:
            raise ConfigError(f"cannot stash {run_id}: finished: publish it instead")
        if v.state != UNFINISHED:
            raise ConfigError(f"cannot stash {run_id}: {v.state}: {v.reason}")
        if v.records == 0:
            raise ConfigError(f"cannot stash {run_id}: no complete example yet")
        old = inspect(dest / run_id) if (dest / run_id).is_dir() else None
        if old is not None and old.state == UNFINISHED and old.records >= v.records and \
                not stash_problem(dest / run_id):
            out.append((run_id, f"kept: the stash in {dest} has {old.records} examples (here {v.records})"))
            continue
        files = _snapshot(v.path, v.records)
        _write_folder(dest / run_id, {**files, STASH_PROOF: stash_proof(run_id, files)})
        got = inspect(dest / run_id)
        if got.state != UNFINISHED or got.records != v.records or stash_problem(dest / run_id):
            raise ConfigError(f"{dest / run_id} is not the stash it should be: {got.state}, {got.records} examples")
        out.append((run_id, f"stashed {v.records} examples to {dest / run_id}"))
    return out


def restore(src: str | Path, dest: RunStore, run_ids: list[str] | None = None) -> list[tuple[str, str]]:
    """Copy the stashed runs of ``src`` (``run_ids``: only these) into the local store ``dest``
    where it has no run of that id or an unfinished one with fewer examples, not being written;
    the same command then resumes each. Returns ``(run_id, what happened)``. A stash whose files are
    not the ones stashed (:func:`stash_problem`) is a :class:`ConfigError` naming why."""
    src = Path(src)
    names = run_ids if run_ids is not None else sorted(
        d.name for d in src.iterdir() if d.is_dir() and not reserved(d.name)) if src.is_dir() else []
    out = []
    for run_id in names:
        if run_id_problem(run_id):
            raise ConfigError(f"cannot restore {run_id[:80]!r}: the run id {run_id_problem(run_id)}")
        v = inspect(src / run_id) if (src / run_id).is_dir() else None
        if v is None or v.state != UNFINISHED:
            out.append((run_id, f"skipped: not a stashed run ({'no such folder' if v is None else v.reason or v.state})"))
            continue
        problem = stash_problem(v.path)
        if problem:
            raise ConfigError(f"cannot restore {run_id} from {src}: {problem}")
        here = dest.verdict(run_id)
        if here is not None and (here.finished or (here.state == UNFINISHED and here.records >= v.records)):
            what = "finished" if here.finished else f"unfinished with {here.records} examples"
            out.append((run_id, f"kept: {dest.root} has it {what}"))
            continue
        lock = dest.lock(run_id)  # creates the folder
        if not dest.claim(lock, wait=False):
            out.append((run_id, f"skipped: being written by {lock.describe()}"))
            continue
        try:
            for name, data in _snapshot(v.path, v.records).items():
                (dest.path(run_id) / name).write_bytes(data)
            (dest.path(run_id) / "summary.json").unlink(missing_ok=True)
        finally:
            lock.release()
        out.append((run_id, f"restored {v.records} examples to {dest.path(run_id)}"))
    return out
