"""The run store: one folder per run, written by one process, proving itself to its readers.

Layout of ``<store>/<run_id>/``: ``config.yaml`` (resolved config, with an ``inputs`` node
holding the content hash of every input file the run reads), ``meta.json`` (git sha and
dirty-tree flag, host, versions, start time, data folder), ``examples.jsonl`` (one line per
example, appended and flushed as examples finish), and ``summary.json`` — written last and
atomically, with the line count and SHA-256 of ``examples.jsonl`` (``examples_lines``,
``examples_sha256``). Every file is written with the same mode (0644 under the usual umask).
``run_id`` (:mod:`viasd.tracking.ids`) hashes the resolved config *including the input
hashes*, so re-running an identical config on identical files finds the finished run and skips
it, and editing a prompt/data/mask file makes a new run.

* **One writer.** A run folder is written only by the process holding its lock
  (:mod:`viasd.tracking.lock`, :meth:`RunStore.lock`).
* **Proof.** A folder counts as finished only when it passes :mod:`viasd.tracking.proof`;
  stray, copied, edited and truncated folders are *invalid* (:meth:`RunStore.invalid_runs`):
  never a baseline, never "finished", and they never break the reading of another run.
* **A full disk** is one :class:`StoreFull` line, **a read-only store** one :class:`StoreReadOnly`
  line: every write of a run folder goes through :func:`store_write`, and a run that could not
  write its first files leaves no folder behind.
* **Names stay inside.** A run id that is not a plain name (:func:`~viasd.tracking.ids.run_id_problem`)
  is never written (:meth:`RunStore.writable`), and no path of the store leaves its root.
* **Two roots.** :class:`RunStores` reads several stores as one, first root first: the user's
  (``VIASD_RUNS_DIR``, default ``./runs``) and the read-only results store committed in the
  repository (``results/runs/``, :func:`viasd.paths.results_dir`), which only
  :func:`viasd.tracking.results.publish` writes. :func:`find_run` and :func:`valid_runs` are
  what the readers call.

The writer of one open run folder, :class:`~viasd.tracking.run_folder.Run`, lives in
:mod:`viasd.tracking.run_folder`.
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from viasd.errors import ConfigError
from viasd.paths import results_dir, runs_dir
from viasd.tracking.ids import (  # noqa: F401  (re-exported: the store's names for run ids)
    RENAMED_METHODS,
    VOLATILE_KEYS,
    config_hash,
    file_sha256,
    method_label,
    run_id_for,
    run_id_problem,
)
from viasd.tracking.lock import RunLock, is_lock_file
from viasd.tracking.proof import (
    CHAIN_KEY,
    INVALID,
    RECORD_FILES,
    UNFINISHED,
    Verdict,
    chained_prefix,
    inspect,
    reserved,
)
from viasd.tracking.run_folder import Run, store_write  # noqa: F401  (re-exported: the store's writer)
from viasd.tracking.store_errors import (  # noqa: F401  (re-exported: the store's errors)
    FULL_DISK,
    READ_ONLY,
    StoreFull,
    StoreReadOnly,
    full_disk_error,
    store_error,
)
from viasd.utils.fs import atomic_write_text


def _record(v: Verdict, root: Path) -> dict[str, Any]:
    summary = dict(v.summary or {})
    if summary.get("method") in RENAMED_METHODS:
        summary["method"] = RENAMED_METHODS[summary["method"]]
    return {"run_id": v.path.name, "path": v.path, "config": copy.deepcopy(v.config), "summary": summary,
            "root": root}


def odd_folder(path: Path) -> Verdict | None:
    """The invalid :class:`Verdict` on an entry of a store that cannot be a run folder (None when it
    can): a symbolic link (a run folder is a directory of its store, never a link out of it) or a
    name that is not a plain run id (:func:`~viasd.tracking.ids.run_id_problem`)."""
    if path.is_symlink():
        try:
            target = str(path.resolve())
        except OSError:
            target = "?"
        return Verdict(path, INVALID, f"a symbolic link (to {target}), not a run folder of this store")
    problem = run_id_problem(path.name)
    if problem:
        return Verdict(path, INVALID, f"the folder name {problem}; no run writes here")
    return None


class RunStore:
    """A folder of runs keyed by ``run_id``."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def path(self, run_id: str) -> Path:
        """The folder of ``run_id``: always a direct child of the store (a name reaching outside it —
        ``..``, ``/``, an absolute path, NUL — is one :class:`ConfigError` line)."""
        path = self.root / run_id
        if "\0" in run_id or path.resolve().parent != self.root:
            raise ConfigError(f"run id {run_id[:80]!r} leaves the store; name a folder of the run store {self.root}")
        return path

    def writable(self, run_id: str) -> Path:
        """:meth:`path` of a run folder about to be written: ``run_id`` must be a plain run id
        (:func:`~viasd.tracking.ids.run_id_problem`), else one :class:`ConfigError` line."""
        problem = run_id_problem(run_id)
        if problem:
            raise ConfigError(f"run id {run_id[:80]!r} {problem}; name a folder of the run store {self.root}")
        return self.path(run_id)

    def lock(self, run_id: str) -> RunLock:
        return RunLock(self.writable(run_id))

    def claim(self, lock: RunLock, wait: bool) -> bool:
        """Take ``lock`` (waiting when ``wait``); a full disk is :class:`StoreFull`, a read-only store
        :class:`StoreReadOnly`."""
        try:
            if wait:
                lock.acquire()
                return True
            return lock.try_acquire()
        except OSError as e:
            err = store_error(e, lock.dir, self.root)
            if err is not None:
                raise err from None
            raise

    def verdict(self, run_id: str) -> Verdict | None:
        """What the folder of ``run_id`` is (None: no such folder)."""
        p = self.path(run_id)
        return inspect(p) if p.is_dir() else None

    def is_finished(self, run_id: str) -> bool:
        """True when ``run_id`` is a finished run that proves itself (:mod:`viasd.tracking.proof`)."""
        v = self.verdict(run_id)
        return v is not None and v.finished

    def find(self, run_id: str) -> dict[str, Any] | None:
        """``{"run_id", "path", "config", "summary", "root"}`` of a finished valid run, else None."""
        v = self.verdict(run_id)
        return _record(v, self.root) if v is not None and v.finished else None

    def folders(self, label: str | None = None) -> list[Verdict]:
        """The verdict on every run folder (reserved names left out), by name; ``label``: only the
        folders whose name carries that method label (``ar``: the candidate baselines). A folder no
        run can be written to — a name that is not a plain run id (``my copy``, ``-rf``) or a
        symbolic link (e.g. out of the store) — is listed as invalid (:func:`odd_folder`), not read."""
        if not self.root.is_dir():
            return []
        return [odd_folder(d) or inspect(d) for d in sorted(self.root.iterdir()) if d.is_dir() and not reserved(d.name)
                and (label is None or d.name.split("__")[1:2] == [label])]

    def finished_runs(self, label: str | None = None) -> Iterator[dict[str, Any]]:
        """Every finished valid run (see :meth:`find`), by run id (``label``: see :meth:`folders`)."""
        for v in self.folders(label):
            if v.finished:
                yield _record(v, self.root)

    def invalid_runs(self) -> list[Verdict]:
        """The folders that are neither finished runs nor unfinished attempts, with their reasons."""
        return [v for v in self.folders() if v.state == INVALID]

    def partial_examples(self, run_id: str) -> list[dict[str, Any]]:
        """Example records an unfinished (crashed or interrupted) run of ``run_id`` left behind that
        prove themselves (:meth:`resumable`); [] for a finished, invalid or absent run."""
        return self.resumable(run_id)[0]

    def resumable(self, run_id: str) -> tuple[list[dict[str, Any]], str]:
        """The records of an unfinished run of ``run_id`` a resume may keep — up to the first
        incomplete line, and only the prefix whose checksum chain holds
        (:func:`~viasd.tracking.proof.chained_prefix`), without their chain links, as they were logged
        (:class:`Run` links them again) — and why the rest are not kept ("" when none are left out);
        ``([], "")`` for a finished, invalid or absent run."""
        v = self.verdict(run_id)
        if v is None or v.state != UNFINISHED:
            return [], ""
        records = self.examples(run_id)[: v.records]
        n, why = chained_prefix(run_id, records)
        return [{k: x for k, x in r.items() if k != CHAIN_KEY} for r in records[:n]], why  # as they were logged

    def examples(self, run_id: str) -> list[dict[str, Any]]:
        """The complete records of ``examples.jsonl`` (up to the first incomplete line)."""
        out = []
        p = self.path(run_id) / "examples.jsonl"
        for line in p.read_text(encoding="utf-8").splitlines() if p.is_file() else []:
            try:
                out.append(json.loads(line))
            except ValueError:
                break
        return out

    def open(self, run_id: str, cfg: dict[str, Any], meta: dict[str, Any] | None = None,
             resume: list[dict[str, Any]] | None = None) -> Run:
        """Open the folder of ``run_id`` for writing (its lock held); a full disk while writing its
        first files removes them again (no empty run folder) and raises :class:`StoreFull`."""
        path = self.writable(run_id)
        fresh = not any((path / f).exists() for f in RECORD_FILES)
        try:
            return Run(path, cfg, meta, resume, self.root)
        except StoreFull:
            if fresh:
                for f in RECORD_FILES:
                    (path / f).unlink(missing_ok=True)
            raise

    def discard(self, run_id: str) -> None:
        """Remove the run files of ``run_id`` (its lock held): for a run that stopped before its first
        example (a full disk), so no folder without a single example is left behind."""
        for f in RECORD_FILES:
            (self.path(run_id) / f).unlink(missing_ok=True)

    def drop_if_empty(self, run_id: str) -> None:
        """Remove the folder of ``run_id`` if it holds nothing but lock files (call with the lock released)."""
        path = self.path(run_id)
        if path.is_dir() and all(is_lock_file(p.name) for p in path.iterdir()):
            for p in path.iterdir():
                p.unlink(missing_ok=True)
            path.rmdir()

    def set_aside(self, run_id: str, reason: str, dest: Path | None = None) -> Path:
        """Move the files of an invalid folder (not its lock) to ``dest/<run_id>`` (default
        ``<store>/_invalid/<run_id>.<time>``), with the reason in ``reason.txt``; returns where."""
        src = self.path(run_id)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        dest = Path(dest) / run_id if dest else self.root / "_invalid" / f"{run_id}.{stamp}"
        if dest.exists():
            dest = dest.with_name(f"{dest.name}.{stamp}.{time.time_ns() % 10**6}")
        dest.mkdir(parents=True)
        for p in src.iterdir():
            if not is_lock_file(p.name):
                shutil.move(str(p), str(dest / p.name))
        atomic_write_text(dest / "reason.txt", reason + "\n")
        return dest


