"""``python -m experiments.live_check DIR/NAME ROW … [--n N] [--runs-dir DIR] [--results DIR|none]``

Checks a replayed frontier (``experiments.replay … out=DIR/NAME.rows.json report=DIR/NAME``) live:
prints the ``experiments.run`` command that decodes the chosen rows (0-based indices into
``NAME.rows.json``) interleaved with ``ar`` on the first ``N`` problems (default 10) of the traced run's
workload, and the table of the frontier's predicted speedup against the measured CPU-time and
wall-clock speedups of those cells once they are finished runs in the stores (``–`` until then;
:mod:`viasd.report.live_check`, ``docs/replay.md`` §9). With the traced run's traces in a store and the
frontier's cost file in the repository, each point is also replayed over the live problems only (the same
problems the measurement is over). ``--out DIR/NAME`` also writes that table as a committed output
(``NAME.md``/``.tex``/``.sources.json``; :func:`~viasd.report.live_check.write_live`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.replay import policies_for
from viasd.analysis.cost import CostModel
from viasd.analysis.replay import Policy, TraceSet, replay
from viasd.analysis.trace import trace_dir
from viasd.errors import one_line_errors
from viasd.methods.ar import ARConfig
from viasd.paths import PROJECT_ROOT, runs_dir
from viasd.report.live_check import (
    HEADER,
    cell_ids,
    command,
    live_overrides,
    live_rows,
    load_frontier,
    pick,
    write_live,
)
from viasd.tracking.store import RunStores


def replayed_on_live(stores: RunStores, sources: dict[str, Any], picked: dict[str, dict[str, Any]], ar_id: str
                     ) -> dict[str, float]:
    """Each picked point's predicted speedup replayed over the problems the live ``ar`` cell decoded (the traced
    run's examples with those ids), priced by the frontier's cost file; empty until that cell is finished, or
    without the traces or the cost file."""
    run, cost = (sources.get("replay") or {}).get("run"), (sources.get("replay") or {}).get("cost") or {}
    live = {e["id"] for e in stores.examples(ar_id)}
    folder = next((f for s in stores.stores if ((f := trace_dir(s.root, run or "")) / "index.json").is_file()), None)
    if not live or folder is None or not cost.get("path") or not (PROJECT_ROOT / cost["path"]).is_file():
        return {}
    idx = [i for i, e in enumerate(stores.examples(run)) if e["id"] in live]
    traces, model = TraceSet(folder), CostModel.load(PROJECT_ROOT / cost["path"], cost.get("pair"))
    ar_s = replay(traces, Policy("ar", ARConfig()), model, idx)["wall_s"]
    policies = policies_for([row["overrides"] for row in picked.values()])
    return {label: replay(traces, p, model, idx, ar_s)["predicted_speedup"] for label, p in zip(picked, policies)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("frontier", help="the frontier's folder/name (its NAME.rows.json and NAME.sources.json)")
    ap.add_argument("rows", nargs="+", type=int, help="0-based rows of NAME.rows.json to decode live")
    ap.add_argument("--n", type=int, default=10, help="problems decoded (the first N of the workload; default 10)")
    ap.add_argument("--runs-dir", default=None, help="run store folder (default: $VIASD_RUNS_DIR or ./runs)")
    ap.add_argument("--results", default="", help="results store read after it (default: the repository's "
                    "results/runs; none: leave it out)")
    ap.add_argument("--out", default=None, help="also write the table as the output DIR/NAME (.md/.tex/.sources.json)")
    args = ap.parse_args(argv)
    with one_line_errors():
        stores = RunStores.default(args.runs_dir or runs_dir(), None if args.results == "none" else args.results)
        rows, sources = load_frontier(Path(args.frontier))
        picked = pick(rows, args.rows)
        overrides, diff = live_overrides(stores, sources, picked, args.n)
        ids = cell_ids(overrides)
        table = live_rows(stores, ids, picked, replayed_on_live(stores, sources, picked, ids["ar"]))
        written = (write_live(Path(args.out), stores, Path(args.frontier), ids, picked, table, command(overrides),
                              sources.get("scale") or "") if args.out else [])
    print(f"decode them (interleaved with ar, {args.n} problems; resumable, finished cells reused):\n\n"
          f"    {command(overrides)}\n")
    if diff:
        print(f"note: this ar cell's workload differs from the traced run's in {', '.join(diff)}\n")
    print(pd.DataFrame(table, columns=HEADER).to_markdown(index=False, disable_numparse=True))
    if written:
        print(f"\nwrote {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
