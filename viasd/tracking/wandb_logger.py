"""Weights & Biases logging that never costs a run.

``tracking.wandb.mode``: ``online`` | ``offline`` | ``disabled``. ``online`` without an API key
(or when W&B cannot start) degrades to ``offline`` with one warning; if W&B fails entirely the
run goes on with the local run store only. Every W&B call is guarded: the local run store is
the source of truth for reports (offline W&B keeps config/summary only inside binary files).

A run is grouped by ``group`` (exp name or "adhoc"), ``job_type`` (method label) and tags
(pair, task, scale); each example is one history step (``example/*`` scalars, so the
dashboard draws charts); the summary carries every scalar of ``summary.json`` (speedup over
the matched ``ar`` run, ``speedup_at_quality``, rejection rate, full-model calls per token,
``metric/*`` quality, ``tier_share/*``); the run folder is an artifact named by the store's
run id, so re-runs add versions. :func:`upload_finished` replays a finished store run (what
``python -m experiments.sync`` and a skipped-but-finished run call); :meth:`WandbLogger.trial_logger`
is the per-trial hook for the DIMR search.

A run folder's ``wandb.json`` records its W&B run (``wandb_id``, ``mode``, the offline folder)
with ``state: started`` when W&B starts and ``state: finished`` once everything is logged. When
W&B stops working mid-run (its ``wandb-core`` service killed, the disk full) the run warns once,
tears W&B down quietly (no traceback at exit) and goes on with the local store; the folder stays
``started``, and :func:`upload_finished` later *replaces* that partial W&B run: same W&B id, its
partial offline folder removed first, so ``experiments.sync`` never writes a second offline run
beside it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from viasd.tracking.store import RunStore, method_label
from viasd.utils.fs import atomic_write_json

log = logging.getLogger(__name__)


def has_credentials() -> bool:
    """True when W&B can log online (WANDB_API_KEY or a netrc entry)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


def labels_for(resolved: dict[str, Any]) -> dict[str, Any]:
    """``group`` (exp name or "adhoc"), ``job_type`` (method label), ``tags`` (pair, task, scale) of a run config."""
    exp = resolved.get("exp") or {}
    return {"group": exp.get("name") or "adhoc", "job_type": method_label(resolved.get("method")),
            "tags": [str((resolved.get("pair") or {}).get("name")), str((resolved.get("task") or {}).get("name")),
                     str(exp.get("scale") or "adhoc")]}


