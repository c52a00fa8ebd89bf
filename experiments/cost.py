"""``python -m experiments.cost [RUN_ID …] [--runs-dir DIR] [--pair PAIR] [--unfinished]``

Validates the load-free cost model (``viasd.analysis.cost``, measured by
``python -m experiments.bench --cost-curve``) against finished runs: for every finished run of a
pair with a cost file in ``<store>/_cost/`` and an ``ar`` run of its workload on a superset of
its examples, the speedup the cost model predicts from the run's counters on the shared examples
next to the wall-clock speedup, and the error; ``ar`` runs get their predicted against their
measured tokens/s. Prints the table and the mean absolute error (quiet machines: the goal is
within 10% of the wall-clock speedup), and the error against the CPU-time speedup (process CPU
seconds, which a waiting process or a paused machine does not advance) where runs recorded it —
the prediction then on the same examples (``cpu n``: runs from before ``cpu_s`` have fewer).
``--unfinished`` adds runs still being decoded, on their complete examples (the cells of an
interleaved exp in progress), each against the ``ar`` run sharing most of its examples.
Every run is priced by its ``ar`` run's cost file, as a compared table prices its rows.
``python -m experiments.cost roofline gpu=h100|h200|a100 pair=<pair> out=<file>`` writes the pair's cost file
as that card would price it by a roofline model (:mod:`viasd.analysis.roofline`), without a GPU.
``--fit bilinear`` reads each cost grid through its bilinear least-squares fit instead of
interpolating the measured points (``viasd.analysis.cost.fit_bilinear``): run it with both to see
which prices the runs of a machine better.
"""

from __future__ import annotations

import argparse
import math
import sys

import pandas as pd

from viasd.analysis.cost import FITS, CostModel, relative_error
from viasd.analysis.paired import (
    compare_to_ar,
    differences,
    find_ar,
    load_run,
    load_unfinished,
    predicted_seconds,
    run_cost,
    workload_without_subset,
)
from viasd.paths import runs_dir
from viasd.tracking.proof import FINISHED, UNFINISHED
from viasd.tracking.store import RunStore, RunStores


def _unfinished_ar(store: RunStore, run: dict) -> dict | None:
    """The ``ar`` run (finished or not) of ``run``'s workload sharing the most examples with it."""
    want, ids = workload_without_subset(run["config"]), {e["id"] for e in run["examples"]}
    best = None
    for v in store.folders("ar"):
        if v.state not in (FINISHED, UNFINISHED) or not v.config or differences(workload_without_subset(v.config), want):
            continue
        ar = load_run(store, v.path.name) or load_unfinished(store, v.path.name)
        shared = len(ids & {e["id"] for e in ar["examples"]}) if ar else 0
        if shared and (best is None or shared > best[0]):
            best = (shared, ar)
    return best[1] if best else None


def validate(store: RunStore, run_ids: list[str] | None = None, pair: str | None = None,
             unfinished: bool = False, fit: str = "grid") -> list[dict]:
    """One row per finished run with a cost file and an ``ar`` run of its workload (``unfinished``: also
    runs still being decoded, on their complete examples, against the ``ar`` run sharing most of them),
    priced by the ``ar`` run's cost file read by ``fit`` (:data:`~viasd.analysis.cost.FITS`)."""
    rows = []
    ids = run_ids or ([v.path.name for v in store.folders() if v.state in (FINISHED, UNFINISHED)] if unfinished
                      else [r["run_id"] for r in store.finished_runs() if r["summary"].get("new_tokens")])
    for rid in ids:
        run = load_run(store, rid) or (load_unfinished(store, rid) if unfinished else None)
        if run is None or (pair and run["summary"].get("pair") != pair) or not run["examples"]:
            continue
        s = run["summary"]
        ar = run if s.get("method") == "ar" else (_unfinished_ar(store, run) if unfinished else find_ar(store, run))
        cost = None if ar is None else run_cost(store, ar)
        if cost is None:
            continue
        if fit != cost.fit:
            cost = CostModel(cost.data, cost.path, cost.sha256, cost.pair, fit)
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
                     "error": relative_error(cmp["predicted"].estimate, cmp["speedup"].estimate),
                     "cpu": cmp["cpu"].estimate, "cpu n": cmp["cpu"].n,
                     "error vs cpu": relative_error(cmp["predicted_cpu"].estimate, cmp["cpu"].estimate)})
    return rows


ROOFLINE_USAGE = ("usage: python -m experiments.cost roofline gpu=h100|h200|a100 pair=<pair> out=<file> "
                  "[overhead=eager|graph] [eager_layer_us=N eager_base_us=N graph_layer_us=N graph_base_us=N] [price=runs] "
                  "[rows=FILE.rows.json,…]")


