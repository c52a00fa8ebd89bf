"""The paper's Table 2 at the measured scale (issue 62.10): ``report --scale cpu-large --only table2`` lays the
committed 40-problem verdict runs out as methods × the paper's task kinds, with the same sources (so the same
staleness check) as every exp table; table2's cpu-large cells are the verdict's."""

from __future__ import annotations

import json

import yaml

from viasd.paths import PROJECT_ROOT
from viasd.report.paper_table import SUBCOLUMNS, paper_table2
from viasd.tracking.store import RunStores

CONF = PROJECT_ROOT / "conf"
FIGURES = PROJECT_ROOT / "paper_figures" / "cpu-large"


def test_table2_at_cpu_large_is_the_verdicts_grid():
    """Same variants, the verdict's scale file, and the paper's five task kinds: every cell a verdict run.
    (The run ids themselves are recomputed by ``report --check`` against the committed table2's sources.)"""
    table2 = yaml.safe_load((CONF / "scale" / "table2" / "cpu-large.yaml").read_text())
    verdict = yaml.safe_load((CONF / "exp" / "verdict.yaml").read_text())
    verdict_scale = yaml.safe_load((CONF / "scale" / "verdict" / "cpu-large.yaml").read_text())
    assert table2["exp"]["entry"] == "interleave" == verdict["exp"]["entry"]
    assert table2["exp"]["variants"] == verdict["exp"]["variants"]
    assert {"/scale/verdict@_global_": "cpu-large"} in table2["defaults"]
    tasks = set(table2["hydra"]["sweeper"]["params"]["task"].split(","))
    assert tasks == set(verdict_scale["hydra"]["sweeper"]["params"]["task"].split(","))
    assert {"xsum", "wmt14_deen", "gsm8k", "nq_open"} <= tasks and tasks & {"humaneval", "mbpp"}


def _verdict_runs(task: str) -> list[dict]:
    """The collected-run records of one committed verdict group (label, run id, its ar run), from its table."""
    rows = json.loads((FIGURES / f"verdict_{task}.rows.json").read_text())["rows"]
    ar = rows[0][1]
    return [{"run_id": r[1], "label": r[0], "summary": {"task": task, "method": r[0]},
             "ar": {"run_id": ar}, "ar_command": None} for r in rows]


def test_paper_layout_from_committed_runs(tmp_path):
    runs = _verdict_runs("nq_open") + _verdict_runs("gsm8k")
    store = RunStores.default(tmp_path / "runs", "")
    paths = paper_table2(runs, [], tmp_path, store, "cpu-large")
    md = (tmp_path / "table2.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| method"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols == ["method"] + [f"{t} {s}" for t in ("GSM8K", "NQ-open") for s in SUBCOLUMNS]  # the paper's order
    rows = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in md.splitlines()
                              if line.startswith("| ") and not line.startswith("| method"))}
    assert list(rows)[:2] == ["ar", "sd"] and len(rows) == 12
    assert rows["ar"][1:5] == ["1.00× [1.00, 1.00]", "–", "50.0", "–"]  # GSM8K re-scored: 52.5 → 50.0
    assert rows["via_sd"][3:5] == ["15.0", "-35.0 (p 0.0013)"] and rows["via_sd"][2] == "0.289"
    assert rows["cascade_sd"][1].startswith("1.39× [1.33, 1.45]") and rows["cascade_sd"][4] == "+0.0 (p 1)"
    assert rows["faster_cascades"][1].endswith("†")  # decoded apart from its ar cell: marked
    src = json.loads((tmp_path / "table2.sources.json").read_text())
    assert src["scale"] == "cpu-large" and len(src["runs"]) == 24 and set(src["baselines"].values()) == {
        runs[0]["run_id"], runs[12]["run_id"]}
    tex = (tmp_path / "table2.tex").read_text()
    assert r"\multicolumn{4}{c}{Reasoning: GSM8K}" in tex and r"\multicolumn{4}{c}{QA: NQ-open}" in tex
    assert [p.rsplit("/", 1)[1] for p in paths] == ["table2.md", "table2.tex"]


def test_committed_table2_is_the_verdicts_runs():
    src = json.loads((FIGURES / "table2.sources.json").read_text())
    verdict = set()
    for task in ("xsum", "wmt14_deen", "gsm8k", "nq_open", "humaneval", "mbpp"):
        verdict |= set(json.loads((FIGURES / f"verdict_{task}.sources.json").read_text())["runs"])
    assert set(src["runs"]) == verdict and len(verdict) == 72 and not src["missing"]
    md = (FIGURES / "table2.md").read_text()
    assert "Table 2 — main results (cpu-large scale)" in md and "GSM8K speedup [95% CI]" in md
    readme = (PROJECT_ROOT / "README.md").read_text()
    assert "paper_figures/cpu-large/table2.md" in readme
