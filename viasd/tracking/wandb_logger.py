"""Weights & Biases logging that never costs a run.

``tracking.wandb.mode``: ``online`` | ``offline`` | ``disabled``. ``online`` without an API key
(or when W&B cannot start) degrades to ``offline`` with one warning; if W&B fails entirely the
run goes on with the local run store only. Every W&B call is guarded: the local run store is
the source of truth for reports (offline W&B keeps config/summary only inside binary files).
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


class WandbLogger:
    """A guarded W&B run: ``log_run`` and ``finish`` never raise."""

    def __init__(self, tracking_cfg: Any, resolved: dict[str, Any], run_id: str):
        wcfg = dict(tracking_cfg.get("wandb", {}) or {})
        self.mode = str(wcfg.get("mode", "disabled"))
        self.run = None
        if self.mode == "disabled":
            return
        if self.mode == "online" and not _has_credentials():
            warnings.warn("W&B online mode requested but no credentials found (WANDB_API_KEY / `wandb login`); "
                          "logging offline instead — sync later with `wandb sync`", stacklevel=2)
            self.mode = "offline"
        try:
            import wandb

            self.run = wandb.init(
                project=wcfg.get("project", "viasd"), entity=wcfg.get("entity"), mode=self.mode,
                name=run_id, id=None, config=resolved, tags=list(wcfg.get("tags", []) or []),
                dir=str(Path(tracking_cfg.get("store_dir", "runs")).resolve()), reinit="finish_previous",
                settings=wandb.Settings(init_timeout=30, silent=True),
            )
        except Exception as e:  # any W&B failure: keep going with the local store only
            warnings.warn(f"W&B could not start ({e.__class__.__name__}: {e}); continuing with the local run store only",
                          stacklevel=2)
            self.run = None

    def log_run(self, summary: dict[str, Any], run_dir: Path) -> None:
        """Log the summary, the per-example table and the run folder as an artifact."""
        if self.run is None:
            return
        try:
            import json

            import wandb

            self.run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
            rows = [json.loads(line) for line in (run_dir / "examples.jsonl").read_text().splitlines() if line]
            if rows:
                cols = [c for c in rows[0] if c not in ("token_ids",)]
                table = wandb.Table(columns=cols, data=[[json.dumps(r.get(c)) if isinstance(r.get(c), (dict, list))
                                                         else r.get(c) for c in cols] for r in rows])
                self.run.log({"examples": table})
            art = wandb.Artifact(f"run-{self.run.id}", type="run")
            art.add_dir(str(run_dir))
            self.run.log_artifact(art)
        except Exception as e:
            warnings.warn(f"W&B logging failed ({e}); the local run store has everything", stacklevel=2)

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
            warnings.warn(f"W&B artifact logging failed ({e})", stacklevel=2)

    def finish(self, failed: bool = False) -> None:
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=1 if failed else 0)
        except Exception as e:
            warnings.warn(f"W&B finish failed ({e})", stacklevel=2)
        self.run = None