def wandb_record(run_dir: Path) -> dict[str, Any]:
    """A run folder's ``wandb.json`` ({} when absent or unreadable); ``state`` defaults to finished
    (folders uploaded before the state was recorded)."""
    try:
        rec = json.loads((Path(run_dir) / "wandb.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"state": "finished", **rec} if isinstance(rec, dict) else {}


def _drop_partial_offline(store_dir: Path, rec: dict[str, Any]) -> None:
    """Remove the offline folder of a partial W&B run (``<store>/wandb/offline-run-*-<id>``)."""
    wid = str(rec.get("wandb_id") or "")
    if not wid:
        return
    for d in (Path(store_dir) / "wandb").glob(f"offline-run-*-{wid}"):
        shutil.rmtree(d, ignore_errors=True)


class WandbLogger:
    """A guarded W&B run: no method raises; the first W&B failure is one warning and ends W&B
    logging for this run (see the module docstring). ``wandb_id``: continue that W&B run (default:
    the partial W&B run an earlier attempt at this store run left, whose offline folder goes)."""

    def __init__(self, tracking_cfg: Any, resolved: dict[str, Any], run_id: str, group: str = "adhoc",
                 job_type: str | None = None, tags: list[str] | tuple[str, ...] = (), wandb_id: str | None = None):
        wcfg = dict(tracking_cfg.get("wandb", {}) or {})
        self.mode = str(wcfg.get("mode", "disabled"))
        self.run = None
        self.run_id = run_id
        self._best = math.inf
        store = RunStore(tracking_cfg.get("store_dir", "runs"))
        self._record = store.path(run_id) / "wandb.json"
        if self.mode == "disabled":
            return
        if self.mode == "online" and not has_credentials():
            warnings.warn("W&B online mode requested but no credentials found (WANDB_API_KEY / `wandb login`); "
                          "logging offline instead — sync later with `wandb sync`", stacklevel=2)
            self.mode = "offline"
        earlier = wandb_record(self._record.parent)
        if wandb_id is None and earlier.get("state") == "started":  # W&B stopped in an earlier attempt: replace it
            wandb_id = earlier.get("wandb_id")
            _drop_partial_offline(store.root, earlier)
        try:
            import wandb

            self.run = wandb.init(
                project=wcfg.get("project", "viasd"), entity=wcfg.get("entity"), mode=self.mode,
                name=run_id, id=wandb_id, resume="allow" if wandb_id and self.mode == "online" else None,
                config=resolved, group=group, job_type=job_type or "run",
                tags=list(dict.fromkeys([*tags, *(wcfg.get("tags", []) or [])])),
                dir=str(store.root), reinit="finish_previous",
                settings=wandb.Settings(init_timeout=30, silent=True),
            )
        except Exception as e:  # any W&B failure: keep going with the local store only
            warnings.warn(f"W&B could not start ({e.__class__.__name__}: {e}); continuing with the local run store only",
                          stacklevel=2)
            self.run = None
            return
        self._write_record("started")

    @property
    def next_step(self) -> int:
        """The history step the W&B run continues at (0 for a new run)."""
        return int(getattr(self.run, "step", 0) or 0) if self.run is not None else 0

    def _write_record(self, state: str) -> None:
        if self.run is None or not self._record.parent.is_dir():  # no run folder (yet): nothing to record
            return
        try:
            atomic_write_json(self._record, {"mode": self.mode, "wandb_id": self.run.id, "project": self.run.project,
                                             "state": state})
        except OSError as e:
            self._stop("recording the W&B run", e)

    def _stop(self, what: str, e: BaseException) -> None:
        """The first W&B failure: one warning, then W&B torn down quietly and left alone for this run."""
        warnings.warn(f"W&B stopped while {what} ({type(e).__name__}: {e}); the local run store has everything, "
                      "`python -m experiments.sync` uploads the run later", stacklevel=3)
        self.run = None
        try:
            import wandb

            wandb.teardown()  # unregisters W&B's exit hook first, so a dead service prints no traceback at exit
        except Exception:  # the service is gone: nothing left to close
            pass

    def log_example(self, step: int, record: dict[str, Any]) -> None:
        """One history step per example: its numeric scalars as ``example/<key>``."""
        if self.run is None:
            return
        scalars = {f"example/{k}": v for k, v in record.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "id"}
        try:
            self.run.log(scalars, step=step)
        except Exception as e:
            self._stop("logging the history", e)

    def trial_logger(self) -> Callable[[dict[str, Any]], None]:
        """A hook ``log(trial)`` for the DIMR search: one history step per trial as it is evaluated.

        ``trial`` is a trial record (``objective``, ``phase``, ``layers``, …); the step logs its
        numeric fields as ``dimr/<key>``, the best objective so far and the kept layers as text.
        """
        def log(trial: dict[str, Any]) -> None:
            if self.run is None:
                return
            obj = trial.get("objective")
            if isinstance(obj, (int, float)):
                self._best = min(self._best, float(obj))
            row = {f"dimr/{k}": v for k, v in trial.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            row.update({"dimr/best_objective": self._best, "dimr/layers": json.dumps(trial.get("layers")),
                        "dimr/phase": str(trial.get("phase"))})
            try:
                self.run.log(row)
            except Exception as e:
                self._stop("logging a DIMR trial", e)

        return log

    def log_run(self, summary: dict[str, Any], run_dir: Path) -> None:
        """Log the summary, the per-example table and the run folder as an artifact named by run id."""
        if self.run is None:
            return
        try:
            import wandb

            self.run.summary.update({k: (json.dumps(v) if isinstance(v, (list, dict)) else v)
                                     for k, v in summary.items()
                                     if isinstance(v, (int, float, str, list, dict)) and v is not None})
            rows = [json.loads(line) for line in (run_dir / "examples.jsonl").read_text().splitlines() if line]
            if rows:
                cols = [c for c in rows[0] if c not in ("token_ids",)]
                table = wandb.Table(columns=cols, data=[[json.dumps(r.get(c)) if isinstance(r.get(c), (dict, list))
                                                         else r.get(c) for c in cols] for r in rows])
                self.run.log({"examples": table})
            art = wandb.Artifact(f"run-{self.run_id}", type="run")
            for f in ("config.yaml", "meta.json", "examples.jsonl", "summary.json"):
                if (run_dir / f).is_file():
                    art.add_file(str(run_dir / f))
            self.run.log_artifact(art)
        except Exception as e:
            self._stop("logging the run", e)
            return
        self._record = run_dir / "wandb.json"
        self._write_record("finished")

    def log_artifact(self, path: Path, name: str, kind: str) -> None:
        """Log one file (e.g. a DIMR mask) as an artifact."""
        if self.run is None:
            return
        try:
            import wandb

            art = wandb.Artifact(name, type=kind)
            art.add_file(str(path))
            self.run.log_artifact(art)
        except Exception as e:
            self._stop("logging an artifact", e)

    def finish(self, failed: bool = False) -> None:
        """Close the W&B run (``failed``: exit code 1)."""
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=1 if failed else 0)
        except Exception as e:
            self._stop("finishing the run", e)
        self.run = None


def upload_finished(tracking_cfg: Any, run_dir: Path, force: bool = False) -> bool:
    """Log a finished store run to W&B (history replayed from ``examples.jsonl``); True if logged.

    Does nothing when W&B is disabled, or when the folder was uploaded before (``wandb.json``
    finished) unless ``force``. A partial upload (``state: started``: W&B stopped mid-run) is
    replaced (:class:`WandbLogger`): the same W&B id, its offline folder removed first, online
    history continued where it stopped.
    """
    wcfg = dict(tracking_cfg.get("wandb", {}) or {})
    run_dir = Path(run_dir)
    if str(wcfg.get("mode", "disabled")) == "disabled" or not (run_dir / "summary.json").is_file():
        return False
    if wandb_record(run_dir).get("state") == "finished" and not force:
        return False
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    wb = WandbLogger(tracking_cfg, cfg, run_dir.name, **labels_for(cfg))  # replaces a partial upload
    if wb.run is None:
        return False
    first = wb.next_step
    lines = (run_dir / "examples.jsonl").read_text().splitlines() if (run_dir / "examples.jsonl").is_file() else []
    for i, line in enumerate(x for x in lines if x.strip()):
        if i >= first:
            wb.log_example(i, json.loads(line))
    wb.log_run(summary, run_dir)
    wb.finish()
    return wandb_record(run_dir).get("state") == "finished"
