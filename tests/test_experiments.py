"""Exp grids compose, smoke-run on tiny pairs, resume after a kill; reports come from the store."""

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

from viasd.config import PairConfig, to_dataclass
from viasd.harness.grid import cell_overrides, compose_cells, exp_names, run_exp, sweep_command
from viasd.methods.api import method_config
from viasd.paths import PROJECT_ROOT
from viasd.tracking.store import RunStore

EXPS = exp_names()


def test_all_expected_exps_exist():
    assert set(EXPS) >= {"table1", "table2", "table3", "table4", "table5", "fig_kl", "fig_tiers", "fig_thresholds",
                         "fig_gamma", "fig_keep_ratio", "fig_dimr", "fig_gap"}


@pytest.mark.parametrize("exp", EXPS)
@pytest.mark.parametrize("scale", ["local", "paper", "smoke"])
def test_exp_composes_and_instantiates(exp, scale):
    cells = compose_cells([], exp_name=exp, scale=scale)
    assert cells, exp
    for cfg in cells:
        to_dataclass(PairConfig, cfg.pair)
        if cfg.exp.entry == "run":
            method_config(cfg.method.name, cfg.method)
    cmd = sweep_command(exp, scale, "viasd_slurm")
    assert cmd.startswith("python -m experiments.run -m hydra/launcher=viasd_slurm")


def test_slurm_launcher_config_composes():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=viasd_slurm"], return_hydra_config=True)
    assert "submitit" in cfg.hydra.launcher._target_.lower() and cfg.hydra.launcher.gpus_per_node == 1


def test_cell_expansion_order_and_product():
    exp = {"name": "x", "scale": "s", "grid": {"method": ["ar", "sd"], "method.gamma": [1, 2]},
           "scales": {"s": {"pair": ["tiny-llama"]}}}
    cells = cell_overrides(exp)
    assert len(cells) == 4
    assert all(c.index(next(o for o in c if o.startswith("method="))) < c.index(next(o for o in c if o.startswith("method.gamma")))
               for c in cells)


@pytest.mark.parametrize("exp", EXPS)
def test_exp_smoke_runs_and_reports(exp, runs_dir, tmp_path, monkeypatch, synthetic_data):
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path / "cache"))
    assert run_exp([f"+exp={exp}", "exp.scale=smoke"]) == 0
    store = RunStore(runs_dir)
    n = len(compose_cells([], exp_name=exp, scale="smoke"))
    assert len(list(store.finished_runs())) == n
    from viasd.report.build import build_all

    res = build_all(tmp_path / "pf", store, "smoke", [exp])
    assert not isinstance(res[exp], str), res[exp]
    assert all(Path(p).is_file() for p in res[exp])


def test_killed_grid_resumes_without_redoing_or_losing_runs(tmp_path, synthetic_data_dir):
    runs = tmp_path / "runs"
    env = {**os.environ, "VIASD_RUNS_DIR": str(runs), "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
           "VIASD_DATA_DIR": str(synthetic_data_dir)}
    cmd = [sys.executable, "-m", "experiments.run", "+exp=fig_gamma", "exp.scale=smoke", "generation.max_new_tokens=24"]
    proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and len(list(runs.glob("*/summary.json"))) < 1:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = {p.parent.name: p.stat().st_mtime_ns for p in runs.glob("*/summary.json")}
    assert 1 <= len(first) < 4, "kill should land midway"
    subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, check=True, capture_output=True, timeout=300)
    after = {p.parent.name: p.stat().st_mtime_ns for p in runs.glob("*/summary.json")}
    assert len(after) == 4 and len({d.name for d in runs.iterdir() if d.is_dir()}) == 4
    assert all(after[k] == v for k, v in first.items()), "finished runs were redone"
    for d in runs.iterdir():
        lines = (d / "examples.jsonl").read_text().splitlines()
        assert len(lines) == json.loads((d / "summary.json").read_text())["n_examples"]


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
    env = {**os.environ, "VIASD_RUNS_DIR": str(tmp_path / "runs"), "WANDB_MODE": "disabled",
           "VIASD_DATA_DIR": str(tmp_path / "no-data")}
    r = subprocess.run([sys.executable, "-m", "experiments.run", "+exp=table2", "exp.scale=smoke"], cwd=PROJECT_ROOT,
                       env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and "VIASD_DATA_DIR" in errors[0], r.stderr
    assert "(1/" not in r.stdout and not (tmp_path / "runs").exists()
