"""A replayed frontier checked live: some of its points decoded interleaved with ``ar``, predicted vs measured.

:func:`live_overrides` gives the ``python -m experiments.run`` overrides that decode chosen rows of a
frontier (``NAME.rows.json``, written by ``experiments.replay … out=``) on the first ``n`` problems of
its traced run's workload: the verdict's interleaved, resumable entry (``+exp=verdict``) at the
frontier's scale, with the traced run's pair, task, ``max_new_tokens`` and threads, and its variants
replaced by ``ar`` and the rows' replay overrides (each row a policy composed exactly as
``experiments.run`` composes it), labelled ``p<row>``. :func:`live_rows` reads those cells from the run
stores (their ids composed as the grid composes them, :func:`~viasd.harness.grid.exp_cells`) and pairs
each with the group's ``ar`` cell (:func:`~viasd.analysis.paired.compare_to_ar`): the frontier's
predicted speedup next to the measured CPU-time and wall-clock speedups with their 95% intervals, the
prediction of the cost model from the live runs' own counters, and the frontier's error against the
CPU-time speedup (``docs/replay.md`` §9). :func:`write_live` commits that table as an output
(``NAME.md``/``.tex``/``.sources.json``: the cells and their ``ar`` as source runs, the cost file that
priced the live prediction, the frontier's rows by hash), checked by ``report --check`` like a compared table.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

from viasd.analysis.paired import compare_to_ar, differences, load_run, run_cost, workload_without_subset
from viasd.errors import ConfigError
from viasd.harness.grid import exp_cells
from viasd.harness.interleave import variant_label
from viasd.harness.runner import identity
from viasd.paths import PROJECT_ROOT
from viasd.report.common import write_table
from viasd.report.shared import decoded_apart
from viasd.tracking.ids import file_sha256
from viasd.tracking.store import RunStores, run_id_for

HEADER = ["point", "policy", "frontier predicted (n)", "replayed on the live problems", "live n",
          "CPU-time speedup [95% CI]", "wall speedup [95% CI]", "predicted from the live counters",
          "frontier / CPU-time − 1", "replayed / CPU-time − 1"]


def load_frontier(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows and sources of the frontier ``path`` (folder/name); one error line when it has no rows."""
    rows, sources = (path.parent / f"{path.name}{s}" for s in (".rows.json", ".sources.json"))
    if not rows.is_file():
        raise ConfigError(f"{rows} not found: a live check reads a frontier's rows (python -m experiments.replay … "
                          f"out={path}.rows.json report={path})")
    return json.loads(rows.read_text()), json.loads(sources.read_text()) if sources.is_file() else {}


def pick(rows: list[dict[str, Any]], points: list[int]) -> dict[str, dict[str, Any]]:
    """``{"p<i>": row i}`` of the chosen rows; one error line for a row that cannot be decoded as a cell."""
    out = {}
    for i in points:
        if not 0 <= i < len(rows):
            raise ConfigError(f"point {i}: the frontier has rows 0–{len(rows) - 1}")
        over = rows[i].get("overrides") or []
        if not over or over == ["method=ar"]:
            raise ConfigError(f"point {i} ({rows[i].get('method')}) is "
                              + ("ar itself" if over else "no policy experiments.run composes (the run's own "
                                 "policy or an oracle bound)") + "; pick another row")
        out[f"p{i}"] = rows[i]
    return out


def live_overrides(stores: RunStores, sources: dict[str, Any], picked: dict[str, dict[str, Any]], n: int
                   ) -> tuple[list[str], list[str]]:
    """``(overrides, workload differences)``: the ``experiments.run`` overrides decoding ``ar`` and the
    picked rows interleaved on ``n`` problems, and where that ``ar`` cell's workload differs from the
    traced run's beyond the subset size and the interleaved schedule (empty when it does not)."""
    run = (sources.get("replay") or {}).get("run") or next(iter(sources.get("runs") or []), None)
    found = stores.find(run) if run else None
    if found is None:
        raise ConfigError(f"the frontier's traced run {run} is in no run store read "
                          f"({', '.join(str(s.root) for s in stores.stores)})")
    cfg = found["config"]
    variants = {"ar": ["method=ar"], **{label: row["overrides"] for label, row in picked.items()}}
    spec = "{" + ",".join(f"{k}:[{','.join(json.dumps(o) for o in v)}]" for k, v in variants.items()) + "}"
    overrides = ["+exp=verdict", f"scale={sources.get('scale') or 'local'}", f"pair={cfg['pair']['name']}",
                 f"task={cfg['task']['name']}", f"task.n_examples={n}",
                 f"generation.max_new_tokens={cfg['generation']['max_new_tokens']}"]
    overrides += [f"threads={cfg['threads']}"] if cfg.get("threads") is not None else []
    overrides += ["~exp.variants", f"+exp.variants={spec}"]
    ar_cfg = next(c for cell, c in exp_cells(overrides) if variant_label(cell, c) == "ar")
    diff = [d for d in differences(workload_without_subset(identity(ar_cfg)), workload_without_subset(cfg))
            if d != "schedule"]
    return overrides, diff


