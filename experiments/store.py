"""``python -m experiments.store check [--move-aside DIR]`` | ``publish RUN_ID … [--to DIR]`` — the run stores.

``check`` lists every folder of the local run store (``VIASD_RUNS_DIR``, default ``./runs``;
``--runs``) and of the results store committed in the repository (``results/runs/``;
``--results DIR|none``) that is not a finished run proving itself (:mod:`viasd.tracking.proof`):
invalid folders with the reason, unfinished ones (the same command resumes them), empty ones,
and those being written now (naming the process). Reserved names (``wandb``, ``bench``,
``cost_curve``, ``_traces``, ``_cost``, anything starting with ``_`` or ``.``) are not run folders.
Exit status 1 when a folder is invalid. ``--move-aside DIR`` moves the local store's invalid and
empty folders (never one being written) to ``DIR/<name>/``.

``publish`` copies finished runs (config, meta, summary, examples with token ids — no locks,
W&B files or traces) from the local store into the results store (``--to``, default
``results/runs/``), so the evidence behind committed tables travels with the repository. A normal
run never writes there; publishing there removes the run's stash. It also publishes the DIMR masks
they read (``_masks/<pair>/``, :mod:`viasd.dimr.publish`): a search run's own mask, and a
``mask: auto`` run's mask with the search run that made it.

``stash [RUN_ID …] [--to DIR]`` copies the complete examples of unfinished runs (default: every one
of the local store with at least one example; also while they decode) into ``results/unfinished/``
(``--to``); ``restore [RUN_ID …] [--from DIR]`` copies them into the local store, where the same
command resumes each.

``export RUN_ID --format specbench [--out FILE] [--baseline AR_RUN_ID]`` writes a finished run as
Spec-Bench's answer jsonl (:mod:`viasd.tracking.specbench`), which Spec-Bench's ``evaluation/speed.py``
reads, and prints Spec-Bench's speed metric per task group (``task=specbench``: its six groups). A long decode spread over machines whose local stores do not survive them
(the verdict's 40-problem cells) commits its stash and loses at most what came after it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from viasd.dimr.publish import publish_masks
from viasd.errors import one_line_errors
from viasd.paths import results_dir, runs_dir, unfinished_dir
from viasd.tracking.proof import EMPTY, FINISHED, INVALID, UNFINISHED
from viasd.tracking.results import publish, restore, stash
from viasd.tracking.store import RunStore, RunStores, odd_folder


def check(stores: RunStores, move_aside: Path | None) -> int:
    """Print the state of every store; move the first store's invalid/empty folders aside. Returns the exit status."""
    invalid = 0
    for i, store in enumerate(stores.stores):
        verdicts = store.folders()
        rows = []
        for v in verdicts:
            if v.state in (UNFINISHED, EMPTY) and (lock := store.lock(v.path.name)).is_locked():
                rows.append(("being written", v, f"by {lock.describe()}"))
            elif v.state == UNFINISHED:
                rows.append(("unfinished", v, f"{v.records} complete examples; the same command resumes it"))
            elif v.state in (INVALID, EMPTY):
                rows.append((v.state, v, v.reason))
        counts = {s: sum(r[0] == s for r in rows) for s in ("being written", "unfinished", EMPTY, INVALID)}
        finished = sum(v.state == FINISHED for v in verdicts)
        print(f"{'run store' if i == 0 else 'results store'} {store.root}: {finished} finished runs, "
              + ", ".join(f"{n} {s}" for s, n in counts.items()))
        for state, v, why in rows:
            print(f"  {state:<13} {v.path.name}: {why}")
            if move_aside is not None and i == 0 and state in (INVALID, EMPTY):
                print(f"  {'':<13} moved to {_move(store, v.path, move_aside)}")
        invalid += counts[INVALID] if move_aside is None or i > 0 else 0
    return 1 if invalid else 0


