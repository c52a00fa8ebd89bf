"""``python -m experiments.report [--scale local|paper|smoke|cpu-large] [--only table2 fig_tiers] [--out reports | --publish] [--run-missing-ar] [--results DIR|none]``
``python -m experiments.report --check [--strict] [--out paper_figures] [--runs DIR]``

Rebuilds every table (Markdown + LaTeX) and figure (PNG + PDF) from the local run store
(``VIASD_RUNS_DIR``, default ``./runs``) and the results store committed in the repository
(``results/runs/``; a run in both is read from the local store) into ``<out>/<scale>/``, so reports
of one scale never overwrite another's. A user's reports go to ``reports/<scale>/`` (gitignored) or
``--out DIR``; only ``--publish`` writes the committed ``paper_figures/<scale>/`` (what the
repository's tables and figures are rebuilt with: from the same runs they come out byte-identical,
the PDFs carry no creation date). Folders that do not prove themselves as runs are listed once as
invalid (on stderr) and never used. Speedups are against the ``ar`` run of the identical workload
in the same store; cells without one print the command that creates it, and ``--run-missing-ar``
runs those commands before building.

``--check`` builds nothing: it lists every output under ``<out>/`` (default: the committed
``paper_figures/``) and ``bench_results/`` whose sources are not the runs the current code would
make (run ids recomputed from the configs, no decoding; :mod:`viasd.report.check`), with the fix
for each; exit status 1 when one is stale.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from viasd.errors import ConfigError
from viasd.harness.grid import CONF_DIR
from viasd.harness.runner import run
from viasd.paths import runs_dir
from viasd.report.build import REPORTS, build_all, collect, scales
from viasd.report.check import check_main, default_stores
from viasd.tracking.store import RunStores, invalid_lines

#: Where a user's reports go (gitignored), and the committed folder ``--publish`` and ``--check`` use.
USER_OUT, PUBLISHED = "reports", "paper_figures"


def run_missing_ar(names: list[str], scale: str, store: RunStores, overrides: list[str]) -> int:
    """Run the matched ``ar`` run of every cell that lacks one; returns how many were run."""
    commands = sorted({r["ar_command"] for n in names for r in collect(n, scale, store, overrides)[0] if r["ar_command"]})
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for cmd in commands:
            print(f"[viasd] {cmd}")
            run(compose(config_name="config", overrides=shlex.split(cmd)[3:]))
    return len(commands)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", default="local", choices=scales())
    ap.add_argument("--only", nargs="*", default=None, help="report names (default: all)")
    ap.add_argument("--out", default=None, help=f"root folder; outputs go to <out>/<scale>/ (default: {USER_OUT}/, "
                    f"gitignored; with --check: {PUBLISHED}/)")
    ap.add_argument("--publish", action="store_true", help=f"write the committed {PUBLISHED}/<scale>/ (the "
                    "repository's tables and figures) instead of your own output folder")
    ap.add_argument("--runs", default=None, help="run store folder (default: $VIASD_RUNS_DIR or ./runs)")
    ap.add_argument("--results", default="", help="results store read beside it (default: the repository's "
                    "results/runs; none: leave it out)")
    ap.add_argument("--override", nargs="*", default=[], help="Hydra overrides the exps were run with")
    ap.add_argument("--run-missing-ar", action="store_true", help="first run the matched ar runs that are missing")
    ap.add_argument("--check", action="store_true", help="build nothing: list the outputs under --out and "
                    "bench_results/ the current configs would not make (exit status 1 when one is stale)")
    ap.add_argument("--strict", action="store_true", help="with --check: an output that cannot be checked here "
                    "(an input file absent, e.g. no VIASD_DATA_DIR) fails too")
    args = ap.parse_args(argv)
    if args.publish and args.out is not None:
        print(f"error: --publish writes {PUBLISHED}/<scale>/ and --out {args.out} another folder; pass one of them",
              file=sys.stderr)
        return 2
    if args.check:
        return check_main([Path(args.out or PUBLISHED), Path("bench_results")], default_stores(args.runs or runs_dir()),
                          args.strict)
    out = Path(PUBLISHED if args.publish else args.out or USER_OUT)

    store = RunStores.default(args.runs or runs_dir(), None if args.results == "none" else args.results)
    for line in invalid_lines(store):
        print(line, file=sys.stderr)
    try:
        if args.run_missing_ar:
            run_missing_ar(args.only or REPORTS.names(), args.scale, store, args.override)
        res = build_all(out, store, args.scale, args.only, args.override)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    where = f"{out / args.scale}/" + ("" if args.publish else f" (yours; --publish writes {PUBLISHED}/{args.scale}/)")
    print(f"[viasd] reports in {where}")
    for name, paths in res.items():
        print(f"{name:<16} {paths if isinstance(paths, str) else ', '.join(paths)}")
        if isinstance(paths, str):
            continue
        # one sources file per table: an interleaved report writes one table per task (verdict_<task>.*)
        for src_path in dict.fromkeys(Path(p).with_suffix(".sources.json") for p in paths):
            if src_path.exists():
                for cmd in json.loads(src_path.read_text()).get("missing_ar", []):
                    print(f"{'':<16} no matched ar run (speedup –); create it with: {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
