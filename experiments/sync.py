"""``python -m experiments.sync [--runs DIR] [--mode online|offline] [--project viasd] [--force]``

Uploads every finished run of the local run store to Weights & Biases, with the same group /
job_type / tags / summary / per-example history / run-id artifact a live run logs. Without
credentials (or with ``--mode offline``) it writes offline runs under ``<runs>/wandb/`` that
``wandb sync <runs>/wandb/offline-run-*`` pushes later. A run folder already uploaded
(``wandb.json`` finished) is skipped unless ``--force``; one whose live W&B logging stopped midway
(``wandb.json`` started) is uploaded again *in place of* that partial W&B run (same W&B id, the
partial offline folder removed), never beside it.
"""

from __future__ import annotations

import argparse
import sys

from viasd.paths import runs_dir
from viasd.tracking.store import RunStore
from viasd.tracking.wandb_logger import has_credentials, upload_finished, wandb_record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default=None, help="run store folder (default: $VIASD_RUNS_DIR or ./runs)")
    ap.add_argument("--mode", choices=["online", "offline"], default=None,
                    help="default: online with credentials, else offline")
    ap.add_argument("--project", default="viasd")
    ap.add_argument("--entity", default=None)
    ap.add_argument("--force", action="store_true", help="upload runs that were uploaded before")
    args = ap.parse_args(argv)
    store = RunStore(args.runs or runs_dir())
    mode = args.mode or ("online" if has_credentials() else "offline")
    tracking = {"store_dir": str(store.root),
                "wandb": {"mode": mode, "project": args.project, "entity": args.entity, "tags": []}}
    runs = list(store.finished_runs())
    partial = sum(wandb_record(r["path"]).get("state") == "started" for r in runs)
    done = sum(upload_finished(tracking, r["path"], force=args.force) for r in runs)
    print(f"[viasd] {done} of {len(runs)} finished runs logged to W&B ({mode}); "
          f"{len(runs) - done} skipped (uploaded before: --force to redo)")
    if partial:
        print(f"[viasd] {partial} of them replaced the partial W&B run left when W&B stopped during the run")
    if mode == "offline" and done:
        print(f"[viasd] push them later with: wandb sync {store.root / 'wandb'}/offline-run-*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