class RunStores:
    """Several run stores read as one (read-only), first root first: a run id is looked up in
    each root in turn, and a run listed once, from the first root that has it finished."""

    def __init__(self, stores: list[RunStore]):
        self.stores = stores
        self.root = stores[0].root

    @classmethod
    def default(cls, user: str | Path | None = None, results: str | Path | None = "") -> RunStores:
        """The user's store (``user``, default ``VIASD_RUNS_DIR`` or ``./runs``) and the results store
        committed in the repository (``results``: default :func:`viasd.paths.results_dir`; None: left out)."""
        stores = [RunStore(user or runs_dir())]
        extra = results_dir() if results == "" else results
        if extra is not None and Path(extra).resolve() != stores[0].root and Path(extra).is_dir():
            stores.append(RunStore(extra))
        return cls(stores)

    def path(self, run_id: str) -> Path:
        """The folder of ``run_id`` in the first root that has it finished (else in the first root)."""
        found = self.find(run_id)
        return found["path"] if found else self.stores[0].path(run_id)

    def find(self, run_id: str) -> dict[str, Any] | None:
        return next((r for s in self.stores if (r := s.find(run_id)) is not None), None)

    def is_finished(self, run_id: str) -> bool:
        return self.find(run_id) is not None

    def verdict(self, run_id: str) -> Verdict | None:
        """The first root's folder of ``run_id`` that exists (finished ones first)."""
        verdicts = [v for s in self.stores if (v := s.verdict(run_id)) is not None]
        return next((v for v in verdicts if v.finished), verdicts[0] if verdicts else None)

    def finished_runs(self) -> Iterator[dict[str, Any]]:
        seen: set[str] = set()
        for s in self.stores:
            for r in s.finished_runs():
                if r["run_id"] not in seen:
                    seen.add(r["run_id"])
                    yield r

    def invalid_runs(self) -> list[Verdict]:
        return [v for s in self.stores for v in s.invalid_runs()]

    def examples(self, run_id: str) -> list[dict[str, Any]]:
        found = self.find(run_id)
        return RunStore(found["root"]).examples(run_id) if found else []


