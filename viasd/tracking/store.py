"""The local run store: one folder per run, written atomically, read by the reports.

Layout of ``<store>/<run_id>/``: ``config.yaml`` (resolved config, with an ``inputs`` node
holding the content hash of every input file the run reads), ``meta.json`` (git sha and
dirty-tree flag, host, versions, start time, data folder), ``examples.jsonl`` (one line per
example, appended and flushed as examples finish), and ``summary.json`` — written last and
atomically, so a run is *finished* exactly when its ``summary.json`` exists. Every file is
written with the same mode (0644 under the usual umask). ``run_id`` is derived from a hash of
the resolved config *including the input hashes*, so re-running an identical config on
identical files finds the finished run and skips it, and editing a prompt/data/mask file
makes a new run.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from viasd.utils.fs import atomic_write_json, atomic_write_text, jsonable

#: Config keys that do not change a run's result (excluded from its identity hash).
VOLATILE_KEYS = ("tracking", "hydra", "threads", "exp")


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (the content part of a run's identity)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def config_hash(cfg: dict[str, Any]) -> str:
    """Stable 10-hex-digit hash of a resolved config without volatile keys."""
    ident = {k: v for k, v in cfg.items() if k not in VOLATILE_KEYS}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:10]


# Method names runs were stored under before a rename (docs/migration.md): read as the new name.
RENAMED_METHODS = {"viasd": "via_sd"}


def method_label(method: dict[str, Any] | None) -> str:
    """The method as configured: ``sd`` with a non-model drafter is ``sd_<drafter>`` (``sd_ngram``…)."""
    method = method or {}
    name = str(method.get("name", "method"))
    name = RENAMED_METHODS.get(name, name)
    drafter = (method.get("drafter") or {}).get("name") if isinstance(method.get("drafter"), dict) else None
    return f"sd_{drafter}" if name == "sd" and drafter and drafter != "model" else name


def run_id_for(cfg: dict[str, Any]) -> str:
    """``<pair>__<method label>__<task>__<hash>`` for a resolved config dict."""
    parts = [str(cfg.get("pair", {}).get("name", "pair")), method_label(cfg.get("method")),
             str(cfg.get("task", {}).get("name", "task"))]
    return "__".join(parts + [config_hash(cfg)])


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
    """An open run folder: append examples, then :meth:`finish` with the summary."""

    def __init__(self, path: Path, cfg: dict[str, Any], meta: dict[str, Any] | None = None,
                 resume: list[dict[str, Any]] | None = None):
        """Open ``path`` for a run of ``cfg``; ``resume``: example records of an earlier,
        unfinished attempt at the same run id, kept as the first lines of ``examples.jsonl``."""
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path / "config.yaml", yaml.safe_dump(cfg, sort_keys=False))
        import torch
        import transformers

        self.meta = {
            "git_sha": git_sha(), "git_dirty": git_dirty(), "host": platform.node(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "run_id": path.name, "inputs": cfg.get("inputs", {}), **(meta or {}),
            **({"resumed_examples": len(resume)} if resume else {}),
        }
        atomic_write_json(path / "meta.json", self.meta)
        (path / "summary.json").unlink(missing_ok=True)
        self._examples = open(path / "examples.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        self.records: list[dict[str, Any]] = []
        for record in resume or []:
            self.log_example(record)

    def update_meta(self, **fields: Any) -> None:
        """Add fields to ``meta.json`` (e.g. the slim mask once the pair is loaded)."""
        self.meta.update(fields)
        atomic_write_json(self.path / "meta.json", self.meta)

    def log_example(self, record: dict[str, Any]) -> None:
        """Append one example record and flush it to disk."""
        record = jsonable(record)
        self.records.append(record)
        self._examples.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._examples.flush()

    def finish(self, summary: dict[str, Any], scores: list[dict[str, Any]] | None = None) -> None:
        """Merge per-example ``scores`` into ``examples.jsonl``, then write ``summary.json``.

        Both are written atomically; ``summary.json`` last, so it marks the run finished.
        """
        self._examples.close()
        if scores and len(scores) == len(self.records) and any(scores):
            for rec, sc in zip(self.records, scores):
                rec["score"] = jsonable(sc)
            atomic_write_text(self.path / "examples.jsonl",
                              "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records))
        atomic_write_json(self.path / "summary.json", summary)

    def abort(self) -> None:
        self._examples.close()


class RunStore:
    """A folder of runs keyed by ``run_id``."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def path(self, run_id: str) -> Path:
        return self.root / run_id

    def is_finished(self, run_id: str) -> bool:
        return (self.path(run_id) / "summary.json").is_file()

    def open(self, run_id: str, cfg: dict[str, Any], meta: dict[str, Any] | None = None,
             resume: list[dict[str, Any]] | None = None) -> Run:
        return Run(self.path(run_id), cfg, meta, resume)

    def finished_runs(self) -> Iterator[dict[str, Any]]:
        """Yield ``{"run_id", "path", "config", "summary"}`` for every finished run."""
        if not self.root.is_dir():
            return
        for d in sorted(self.root.iterdir()):
            s = d / "summary.json"
            if s.is_file():
                summary = json.loads(s.read_text())
                if summary.get("method") in RENAMED_METHODS:
                    summary["method"] = RENAMED_METHODS[summary["method"]]
                yield {
                    "run_id": d.name,
                    "path": d,
                    "config": yaml.safe_load((d / "config.yaml").read_text()),
                    "summary": summary,
                }

    def partial_examples(self, run_id: str) -> list[dict[str, Any]]:
        """Example records an unfinished (crashed or interrupted) run of ``run_id`` left behind,
        up to the first incomplete line; [] for a finished or absent run."""
        p = self.path(run_id) / "examples.jsonl"
        if self.is_finished(run_id) or not p.is_file():
            return []
        out = []
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return out

    def examples(self, run_id: str) -> list[dict[str, Any]]:
        p = self.path(run_id) / "examples.jsonl"
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.is_file() else []
