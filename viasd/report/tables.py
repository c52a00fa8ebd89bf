"""Tables 1–5 (Markdown + LaTeX): DIMR search, and method tables with mean ± 95% CI over seeds."""

from __future__ import annotations

import math
from pathlib import Path

from viasd.report.common import (
    PAIRED_HEADER,
    PAIRED_NOTE,
    REPORTS,
    _fmt,
    _label,
    code_isolation,
    paired_cells,
    paired_group,
    repeat_groups,
    stat,
    with_isolation,
    write_table,
)
from viasd.report.paper_table import paper_table2
from viasd.tracking.baseline import quality, target_calls_per_token
from viasd.tracking.store import RunStore


@REPORTS.register("table1")
def table1(runs, missing, out: Path, store: RunStore, scale: str) -> list[str]:
    rows = []
    for r in runs:
        s = r["summary"]
        rnd = [b["kl_q_slim"] for b in s.get("baselines", {}).get("random", [])]
        fk = s.get("baselines", {}).get("first_k", {})
        eo = s.get("baselines", {}).get("every_other", {})
        held = (s.get("held_out") or {}).get("searched", {})  # held-out numbers when the search kept some text apart
        kept = f"{s['budget']}/{s['n_layers']}" if s.get("space", "layers") == "layers" else \
            f"{len(s['layers']['attn'])}a+{len(s['layers']['mlp'])}m/{2 * s['n_layers']}"
        rows.append([s["pair"], kept, s.get("space", "layers"), s.get("param_fraction", math.nan), s["objective"],
                     str(s["layers"]), s["kl_q_slim"], s["top1_agreement"], s.get("confident_top1", math.nan),
                     held.get("kl_q_slim", math.nan), held.get("confident_top1", math.nan),
                     min(rnd) if rnd else math.nan, fk.get("kl_q_slim"), eo.get("kl_q_slim"),
                     s["search_seconds"] / 60, s["n_trials"]])
    return write_table(out, "table1", "Table 1 — DIMR search per pair and budget",
                       ["pair", "kept", "space", "params read", "objective", "mask", "KL(q||q')", "top-1 agr.",
                        "conf. top-1", "held-out KL", "held-out conf. top-1", "best of random KL", "first_k KL",
                        "every_other KL", "search min", "trials"], rows, runs, missing, scale=scale)


def _method_table(name: str, title: str, runs, missing, out: Path, scale: str, extra_keys: list[str],
                  store: RunStore) -> list[str]:
    rows, levels = [], []
    for group in sorted(repeat_groups(runs), key=lambda g: (g[0]["summary"]["pair"], g[0]["summary"]["task"])):
        s = group[0]["summary"]
        found = {code_isolation(r["summary"], r.get("meta")) for r in group}
        levels.append(None if found == {None} else ", ".join(sorted(x for x in found if x)))
        qname, _ = quality(s)
        cmp = paired_group(store, group)
        cells = paired_cells(cmp)
        rows.append([s["pair"], s["task"], s["method"] + (f" ({_label(group[0], extra_keys)})" if extra_keys else ""),
                     len(group), stat([r["summary"].get("rejection_rate") for r in group]),
                     stat([target_calls_per_token(r["summary"]) for r in group]),
                     stat([r["speedup"] for r in group]), cmp["n"] if cmp else "–", *cells[:2],
                     stat([r["summary"].get("tokens_per_s") for r in group]),
                     f"{qname}={_fmt(stat([quality(r['summary'])[1] for r in group]), 2)}" if qname else "–",
                     *cells[2:]])
    header = ["pair", "task", "method", "seeds", "rejection rate", "full-model calls/token", "speedup vs ar (×)",
              *PAIRED_HEADER[:3], "tokens/s", "quality", *PAIRED_HEADER[3:]]
    header, rows = with_isolation(header, rows, levels)
    return write_table(out, name, title, header, rows, runs, missing, note=PAIRED_NOTE, scale=scale)


@REPORTS.register("table2")
def table2(runs, missing, out, store, scale):
    """The paper's layout (methods × task kinds, :mod:`viasd.report.paper_table`) where the exp's cells are
    interleaved (cpu-large: the verdict's runs); a row per pair × task × method otherwise."""
    if any(r.get("label") for r in runs):
        return paper_table2(runs, missing, out, store, scale)
    return _method_table("table2", "Table 2 — main results", runs, missing, out, scale, [], store)


@REPORTS.register("table3")
def table3(runs, missing, out, store, scale):
    return _method_table("table3", "Table 3 — encoder-decoder (T5)", runs, missing, out, scale, [], store)


@REPORTS.register("table4")
def table4(runs, missing, out, store, scale):
    return _method_table("table4", "Table 4 — slim-verifier ablation", runs, missing, out, scale,
                         ["method.slim.mask", "method.slim.space"], store)


@REPORTS.register("table5")
def table5(runs, missing, out, store, scale):
    return _method_table("table5", "Table 5 — VIA-SD over each drafter", runs, missing, out, scale,
                         ["method.drafter.name"], store)