def as_stores(store: RunStore | RunStores | None) -> RunStores:
    """``store`` as a :class:`RunStores` (None: :meth:`RunStores.default`)."""
    if store is None:
        return RunStores.default()
    return store if isinstance(store, RunStores) else RunStores([store])


def store_roots(store: RunStore | RunStores | None) -> list[Path]:
    """The roots of ``store`` in order, then the results store committed in the repository: where a
    reserved folder shared by a store's runs (``_cost/``, the pair's cost model) is looked up."""
    return list(dict.fromkeys([*(s.root for s in as_stores(store).stores), results_dir()]))


def find_run(run_id: str, store: RunStore | RunStores | None = None) -> dict[str, Any] | None:
    """The finished valid run ``run_id`` from the user's store or the results store (None: neither has it)."""
    return as_stores(store).find(run_id)


def valid_runs(store: RunStore | RunStores | None = None) -> list[dict[str, Any]]:
    """Every finished valid run of the user's store and the results store (user's first)."""
    return list(as_stores(store).finished_runs())


def invalid_lines(store: RunStore | RunStores) -> list[str]:
    """One line per invalid folder of the store(s): ``invalid run folder PATH: REASON (not used)``."""
    return [f"invalid run folder {v.path}: {v.reason} (not used; `python -m experiments.store check` lists them)"
            for v in as_stores(store).invalid_runs()]

