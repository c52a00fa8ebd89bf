"""An open run folder: the one writer of a run's files (``config.yaml``, ``meta.json``,
``examples.jsonl`` with its checksum chain, ``summary.json`` last).

:class:`Run` is what :meth:`viasd.tracking.store.RunStore.open` hands the process holding a run's
lock; every write goes through :func:`store_write` (atomic replace or flushed append; a full disk is
:class:`~viasd.tracking.store_errors.StoreFull`, a read-only store
:class:`~viasd.tracking.store_errors.StoreReadOnly`). The layout and the proof a reader checks are
described in :mod:`viasd.tracking.store` and :mod:`viasd.tracking.proof`.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from viasd.tracking.proof import CHAIN_KEY, chain_of, record_sha256
from viasd.tracking.store_errors import store_error
from viasd.utils.fs import append_text, atomic_write_text, jsonable
from viasd.utils.machine import cpu_name


def store_write(path: Path, text: str, root: Path, append: bool = False) -> None:
    """The run store's one write: ``text`` replaces ``path`` atomically, or (``append``) is appended
    and flushed; a full disk becomes :class:`StoreFull`, a read-only store :class:`StoreReadOnly`."""
    try:
        (append_text if append else atomic_write_text)(path, text)
    except OSError as e:
        err = store_error(e, path, root)
        if err is not None:
            raise err from None
        raise


def _json(obj: Any) -> str:
    return json.dumps(jsonable(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False) + "\n"


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def git_dirty() -> bool | None:
    """True when the project's work tree has uncommitted changes to tracked files (None: no git)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                             text=True, timeout=10, cwd=Path(__file__).parent)
        return bool(out.stdout.strip()) if out.returncode == 0 else None
    except Exception:
        return None


class Run:
    """An open run folder (its lock held by the caller): append examples, then :meth:`finish`."""

    def __init__(self, path: Path, cfg: dict[str, Any], meta: dict[str, Any] | None = None,
                 resume: list[dict[str, Any]] | None = None, root: Path | None = None):
        """Write ``config.yaml``, ``meta.json`` and ``examples.jsonl`` into ``path``; ``resume``:
        example records of an earlier, unfinished attempt at the same run id, kept as the first lines."""
        import torch
        import transformers

        self.path, self.root = path, root or path.parent
        self.records: list[dict[str, Any]] = _chained(path.name, [jsonable(r) for r in resume or []])
        self.meta = {
            "git_sha": git_sha(), "git_dirty": git_dirty(), "host": platform.node(), "cpu": cpu_name(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "run_id": path.name, "inputs": cfg.get("inputs", {}), **(meta or {}),
            **({"resumed_examples": len(resume)} if resume else {}),
        }
        (path / "summary.json").unlink(missing_ok=True)
        self._write("config.yaml", yaml.safe_dump(cfg, sort_keys=False))
        self._write("meta.json", _json(self.meta))
        self._write("examples.jsonl", "".join(_line(r) for r in self.records))

    def _write(self, name: str, text: str, append: bool = False) -> None:
        store_write(self.path / name, text, self.root, append)

    def update_meta(self, **fields: Any) -> None:
        """Add fields to ``meta.json`` (e.g. the slim mask once the pair is loaded)."""
        self.meta.update(fields)
        self._write("meta.json", _json(self.meta))

    def log_example(self, record: dict[str, Any]) -> None:
        """Append one example record and flush it to disk."""
        record = jsonable(record)
        record = {**record, CHAIN_KEY: chain_of(self.records[-1][CHAIN_KEY] if self.records else self.path.name,
                                                _as_read(record))}
        self._write("examples.jsonl", _line(record), append=True)
        self.records.append(record)

    def rewrite(self, records: list[dict[str, Any]]) -> None:
        """Replace the folder's example records (atomically): e.g. a resumed search whose trials are
        not the interrupted attempt's."""
        self.records = _chained(self.path.name, [jsonable(r) for r in records])
        self._write("examples.jsonl", "".join(_line(r) for r in self.records))

    def finish(self, summary: dict[str, Any], scores: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Merge per-example ``scores`` into ``examples.jsonl``, then write ``summary.json`` with the
        file's line count and checksum and the ``record_sha256`` of the summary and ``meta.json``
        (:func:`~viasd.tracking.proof.record_sha256`); returns the summary as written.

        Both are written atomically; ``summary.json`` last, so it marks the run finished.
        """
        if scores and len(scores) == len(self.records) and any(scores):
            for rec, sc in zip(self.records, scores):
                rec["score"] = jsonable(sc)
            self._write("examples.jsonl", "".join(_line(r) for r in self.records))
        data = (self.path / "examples.jsonl").read_bytes()
        summary = {**summary, "examples_lines": len(self.records), "examples_sha256": hashlib.sha256(data).hexdigest()}
        summary = json.loads(_json(summary))  # as it reads back: the checksum is of what the file holds
        meta = json.loads((self.path / "meta.json").read_text(encoding="utf-8"))
        summary["record_sha256"] = record_sha256(summary, meta)
        self._write("summary.json", _json(summary))
        return summary

    def abort(self) -> None:
        """Leave the folder unfinished (its complete examples are kept for the next attempt)."""


def _as_read(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as its line of ``examples.jsonl`` reads back (what its chain link is of)."""
    return json.loads(_line(record))


def _chained(run_id: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` with their checksum chain from the first (:func:`~viasd.tracking.proof.chain_of`)."""
    out, prev = [], run_id
    for rec in records:
        rec = {**rec, CHAIN_KEY: chain_of(prev, _as_read(rec))}
        out.append(rec)
        prev = rec[CHAIN_KEY]
    return out
