"""``python -m experiments.live_check`` (viasd/report/live_check.py): the command that decodes chosen rows of a
replayed frontier interleaved with ``ar``, and the predicted-vs-measured table once those cells are decoded. On a
tiny traced ``ar`` run with a synthetic cost file."""

from __future__ import annotations

import json
import shlex

import pytest
from hydra import initialize_config_dir

from experiments import live_check as live_cmd
from experiments import replay as replay_cmd
from experiments import trace as trace_cmd
from tests.test_cost import _run, synthetic
from tests.test_interleave import _group
from viasd.analysis.cost import COST, CostModel, cost_name
from viasd.harness.interleave import run_interleaved
from viasd.paths import PROJECT_ROOT
from viasd.report.frontier_cost import compared_problem


def test_live_check_prints_the_interleaved_command_then_predicted_vs_measured(runs_dir, tmp_path, capsys):
    ar = _run("method=ar")
    meta = json.loads((runs_dir / ar["run_id"] / "meta.json").read_text())
    CostModel(synthetic()).save(runs_dir / COST / cost_name("tiny-llama", meta["runtime"], meta["threads"]))
    assert trace_cmd.main([f"run={ar['run_id']}"]) == 0
    frontier = tmp_path / "pf" / "smoke" / "frontier_t"
    assert replay_cmd.main([f"run={ar['run_id']}", "method=ar,sd,sd_ngram", f"out={frontier}.rows.json",
                            f"report={frontier}", "scale=smoke"]) == 0
    rows = json.loads(frontier.with_name("frontier_t.rows.json").read_text())
    capsys.readouterr()
    assert live_cmd.main([str(frontier), "1", "2", "--n", "2", "--results", "none"]) == 0
    out = capsys.readouterr().out
    (line,) = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("python -m experiments.run")]
    overrides = shlex.split(line)[3:]
    assert overrides[:5] == ["+exp=verdict", "scale=smoke", "pair=tiny-llama", "task=prompts", "task.n_examples=2"]
    assert overrides[-1] == '+exp.variants={ar:["method=ar"],p1:["method=sd"],p2:["method=sd_ngram"]}'
    assert out.count("not decoded yet") == 2 and f"| {rows[1]['predicted_speedup']:.2f}× (2)" in out
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        job, cfg = _group(overrides)
        run_interleaved(cfg, job)  # what the printed command decodes
    capsys.readouterr()
    assert live_cmd.main([str(frontier), "1", "2", "--n", "2", "--results", "none"]) == 0
    table = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(("| p1 ", "| p2 "))]
    cells = [[c.strip() for c in ln.split("|")[1:-1]] for ln in table]
    assert len(cells) == 2 and all("not decoded yet" not in c[5] and c[3].endswith("×") for c in cells)
    assert all(c[-2].endswith("%") and c[-1].endswith("%") for c in cells)  # frontier and replay vs CPU time
    assert cells[0][3] == f"{rows[1]['predicted_speedup']:.2f}×"  # the live problems are the traced run's two
    # --out commits the table: its sources name the cells, the cost file and the frontier rows by hash
    out = tmp_path / "pf" / "smoke" / "live_t"
    assert live_cmd.main([str(frontier), "1", "2", "--n", "2", "--results", "none", "--out", str(out)]) == 0
    src = json.loads(out.with_name("live_t.sources.json").read_text())
    assert len(src["runs"]) == 3 and set(src["frontier"]["points"]) == {"p1", "p2"} and all(src["costs"].values())
    assert "| p1 " in out.with_name("live_t.md").read_text()
    assert compared_problem(out, src, tmp_path) is None
    frontier.with_name("frontier_t.rows.json").write_text("[]")  # the quoted frontier re-replayed since: stale
    reason, fix = compared_problem(out, src, tmp_path)
    assert "changed since" in reason and "live_check" in fix and "1 2 --out" in fix


def test_a_row_that_is_not_a_decodable_policy_or_a_frontier_without_rows_is_one_error_line(tmp_path, capsys):
    (tmp_path / "f.sources.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        live_cmd.main([str(tmp_path / "f"), "0"])
    assert e.value.code == 2 and "f.rows.json not found: a live check reads a frontier's rows" in capsys.readouterr().err
    (tmp_path / "f.rows.json").write_text(json.dumps([{"method": "ar", "overrides": ["method=ar"]},
                                                      {"method": "via_sd oracle", "overrides": []}]))
    for row, why in (("0", "is ar itself"), ("1", "no policy experiments.run composes"), ("5", "rows 0–1")):
        with pytest.raises(SystemExit) as e:
            live_cmd.main([str(tmp_path / "f"), row])
        assert e.value.code == 2 and why in capsys.readouterr().err
