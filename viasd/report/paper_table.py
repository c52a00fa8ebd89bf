"""The paper's Table 2 layout: methods × the five task kinds, from interleaved runs.

Rows are the methods (an interleaved exp's variant labels, in its order), columns the paper's task
kinds — summarization (XSum), translation (WMT14 de-en), reasoning (GSM8K), QA (NQ-open), coding
(HumanEval, MBPP) — and under each task: the speedup over ``ar`` with its bootstrap 95% interval,
the rejection rate (Σ rejected / Σ drafted), the quality (the task's primary metric) and its paired
difference to ``ar`` with its p-value. Every cell pairs the run with the ``ar`` cell of its own
group on the examples they share (:func:`viasd.analysis.paired.compare_to_ar`), exactly as the
per-task tables (``verdict_<task>.md``, :mod:`viasd.report.shared`) do; those carry the wall-clock,
predicted and CPU-time speedups side by side, the lossless check and the run ids.

The speedup is the CPU-time one (process CPU seconds, one torch thread): a descheduled process or a
paused machine does not advance it, where the wall clock does — on a shared machine it is the
measured speedup that load cannot move; a run without ``cpu_s`` falls back to the wall clock
(marked ``wall``). A cell decoded apart from its ``ar`` cell (added to a finished group: meta.json
``schedule.decoded_with``) is marked † — its speedup compares two sessions' loads.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from viasd.analysis.paired import compare_to_ar, load_run, run_cost
from viasd.report.common import write_table
from viasd.report.shared import decoded_apart
from viasd.tracking.baseline import PRIMARY
from viasd.utils.fs import atomic_write_text

#: The paper's task kinds in its column order, with the tasks that stand for each.
TASK_KINDS = [("Summarization", ("xsum", "cnndm")), ("Translation", ("wmt14_deen",)), ("Reasoning", ("gsm8k",)),
              ("QA", ("nq_open", "squad")), ("Coding", ("humaneval", "mbpp"))]
TASK_NAMES = {"xsum": "XSum", "cnndm": "CNN/DM", "wmt14_deen": "WMT14 de-en", "gsm8k": "GSM8K", "nq_open": "NQ-open",
              "squad": "SQuAD", "humaneval": "HumanEval", "mbpp": "MBPP"}
METRIC_NAMES = {"rougeL": "ROUGE-L", "bleu": "BLEU", "accuracy": "accuracy", "exact_match": "EM", "f1": "F1",
                "pass@1": "pass@1"}
SUBCOLUMNS = ["speedup [95% CI]", "rej.", "quality", "Δ vs ar (p)"]


def _task_order(tasks: list[str]) -> list[str]:
    kinds = [t for _, ts in TASK_KINDS for t in ts]
    return sorted(tasks, key=lambda t: (kinds.index(t) if t in kinds else len(kinds), t))


def _kind(task: str) -> str:
    return next((k for k, ts in TASK_KINDS if task in ts), "Other")


def _cell(store, run: dict[str, Any], ar: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
    """The four sub-cells of one run against its group's ``ar`` run, and the record of the cost file
    that priced the comparison (None: none)."""
    cost = run_cost(store, ar)
    cmp = compare_to_ar(store, run, ar, cost)
    by_id = {e["id"]: e for e in run["examples"]}
    drafted = sum(float(by_id[i].get("drafted") or 0) for i in cmp["ids"])
    rejected = sum(float(by_id[i].get("rejected") or 0) for i in cmp["ids"])
    sp, how = (cmp["cpu"], "") if not math.isnan(cmp["cpu"].estimate) else (cmp["speedup"], " wall")
    apart = " †" if run["run_id"] != ar["run_id"] and decoded_apart(run, ar["run_id"]) else ""
    speed = f"{sp.estimate:.2f}× {sp.interval()}{how}{apart}"
    rej = f"{rejected / drafted:.3f}" if drafted > 0 else "–"
    q = cmp["quality"]
    quality = f"{cmp['quality_mean']:.1f}" if q.n else "–"
    delta = (f"{q.estimate:+.1f} (p {q.p:.2g})" if run["run_id"] != ar["run_id"] else "–") if q.n else "–"
    return [speed, rej, quality, delta], (cost.record() if cost is not None and cmp["ids"] else None)


def paper_table2(runs: list[dict], missing: list[str], out: Path, store, scale: str, name: str = "table2",
                 title: str = "Table 2 — main results") -> list[str]:
    """Write ``name.md``/``.tex``/``.sources.json`` in the paper's layout (see the module doc) from the
    collected runs of an interleaved exp (:func:`viasd.report.common.collect`); returns the paths."""
    labels = list(dict.fromkeys(r.get("label") or r["summary"].get("method") for r in runs))
    tasks = _task_order(list(dict.fromkeys(str(r["summary"].get("task")) for r in runs)))
    loaded: dict[str, dict[str, Any] | None] = {}

    def _load(run_id: str) -> dict[str, Any] | None:
        if run_id not in loaded:
            loaded[run_id] = load_run(store, run_id)
        return loaded[run_id]

    cells: dict[tuple[str, str], list[str]] = {}
    costs: dict[str, Any] = {}
    for r in runs:
        label, task = r.get("label") or r["summary"].get("method"), str(r["summary"].get("task"))
        run, ar = _load(r["run_id"]), _load(r["ar"]["run_id"]) if r.get("ar") else None
        if run is None or ar is None:
            cells[label, task] = ["– (no matched ar run)", "–", "–", "–"]
            continue
        cells[label, task], costs[r["run_id"]] = _cell(store, run, ar)
    header = ["method"] + [f"{TASK_NAMES.get(t, t)} {sub}" for t in tasks for sub in SUBCOLUMNS]
    rows = [[label] + [c for t in tasks for c in cells.get((label, t), ["–"] * len(SUBCOLUMNS))] for label in labels]
    n = sorted({len(_load(r["run_id"])["examples"]) for r in runs if _load(r["run_id"])})
    metrics = "; ".join(f"{TASK_NAMES.get(t, t)}: {METRIC_NAMES.get(PRIMARY.get(t, ''), PRIMARY.get(t, '–'))}"
                        for t in tasks)
    apart = sorted({lb for (lb, t), c in cells.items() if c[0].endswith("†")})
    kinds = ", ".join(f"{_kind(t)} = {TASK_NAMES.get(t, t)}" for t in tasks)
    note = (f"The paper's Table 2 layout: rows are methods, columns the task kinds ({kinds}); "
            f"{'/'.join(map(str, n))} problems per task, every method interleaved with `ar` problem by problem, each "
            f"cell paired with the `ar` cell of its own group on the same problems. Speedup: CPU-time speedup over "
            f"`ar` (process CPU seconds, one torch thread: what machine load cannot move; `wall`: wall clock where "
            f"a run lacks CPU time) with its bootstrap 95% interval over problems; rej.: rejection rate (Σ rejected "
            f"/ Σ drafted; – without drafting); quality: the task's primary metric (0–100; {metrics}); Δ vs ar: the "
            f"paired difference (corpus metrics by paired bootstrap) and its p (exact McNemar for 0/100 scores, "
            f"Wilcoxon signed-rank otherwise). Wall-clock and load-free predicted speedups, outputs equal to `ar` "
            f"token for token and every run id: the per-task tables (`verdict_<task>.md`)."
            + (f" † decoded apart from its `ar` cell (added after the group finished): its speedup compares two "
               f"sessions' loads ({', '.join(f'`{a}`' for a in apart)}); read its predicted speedup in the "
               f"per-task table." if apart else ""))
    paths = write_table(out, name, title, header, rows, runs, missing, note=note, scale=scale, extra={"costs": costs})
    # LaTeX: one column group per task, as the paper prints it
    columns = pd.MultiIndex.from_tuples([("", "method")] + [(f"{_kind(t)}: {TASK_NAMES.get(t, t)}", s)
                                                          for t in tasks for s in SUBCOLUMNS])
    frame = pd.DataFrame(rows, columns=columns, dtype=str)
    caption = f"{title} ({scale} scale)" if scale else title
    tex = frame.to_latex(index=False, escape=True, caption=caption, position="t", multicolumn=True,
                         multicolumn_format="c")
    atomic_write_text(out / f"{name}.tex", tex.replace("±", r"$\pm$").replace("×", r"$\times$")
                      .replace("Δ", r"$\Delta$").replace("†", r"$\dagger$"))
    return paths
