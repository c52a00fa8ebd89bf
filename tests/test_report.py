"""Reports: speedups against the matched ar run only, repeats as mean ± CI, one folder per scale.

The grids run through ``python -m experiments.run`` on the built-in prompts (``task=prompts``
replaces the exp's task axis, ``method=ar,sd`` its method axis), so these tests need no offline data.
"""

from __future__ import annotations

import json
import re

import pytest
from hydra import compose, initialize_config_dir

from experiments import report as report_cli
from tests.helpers.app import run_app
from viasd.harness.runner import run
from viasd.paths import PROJECT_ROOT
from viasd.report.build import build_all, mean_ci
from viasd.tracking.store import RunStore

BASE = ["+exp=table2", "scale=smoke", "task=prompts"]


def _grid(runs_dir, *extra: str, methods: str = "ar,sd") -> None:
    r = run_app(*BASE, f"method={methods}", *extra, runs=runs_dir)
    assert r.returncode == 0, r.stderr[-3000:]


def _table(tmp_path, store, *extra: str) -> tuple[str, dict]:
    res = build_all(tmp_path / "pf", store, "smoke", ["table2"], ["task=prompts", "method=sd", *extra])
    md = (tmp_path / "pf" / "smoke" / "table2.md").read_text()
    assert res["table2"][0].endswith("smoke/table2.md")
    return md, json.loads((tmp_path / "pf" / "smoke" / "table2.sources.json").read_text())


def test_unrelated_ar_run_leaves_the_table_unchanged(runs_dir, tmp_path):
    _grid(runs_dir)
    store = RunStore(runs_dir)
    before, src = _table(tmp_path, store)
    (sd_run, ar_run), = src["baselines"].items()
    assert "__ar__" in ar_run and "__sd__" in sd_run and ar_run in before and not src["missing_ar"]
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        run(compose(config_name="config", overrides=["pair=tiny-llama", "method=ar", "task=prompts",
                                                     "task.n_examples=1", "generation.max_new_tokens=13"]))
    after, src2 = _table(tmp_path, store)
    assert after == before and src2 == src


def test_missing_ar_names_the_command_and_run_missing_ar_creates_it(runs_dir, tmp_path):
    _grid(runs_dir, methods="sd")
    store = RunStore(runs_dir)
    md, src = _table(tmp_path, store)
    assert src["missing_ar"] == ["python -m experiments.run method=ar task=prompts seed=0 pair=tiny-llama "
                                 "task.n_examples=2 generation.max_new_tokens=8"]
    assert src["missing_ar"][0] in md and re.search(r"\|\s+–\s+\|", md)
    assert report_cli.main(["--scale", "smoke", "--only", "table2", "--out", str(tmp_path / "pf"),
                            "--runs", str(runs_dir), "--override", "task=prompts", "method=sd",
                            "--run-missing-ar"]) == 0
    md, src = _table(tmp_path, store)
    assert not src["missing_ar"] and all(src["baselines"].values())


def test_smoke_report_cannot_overwrite_another_scales_files(runs_dir, tmp_path):
    _grid(runs_dir)
    local = tmp_path / "pf" / "local"
    local.mkdir(parents=True)
    (local / "table2.md").write_text("committed local-scale table\n")
    md, _ = _table(tmp_path, RunStore(runs_dir))
    assert (local / "table2.md").read_text() == "committed local-scale table\n"
    assert md.startswith("# Table 2 — main results (smoke scale)")
    assert {p.name for p in (tmp_path / "pf").iterdir()} == {"local", "smoke"}


def test_seeds_are_repeats_reported_as_mean_and_ci(runs_dir, tmp_path):
    _grid(runs_dir, "seed=0,1")
    md, src = _table(tmp_path, RunStore(runs_dir), "seed=0,1")
    assert len(src["runs"]) == 2 and len(set(src["baselines"].values())) == 2  # each seed against its own ar
    row = next(line for line in md.splitlines() if line.startswith("| tiny-llama"))
    assert " ± " in row and "2" in [c.strip() for c in row.split("|")] and "mean ± 95% CI over seeds" in md


def test_mean_ci_is_student_t():
    m, ci = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and ci == pytest.approx(4.303 * 1.0 / 3 ** 0.5, rel=1e-3)
    assert mean_ci([5.0]) == (5.0, 0.0)


def test_report_scales_come_from_conf_and_missing_scale_files_are_named(tmp_path):
    from viasd.report.build import scales
    from viasd.tracking.store import RunStore

    assert {"smoke", "local", "paper", "cpu-large"} <= set(scales())
    res = build_all(tmp_path / "pf", RunStore(tmp_path / "runs"), "cpu-large", ["table3"])
    assert res["table3"] == "skipped: table3 has no cpu-large scale (conf/scale/table3/cpu-large.yaml)"


def test_a_code_task_table_names_the_isolation_level(runs_dir, tmp_path, synthetic_data):
    from viasd.tasks import sandbox

    if sandbox._isolation()[0] is None:
        pytest.skip(f"code sandbox unavailable here ({sandbox._isolation()[1]})")
    code = ["task=humaneval", "task.n_examples=2", "generation.max_new_tokens=4"]
    r = run_app("+exp=table2", "scale=smoke", "method=ar,sd", *code, runs=runs_dir, data=synthetic_data)
    assert r.returncode == 0, r.stderr[-3000:]
    build_all(tmp_path / "pf", RunStore(runs_dir), "smoke", ["table2"], [*code, "method=ar,sd"])
    header, *rows = [ln for ln in (tmp_path / "pf" / "smoke" / "table2.md").read_text().splitlines()
                     if ln.startswith("| ") and not ln.startswith("|:")]
    assert header.split("|")[-2].strip() == "code isolation"
    assert rows and all(row.split("|")[-2].strip() == sandbox.isolation_level() for row in rows), rows