def _move(store: RunStore, path: Path, dest: Path) -> Path:
    if odd_folder(path) is not None:  # a link or a name no run writes to: moved as it is (a link, not its target)
        target = dest / path.name
        target = target if not target.exists() and not target.is_symlink() else dest / f"{path.name}.{time.time_ns()}"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
        return target
    lock = store.lock(path.name)
    if not lock.try_acquire():
        return path  # it started being written since it was listed: left alone
    try:
        target = store.set_aside(path.name, f"moved by `experiments.store check`: {store.verdict(path.name).reason}",
                                 dest)
    finally:
        lock.release()
    shutil.rmtree(path, ignore_errors=True)
    return target


def export(stores: RunStores, run_id: str, out: Path | None, baseline: str | None) -> int:
    """``export RUN_ID --format specbench``: the answer file, and Spec-Bench's speed per task group."""
    import pandas as pd

    from viasd.tracking.specbench import export_run, group_rows

    path, lines, run = export_run(stores, run_id, out)
    print(f"{run['run_id']}: {len(lines)} answers written to {path}")
    base = None
    if baseline is not None:
        bpath, base, brun = export_run(stores, baseline, path.with_name(f"{path.stem}.baseline.jsonl"))
        print(f"{brun['run_id']}: {len(base)} baseline answers written to {bpath}")
    print(pd.DataFrame(group_rows(lines, base)).to_markdown(index=False, floatfmt=".3f"))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--runs", default=None, help="local run store (default: $VIASD_RUNS_DIR or ./runs)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", parents=[common], help="list the folders that are not finished valid runs")
    c.add_argument("--results", default="", help="results store checked too (default: results/runs; none: not)")
    c.add_argument("--move-aside", type=Path, default=None, metavar="DIR",
                   help="move the local store's invalid and empty folders to DIR/<name>/")
    p = sub.add_parser("publish", parents=[common],
                       help="copy finished runs into the results store committed in the repository")
    p.add_argument("run_ids", nargs="+")
    p.add_argument("--to", type=Path, default=None, help="results store (default: results/runs)")
    s = sub.add_parser("stash", parents=[common], help="copy the complete examples of unfinished runs into "
                                                        "results/unfinished")
    s.add_argument("run_ids", nargs="*", help="default: every unfinished run of the local store")
    s.add_argument("--to", type=Path, default=None, help="stash folder (default: results/unfinished)")
    r = sub.add_parser("restore", parents=[common], help="copy stashed runs into the local store to resume them")
    r.add_argument("run_ids", nargs="*", help="default: every stashed run")
    r.add_argument("--from", dest="src", type=Path, default=None, help="stash folder (default: results/unfinished)")
    e = sub.add_parser("export", parents=[common], help="write a finished run in another tool's format "
                                                         "(specbench: Spec-Bench's answer jsonl)")
    e.add_argument("run_id")
    e.add_argument("--format", choices=["specbench"], required=True)
    e.add_argument("--out", type=Path, default=None, help="answer file (default: <run id>.jsonl here)")
    e.add_argument("--baseline", default=None, metavar="RUN_ID",
                   help="also export this (ar) run beside it and print Spec-Bench's speedup against it")
    args = ap.parse_args(argv)
    user = RunStore(args.runs or runs_dir())
    with one_line_errors():
        if args.cmd == "export":
            return export(RunStores.default(user.root), args.run_id, args.out, args.baseline)
        if args.cmd == "check":
            return check(RunStores.default(user.root, None if args.results == "none" else args.results),
                         args.move_aside)
        if args.cmd == "publish":
            dest = args.to or results_dir()
            stores = RunStores.default(user.root, dest)  # a run (or search) already published is found there
            done = publish(args.run_ids, stores, dest, stash_dir=unfinished_dir() if args.to is None else None)
            done += publish_masks(args.run_ids, stores, Path(dest))
        elif args.cmd == "stash":
            ids = args.run_ids or [v.path.name for v in user.folders() if v.state == UNFINISHED and v.records]
            done = stash(ids, user, args.to or unfinished_dir())
        else:
            done = restore(args.src or unfinished_dir(), user, args.run_ids or None)
        for run_id, what in done or [("-", "nothing to do")]:
            print(f"{run_id}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
