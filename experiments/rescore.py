"""``python -m experiments.rescore [--store DIR] [--task gsm8k …] [--dry-run]``

Re-scores the finished runs of a store from their stored predictions with the current scoring rule
(no decoding; :mod:`viasd.tracking.rescore`): per-example scores, the summary's metric and the run's
checksums are rewritten where a score moved, and each such run's ``meta.json`` records the rule and
the examples that moved. Default store: the results store committed in the repository
(``results/runs``). Rebuild the reports afterwards (``python -m experiments.report --publish …``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from viasd.paths import PROJECT_ROOT
from viasd.tracking.rescore import RESCORERS, rescore_store


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default=str(PROJECT_ROOT / "results" / "runs"), help="run store folder")
    ap.add_argument("--task", nargs="*", default=None, choices=sorted(RESCORERS), help="tasks (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="print what would move, write nothing")
    args = ap.parse_args(argv)
    store = Path(args.store)
    if not store.is_dir():
        print(f"error: no run store at {store}; pass --store DIR", file=sys.stderr)
        return 2
    done, moved, kept = rescore_store(store, args.task, dry_run=args.dry_run)
    for r in done:
        ids = ", ".join(f"{k} {v[0]:g}→{v[1]:g}" for k, v in r["changed"].items())
        print(f"{'would re-score' if args.dry_run else 're-scored'} {r['run_id']}: {r['metric']} "
              f"{r['before']} → {r['after']:g} ({ids or 'summary only'})")
    for rid, users in kept.items():
        print(f"left as scored: {rid} (the input of {len(users)} runs that hash its examples, e.g. {users[0]}; "
              "re-scoring it would change their run ids)")
    for rid in moved:
        print(f"speedup_at_quality moved with its ar run: {rid}")
    if not done and not kept:
        print("[viasd] nothing to re-score: every finished run's scores are the current rule's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