def roofline(argv: list[str]) -> int:
    """``roofline gpu=… pair=… out=…``: a ``viasd.cost/v1`` file from the pair's shapes and the card's peaks
    (:mod:`viasd.analysis.roofline`; a model, labelled as one), which ``experiments.replay … cost=FILE`` reads."""
    from viasd.analysis.roofline import OVERHEADS, write_roofline
    from viasd.errors import ConfigError, one_line_errors

    with one_line_errors():
        kv = dict(a.split("=", 1) for a in argv if "=" in a)
        bad = [a for a in argv if "=" not in a] + [k for k in kv if k not in (
            "gpu", "pair", "out", "overhead", "price", "rows",
            *(f"{m}_{p}_us" for m in OVERHEADS for p in ("base", "layer")))]
        if bad or not {"gpu", "pair", "out"} <= set(kv):
            raise ConfigError(f"{'unknown argument ' + repr(bad[0]) if bad else 'gpu, pair and out are needed'}; "
                              + ROOFLINE_USAGE.removeprefix("usage: "))
        try:
            over = {m: {"base_us": float(kv.get(f"{m}_base_us", o["base_us"])),
                        "per_layer_us": float(kv.get(f"{m}_layer_us", o["per_layer_us"]))} for m, o in OVERHEADS.items()}
        except ValueError as e:
            raise ConfigError(f"overhead microseconds must be numbers ({e}); e.g. eager_layer_us=250") from None
        path, doc = write_roofline(kv["out"], kv["pair"], kv["gpu"].lower(), kv.get("overhead", "eager"), over)
    entry = doc["pairs"][kv["pair"]]
    print(f"{path}: {doc['device']}, overhead {doc['roofline']['overhead']}; pair {kv['pair']}: "
          + ", ".join(f"{role} {mid} t(1 token, ctx 1024) = {doc['models'][mid]['t_ms']['1024']['1']:.2f} ms"
                      for role, mid in entry.items() if role != "c" and mid in doc["models"])
          + "".join(f"; skipped {m}: {why}" for m, why in doc["skipped"].items()))
    print(f"price a trace with it: python -m experiments.replay run=<run id> method=… cost={path} "
          f"cost_pair={kv['pair']}")
    if kv.get("price") == "runs" or kv.get("rows"):
        from viasd.analysis.roofline import price_rows, price_runs

        stores = RunStores.default(runs_dir())
        with one_line_errors():
            if kv.get("price") == "runs":  # decoded runs: their counters under both prices
                print(pd.DataFrame(price_runs(stores, kv["pair"], path)).to_markdown(index=False, floatfmt=".2f"))
            if kv.get("rows"):  # replayed policies (e.g. the oracle gate): their aggregate counters
                files = kv["rows"].split(",")
                print(pd.DataFrame(price_rows(stores, kv["pair"], path, files)).to_markdown(index=False,
                                                                                            floatfmt=".2f"))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "roofline":
        return roofline(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", help="run ids (default: every finished run)")
    ap.add_argument("--runs-dir", default=None, help="run store folder (default: $VIASD_RUNS_DIR or ./runs)")
    ap.add_argument("--pair", default=None, help="only runs of this pair")
    ap.add_argument("--unfinished", action="store_true",
                    help="also runs still being decoded (their complete examples; e.g. an interleaved exp's cells)")
    ap.add_argument("--fit", choices=FITS, default="grid",
                    help="read each cost grid by interpolating its points (grid, the default) or by its bilinear fit")
    args = ap.parse_args(argv)
    store = RunStores.default(args.runs_dir or runs_dir())  # the user's store, then the results store
    if args.unfinished:
        store = RunStore(args.runs_dir or runs_dir())  # unfinished runs live in the user's store only
    from viasd.errors import one_line_errors

    with one_line_errors():  # a malformed cost file in the store: one line naming the fix
        rows = validate(store, args.runs or None, args.pair, args.unfinished, args.fit)
    if not rows:
        print("no finished run has both a cost file for its pair and an ar run of its workload; measure one with "
              "`python -m experiments.bench --cost-curve pair=<pair>`")
        return 0
    table = pd.DataFrame(rows)
    print(table.to_markdown(index=False, floatfmt=".3f"))
    errs = [abs(r["error"]) for r in rows if not math.isnan(r["error"])]
    sp = [abs(r["error"]) for r in rows if r["method"] != "ar" and not math.isnan(r["error"])]
    cpu = [abs(e) for r in rows if r["method"] != "ar" and not math.isnan(e := r.get("error vs cpu", math.nan))]
    print(f"\ncost grids read by {args.fit}; mean |error|: {sum(errs) / len(errs):.1%} over {len(errs)} runs"
          + (f"; speedups only: {sum(sp) / len(sp):.1%} over {len(sp)} runs" if sp else "")
          + (f"; against the CPU-time speedup: {sum(cpu) / len(cpu):.1%} over {len(cpu)} runs" if cpu else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