def command(overrides: list[str]) -> str:
    return "python -m experiments.run " + " ".join(shlex.quote(o) for o in overrides)


def cell_ids(overrides: list[str]) -> dict[str, str]:
    """``{variant label: run id}`` of the cells ``overrides`` decode (composed as the grid composes them)."""
    return {variant_label(cell, cfg): run_id_for(identity(cfg)) for cell, cfg in exp_cells(overrides)}


def live_rows(stores: RunStores, ids: dict[str, str], picked: dict[str, dict[str, Any]],
              replayed: dict[str, float] | None = None) -> list[list[Any]]:
    """One :data:`HEADER` row per picked point (``ids``: :func:`cell_ids`; ``replayed``: each point's predicted
    speedup replayed over the live cells' problems only, when their traces are at hand): measured columns
    blank (–) until its cell and the group's ``ar`` cell are finished runs in ``stores``."""
    ar, replayed = load_run(stores, ids["ar"]), replayed or {}
    out = []
    for label, row in picked.items():
        predicted, again = row.get("predicted_speedup", math.nan), replayed.get(label, math.nan)
        first = [label, row.get("method"), f"{predicted:.2f}× ({row.get('n_examples')})", _x(again)]
        run = load_run(stores, ids[label]) if ar is not None else None
        if run is None:
            out.append(first + ["–", f"not decoded yet ({ids[label] if ar is not None else ids['ar']})"] + ["–"] * 4)
            continue
        cmp = compare_to_ar(stores, run, ar)
        cpu, wall, pr = cmp["cpu"], cmp["speedup"], cmp["predicted"]
        measured = cpu.estimate if cpu.n else math.nan
        out.append(first + [cmp["n"], f"{_x(measured)} {cpu.interval()}" if cpu.n else "– (no cpu_s)",
                            f"{_x(wall.estimate)} {wall.interval()}", _x(pr.estimate), _err(predicted, measured),
                            _err(again, measured)])
    return out


def _x(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.2f}×"


def _err(predicted: float, measured: float) -> str:
    return "–" if math.isnan(predicted) or math.isnan(measured) or not measured else f"{predicted / measured - 1:+.1%}"


def write_live(out: Path, stores: RunStores, frontier: Path, ids: dict[str, str], picked: dict[str, dict[str, Any]],
               table: list[list[Any]], decode: str, scale: str = "") -> list[str]:
    """Write the live check ``table`` (:func:`live_rows`) as the output ``out`` (folder/name): ``.md``/``.tex``
    and ``.sources.json`` naming the finished cells and their ``ar`` (``runs``), the cost file that priced the
    predictions from the live counters (``costs``, :meth:`~viasd.analysis.cost.CostModel.record`) and the
    frontier's rows file with its sha256 (``frontier``); returns the paths. One error line when no cell is
    decoded yet (nothing measured to commit)."""
    ar = load_run(stores, ids["ar"])
    done = [(label, run) for label in picked if ar is not None and (run := load_run(stores, ids[label])) is not None]
    if not done:
        raise ConfigError(f"no picked point is decoded yet; decode them first: {decode}")
    apart = [label for label, run in done if decoded_apart(run, ids["ar"])]
    cost = run_cost(stores, ar)
    record = cost.record() if cost is not None else None
    runs = [{"run_id": r["run_id"], "ar": {"run_id": ids["ar"]}, "ar_command": None} for r in (ar, *(r for _, r in done))]
    rows_file = frontier.parent / f"{frontier.name}.rows.json"
    where = rows_file.resolve().relative_to(PROJECT_ROOT) if rows_file.resolve().is_relative_to(PROJECT_ROOT) else rows_file
    note = (f"Frontier `{where}` (its predicted speedups, over the traced run's problems) checked against cells "
            f"decoded interleaved with `ar` `{ids['ar']}`: " + ", ".join(f"`{label}` = `{r['run_id']}`" for label, r in done)
            + ". Measured speedups: bootstrap 95% intervals over problems; the errors divide the prediction by the "
            "CPU-time speedup (process CPU seconds, one torch thread). A lossy point's live trajectory leaves the traced "
            "one at its first divergence, so its replayed prediction prices a different text than the one decoded. "
            f"Decoded by: `{decode}`."
            + (" Decoded without their `ar` beside them (meta.json `schedule.decoded_with`), their measured speedups "
               "divide two sessions' loads: " + ", ".join(f"`{label}`" for label in apart) + "." if apart else "")
            + (f" Live counters priced by the cost file `{record['path']}` (sha256 {record['sha256'][:12]}…)." if record else ""))
    extra = {"costs": {r["run_id"]: record for r in runs},
             "frontier": {"rows": str(where), "sha256": file_sha256(rows_file), "points": {k: v.get("method") for k, v in picked.items()}}}
    return write_table(out.parent, out.name, f"Frontier {frontier.name} checked live", HEADER, table, runs, [],
                       note=note, scale=scale, extra=extra)
