"""Tables of interleaved exps — the main job (``+exp=main``, ``make run``) and the verdict
(``+exp=verdict``): every cell against the ``ar`` cell of its group on the same examples — tokens/s,
speedup with its interval, the load-free predicted speedup, how many outputs are ``ar``'s token for
token, quality with its paired difference and p-value (:func:`viasd.report.shared.write_shared`)."""

from __future__ import annotations

from omegaconf import OmegaConf

from viasd.report.common import REPORTS, write_table
from viasd.report.shared import write_shared


@REPORTS.register("main")
def main_table(runs, missing, out, store, scale) -> list[str]:
    return _groups_table("main", "The main job: the built-in prompts, each method interleaved with ar",
                         runs, missing, out, store, scale)


@REPORTS.register("verdict")
def verdict_table(runs, missing, out, store, scale) -> list[str]:
    return _groups_table("verdict", "The verdict: each method interleaved with ar, problem by problem",
                         runs, missing, out, store, scale)


def _groups_table(exp: str, title: str, runs, missing, out, store, scale) -> list[str]:
    """One table per interleaved group (its ``ar`` cell), named ``<exp>`` or ``<exp>_<task>``."""
    groups: dict[str, list[str]] = {}
    for r in runs:
        if r["ar"] is not None:
            groups.setdefault(r["ar"]["run_id"], []).append(r["run_id"])
    if not groups:
        rows = [[r["summary"].get("method"), r["run_id"], r["summary"].get("tokens_per_s")] for r in runs]
        return write_table(out, exp, title, ["method", "run", "tokens/s"], rows, runs, missing, scale=scale)
    paths = []
    labels, legend = {r["run_id"]: r["label"] for r in runs if r.get("label")}, _legend(runs)
    names = table_names(exp, list(groups), [r["run_id"] for r in runs] + list(missing))
    for name, (ar_id, ids) in zip(names, groups.items()):
        paths += write_shared(out, name, title, store, ar_id, [x for x in ids if x != ar_id], scale,
                              labels=labels, legend=legend)
    return paths


def table_names(exp: str, ar_ids: list[str], cell_ids: list[str]) -> list[str]:
    """The table name of each group (its ``ar`` run id): ``<exp>`` when the exp has one task,
    ``<exp>_<task>`` when it has several (also while only some of their groups have finished, so a
    task's table keeps its name as the others finish), ``<exp>_<i>`` when groups share a task.
    ``cell_ids``: the run ids of all the exp's cells, finished or missing."""
    tasks = [a.split("__")[2] for a in ar_ids]
    if len({c.split("__")[2] for c in [*cell_ids, *ar_ids]}) == 1 and len(ar_ids) == 1:
        return [exp]
    if len(set(tasks)) == len(tasks):
        return [f"{exp}_{t}" for t in tasks]
    return [f"{exp}_{i + 1}" for i in range(len(ar_ids))]


def _legend(runs) -> str:
    """What each variant label runs: ``label = overrides`` from the exp's ``exp.variants``."""
    variants = next((OmegaConf.select(r["config"], "exp.variants", default=None) for r in runs), None) or {}
    used = {r.get("label") for r in runs}
    parts = [f"`{label}` = {' '.join(extra)}" for label, extra in variants.items()
             if label in used and list(extra) != [f"method={label}"]]
    return ("Rows named by label: " + "; ".join(parts) + " (the others: `method=<row>` with its defaults).") \
        if parts else ""
