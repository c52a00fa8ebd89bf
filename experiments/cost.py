"""``python -m experiments.cost [RUN_ID …] [--runs-dir DIR] [--pair PAIR]``

Validates the load-free cost model (``viasd.analysis.cost``, measured by
``python -m experiments.bench --cost-curve``) against finished runs: for every finished run of a
pair with a cost file in ``<store>/_cost/`` and an ``ar`` run of its workload on a superset of
its examples, the speedup the cost model predicts from the run's counters on the shared examples
next to the wall-clock speedup, and the error; ``ar`` runs get their predicted against their
measured tokens/s. Prints the table and the mean absolute error (quiet machines: the goal is
within 10% of the wall-clock speedup).
"""

from __future__ import annotations

import argparse
import math
import sys

import pandas as pd

from viasd.analysis.cost import find_cost, relative_error
from viasd.analysis.paired import compare_to_ar, find_ar, load_run, predicted_seconds
from viasd.paths import runs_dir
from viasd.tracking.store import RunStore, RunStores


def validate(store: RunStore, run_ids: list[str] | None = None, pair: str | None = None) -> list[dict]:
    """One row per finished run with a cost file and an ``ar`` run of its workload."""
    rows = []
    ids = run_ids or [r["run_id"] for r in store.finished_runs() if r["summary"].get("new_tokens")]
    for rid in ids:
        run = load_run(store, rid)
        if run is None or (pair and run["summary"].get("pair") != pair):
            continue
        s = run["summary"]
        cost = find_cost(store.root, s.get("pair", ""), run["meta"].get("runtime"), run["meta"].get("threads"))
        ar = run if s.get("method") == "ar" else find_ar(store, run)
        if cost is None or ar is None or not run["examples"]:
            continue
        if run is ar:
            ids_ = [e["id"] for e in run["examples"]]
            pred_s = sum(predicted_seconds(cost, run, run, ids_))
            wall_s = sum(float(e["wall_s"]) for e in run["examples"])
            tokens = sum(int(e["new_tokens"]) for e in run["examples"])
            rows.append({"run": rid, "method": "ar", "n": len(ids_), "wall": tokens / wall_s,
                         "predicted": tokens / pred_s, "what": "tokens/s",
                         "error": relative_error(tokens / pred_s, tokens / wall_s)})
            continue
        cmp = compare_to_ar(store, run, ar, cost)
        rows.append({"run": rid, "method": s.get("method"), "n": cmp["n"], "wall": cmp["speedup"].estimate,
                     "predicted": cmp["predicted"].estimate, "what": f"speedup vs {ar['run_id']}",
                     "error": relative_error(cmp["predicted"].estimate, cmp["speedup"].estimate)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="run ids (default: every finished run)")
    ap.add_argument("--runs-dir", default=None, help="run store folder (default: $VIASD_RUNS_DIR or ./runs)")
    ap.add_argument("--pair", default=None, help="only runs of this pair")
    args = ap.parse_args(argv)
    store = RunStores.default(args.runs_dir or runs_dir())  # the user's store, then the results store
    rows = validate(store, args.runs or None, args.pair)
    if not rows:
        print("no finished run has both a cost file for its pair and an ar run of its workload; measure one with "
              "`python -m experiments.bench --cost-curve pair=<pair>`")
        return 0
    table = pd.DataFrame(rows)
    print(table.to_markdown(index=False, floatfmt=".3f"))
    errs = [abs(r["error"]) for r in rows if not math.isnan(r["error"])]
    sp = [abs(r["error"]) for r in rows if r["method"] != "ar" and not math.isnan(r["error"])]
    print(f"\nmean |error|: {sum(errs) / len(errs):.1%} over {len(errs)} runs"
          + (f"; speedups only: {sum(sp) / len(sp):.1%} over {len(sp)} runs" if sp else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
