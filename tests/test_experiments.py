"""Exp grids are Hydra multiruns: every exp composes at every scale, runs at smoke scale through
``python -m experiments.run`` and is found by the report; resume, dry run, command-line
overrides, the SLURM launcher and the one-line missing-data error behave as documented."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.app import run_app
from viasd.config import PairConfig, to_dataclass
from viasd.harness.grid import compose_cells, exp_cells, exp_names
from viasd.harness.runner import identity
from viasd.methods.api import method_config
from viasd.paths import PROJECT_ROOT
from viasd.report.build import build_all, collect
from viasd.tracking.store import RunStore, run_id_for

EXPS = exp_names()
SCALES = ("smoke", "local", "paper")


def _ids(cells) -> set[str]:
    return {run_id_for(identity(c)) for c in cells}


def test_all_expected_exps_exist():
    assert set(EXPS) >= {"table1", "table2", "table3", "table4", "table5", "fig_kl", "fig_tiers", "fig_thresholds",
                         "fig_gamma", "fig_keep_ratio", "fig_dimr", "fig_gap"}
    assert all((PROJECT_ROOT / "conf" / "scale" / e / f"{s}.yaml").is_file() for e in EXPS for s in SCALES)


@pytest.mark.parametrize("exp", EXPS)
@pytest.mark.parametrize("scale", SCALES)
def test_exp_composes_and_instantiates(exp, scale):
    cells = exp_cells([f"+exp={exp}", f"scale={scale}"])
    assert cells, exp
    for job, cfg in cells:
        assert cfg.exp.name == exp and cfg.exp.scale == scale and f"scale={scale}" in job
        to_dataclass(PairConfig, cfg.pair)
        if cfg.exp.entry == "run":
            method_config(cfg.method.name, cfg.method)
    assert len(_ids(c for _, c in cells)) == len(cells), "two cells share a run id"


def test_paper_pairs_are_a_sweep_dimension():
    cells = compose_cells(["+exp=table2", "scale=paper"])
    assert len(cells) == 75 and {c.pair.name for c in cells} == {"gemma2-2b-9b", "llama2-7b-70b", "qwen2.5-0.5b-7b"}
    assert {c.task.source for c in cells} == {"hub"} and {c.task.n_examples for c in cells} == {None}


def test_slurm_launcher_composes_with_an_exp():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the launcher config extends the plugin's")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+exp=table2", "scale=paper", "hydra/launcher=viasd_slurm"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SizedSlurmLauncher") and cfg.hydra.launcher.size_per_cell
    assert cfg.hydra.mode.name == "MULTIRUN" and cfg.hydra.sweeper.params.pair.count(",") == 2
    assert len(compose_cells(["+exp=table2", "scale=paper", "hydra/launcher=viasd_slurm"])) == 75


@pytest.mark.parametrize("exp", EXPS)
def test_exp_smoke_runs_and_reports(exp, tmp_path, synthetic_data_dir, monkeypatch):
    runs = tmp_path / "runs"
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VIASD_DATA_DIR", str(synthetic_data_dir))
    monkeypatch.setenv("VIASD_RUNS_DIR", str(runs))
    r = run_app(f"+exp={exp}", "scale=smoke", runs=runs, data=synthetic_data_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    cells = compose_cells([f"+exp={exp}", "scale=smoke"])
    store = RunStore(runs)
    assert {r["run_id"] for r in store.finished_runs()} == _ids(cells)
    assert f"[viasd] exp {exp}: {len(cells)} runs" in r.stdout and f"all {len(cells)} runs finished" in r.stdout
    found, missing = collect(exp, "smoke", store)
    assert not missing and len(found) == len(cells)
    res = build_all(tmp_path / "pf", store, "smoke", [exp])
    assert not isinstance(res[exp], str), res[exp]
    assert all(Path(p).is_file() for p in res[exp])
    if exp.startswith("table") or exp in ("fig_kl", "fig_thresholds", "fig_tiers", "fig_keep_ratio"):
        assert any(p.endswith(".md") for p in res[exp]), "the numbers behind a figure are also a table"


def test_killed_grid_resumes_without_redoing_or_losing_runs(tmp_path, synthetic_data_dir):
    runs = tmp_path / "runs"
    env = {**os.environ, "VIASD_RUNS_DIR": str(runs), "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
           "VIASD_DATA_DIR": str(synthetic_data_dir)}
    cmd = [sys.executable, "-m", "experiments.run", "+exp=fig_gamma", "scale=smoke", "generation.max_new_tokens=24"]
    proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and len(list(runs.glob("*/summary.json"))) < 1:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = {p.parent.name: p.stat().st_mtime_ns for p in runs.glob("*/summary.json")}
    assert 1 <= len(first) < 4, "kill should land midway"
    again = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, check=True, capture_output=True, text=True, timeout=300)
    after = {p.parent.name: p.stat().st_mtime_ns for p in runs.glob("*/summary.json")}
    assert len(after) == 4 and len({d.name for d in runs.iterdir() if d.is_dir()}) == 4
    assert all(after[k] == v for k, v in first.items()), "finished runs were redone"
    assert again.stdout.count("already finished") == len(first)
    for d in runs.iterdir():
        lines = (d / "examples.jsonl").read_text().splitlines()
        assert len(lines) == json.loads((d / "summary.json").read_text())["n_examples"]


def test_dry_run_plans_every_cell_and_runs_nothing(tmp_path):
    runs = tmp_path / "runs"
    r = run_app("+exp=table3", "exp.scale=smoke", "dry_run=true", runs=runs)  # the old spelling of scale=smoke
    assert r.returncode == 0, r.stderr[-3000:]
    assert "dry run of table3: 4 runs" in r.stdout and "(4/4) run tiny-t5/via_sd/wmt14_deen" in r.stdout
    assert "4 to run, 0 finished" in r.stdout and "nothing was downloaded" in r.stdout
    assert not runs.exists() and not (tmp_path / "multirun").exists()


def test_command_line_value_of_a_swept_key_wins(tmp_path, synthetic_data_dir):
    runs = tmp_path / "runs"
    r = run_app("+exp=table3", "scale=smoke", "method=ar,sd", "generation.max_new_tokens=3", runs=runs,
                data=synthetic_data_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "command line sets generation.max_new_tokens; the exp's values for it are not used" in r.stdout
    assert "[viasd] exp table3: 2 runs" in r.stdout
    done = list(RunStore(runs).finished_runs())
    assert sorted(d["summary"]["method"] for d in done) == ["ar", "sd"]
    assert all(OmegaConf.create(d["config"]).generation.max_new_tokens == 3 for d in done)
    plan = run_app("+exp=table3", "scale=smoke", "method=ar,sd", "generation.max_new_tokens=3", "dry_run=true",
                   runs=runs, data=synthetic_data_dir)
    assert "0 to run, 2 finished" in plan.stdout, plan.stdout[-2000:]  # dry_run=true is not part of a run's id


def test_wandb_online_without_credentials_degrades_with_one_warning(runs_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    from hydra import compose, initialize_config_dir

    from viasd.harness.runner import run

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["pair=tiny-llama", "tracking=wandb", "generation.max_new_tokens=4",
                                                       "task.n_examples=1"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = run(cfg)
    msgs = [str(w.message) for w in caught if "W&B" in str(w.message)]
    assert len(msgs) == 1 and "offline" in msgs[0]
    assert summary["n_examples"] == 1
    assert RunStore(runs_dir).is_finished(summary["run_id"])
    assert OmegaConf.select(cfg, "tracking.wandb.mode") == "online"


def test_grid_with_missing_data_stops_before_the_first_cell_with_one_line(tmp_path):
    r = run_app("+exp=table2", "scale=smoke", runs=tmp_path / "runs", data=tmp_path / "no-data", timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and "VIASD_DATA_DIR" in errors[0], r.stderr
    assert "(1/" not in r.stdout and not (tmp_path / "runs").exists() and not (tmp_path / "multirun").exists()
