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
    paths, tasks = [], [ar_id.split("__")[2] for ar_id in groups]
    labels, legend = {r["run_id"]: r["label"] for r in runs if r.get("label")}, _legend(runs)
    for i, (ar_id, ids) in enumerate(groups.items()):
        if len(groups) == 1:
            name = exp
        elif len(set(tasks)) == len(tasks):
            name = f"{exp}_{tasks[i]}"
        else:
            name = f"{exp}_{i + 1}"
        paths += write_shared(out, name, title, store, ar_id, [x for x in ids if x != ar_id], scale,
                              labels=labels, legend=legend)
    return paths


def _legend(runs) -> str:
    """What each variant label runs: ``label = overrides`` from the exp's ``exp.variants``."""
    variants = next((OmegaConf.select(r["config"], "exp.variants", default=None) for r in runs), None) or {}
    used = {r.get("label") for r in runs}
    parts = [f"`{label}` = {' '.join(extra)}" for label, extra in variants.items()
             if label in used and list(extra) != [f"method={label}"]]
    return ("Rows named by label: " + "; ".join(parts) + " (the others: `method=<row>` with its defaults).") \
        if parts else ""
