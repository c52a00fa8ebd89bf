"""``python -m experiments.compare --ar AR_RUN_ID RUN_ID … [--ignore KEY …] [--out DIR --name NAME --title T --scale S]``

Compares finished runs with one ``ar`` run on the examples they share (a run on
``task.n_examples=10`` against ``ar`` on ``task.n_examples=40`` of the same workload: id-hash
subsets nest): tokens/s and the speedup over ``ar`` on the same examples, whether each example's
tokens equal ``ar``'s, and quality on the same examples (:mod:`viasd.report.shared`). Prints
the table; ``--out`` also writes it as Markdown + LaTeX + sources JSON. Runs are looked up in the
local run store and then in the results store committed in the repository (``results/runs/``;
``--results none`` leaves it out); folders that do not prove themselves are listed once as
invalid (on stderr) and never compared. ``--unfinished`` also reads runs still being decoded
(the cells of an interleaved exp such as ``verdict``) on their complete examples: an interim
reading, printed only (a written table is made from finished runs). Text tasks' examples (ROUGE, BLEU,
exact match) are scored from their records as the run's finish will score them; code tasks' (HumanEval,
MBPP: scoring runs the programs) have no quality yet.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from viasd.errors import ConfigError
from viasd.paths import runs_dir
from viasd.report.shared import shared_header, shared_table, write_shared
from viasd.tracking.store import RunStores, invalid_lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ar", required=True, help="run id of the ar baseline (a superset of the others' examples)")
    ap.add_argument("runs", nargs="*", help="run ids to compare with it")
    ap.add_argument("--runs-dir", default=None, help="run store folder (default: $VIASD_RUNS_DIR or ./runs)")
    ap.add_argument("--results", default="", help="results store read after it (default: the repository's "
                    "results/runs; none: leave it out)")
    ap.add_argument("--out", default=None, help="folder to write <name>.md/.tex/.sources.json into")
    ap.add_argument("--name", default="shared")
    ap.add_argument("--title", default="Runs against ar on shared examples")
    ap.add_argument("--scale", default="", help="scale named in the title (e.g. cpu-large)")
    ap.add_argument("--ignore", nargs="*", default=[], help="config keys allowed to differ (e.g. pair.draft: "
                    "a draft loaded but unused by ar and by model-free drafters); named in the table's note")
    ap.add_argument("--unfinished", action="store_true", help="also runs still being decoded, on their complete "
                    "examples (printed only)")
    args = ap.parse_args(argv)
    if args.unfinished and args.out:
        print("error: --unfinished prints an interim table; drop --out (tables are written from finished runs)",
              file=sys.stderr)
        return 2
    store = RunStores.default(args.runs_dir or runs_dir(), None if args.results == "none" else args.results)
    for line in invalid_lines(store):
        print(line, file=sys.stderr)
    try:
        rows, _, note = shared_table(store, args.ar, args.runs, tuple(args.ignore), args.unfinished)
        if args.out:
            for p in write_shared(Path(args.out), args.name, args.title, store, args.ar, args.runs, args.scale,
                                  tuple(args.ignore)):
                print(f"wrote {p}")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(pd.DataFrame(rows, columns=shared_header(rows)).to_markdown(index=False, floatfmt=".3f"))
    print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
