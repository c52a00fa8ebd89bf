"""The main job's table (``+exp=main``, ``make run``): every interleaved cell against the ``ar``
cell of its group on the same examples — tokens/s, speedup, how many outputs are ``ar``'s token
for token, quality (:func:`viasd.report.shared.write_shared`)."""

from __future__ import annotations

from viasd.report.common import REPORTS, write_table
from viasd.report.shared import write_shared


@REPORTS.register("main")
def main_table(runs, missing, out, store, scale) -> list[str]:
    groups: dict[str, list[str]] = {}
    for r in runs:
        if r["ar"] is not None:
            groups.setdefault(r["ar"]["run_id"], []).append(r["run_id"])
    title = "The main job: the built-in prompts, each method interleaved with ar"
    if not groups:
        rows = [[r["summary"].get("method"), r["run_id"], r["summary"].get("tokens_per_s")] for r in runs]
        return write_table(out, "main", title, ["method", "run", "tokens/s"], rows, runs, missing, scale=scale)
    paths = []
    for i, (ar_id, ids) in enumerate(groups.items()):
        name = "main" if len(groups) == 1 else f"main_{i + 1}"
        paths += write_shared(out, name, title, store, ar_id, [x for x in ids if x != ar_id], scale)
    return paths
