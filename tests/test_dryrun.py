"""The dry run: every exp at every scale plans without downloads; inconsistencies stop with one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

import viasd.harness.dryrun as dr
from viasd.errors import ConfigError
from viasd.harness.grid import compose_cells, exp_names
from viasd.harness.runner import identity
from viasd.paths import PROJECT_ROOT
from viasd.tracking.store import run_id_for

SCALES = ("smoke", "local", "paper")
CPU_LARGE = sorted(p.parent.name for p in (PROJECT_ROOT / "conf" / "scale").glob("*/cpu-large.yaml"))


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("VIASD_DRYRUN_GPUS", raising=False)
    monkeypatch.setenv("VIASD_RUNS_DIR", str(tmp_path / "runs"))
    probe = dr.hub_reachable
    probe.cache_clear()
    yield
    probe.cache_clear()


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("exp", exp_names())
def test_dry_run_every_exp_every_scale(exp, scale, capsys):
    cells = compose_cells([f"+exp={exp}", f"scale={scale}", "dry_run=true"])
    plans = dr.dry_run(cells, exp)
    out = capsys.readouterr().out
    assert len(plans) == len(cells) > 0
    assert f"{len(cells)} runs" in out and "nothing was downloaded" in out
    for p in plans:
        assert p.models and all(m["params"] >= 0 and m["revision"] for m in p.models)
        assert p.need_gib > 0 and p.data
    if scale == "paper":
        for cfg, p in zip(cells, plans):
            pair = OmegaConf.to_container(cfg.pair, resolve=True)
            assert all(m["revision"] != "main" for m in p.models), "paper models must be pinned"
            assert all(m["dtype"] == pair["dtype"] for m in p.models)  # search runs in the pair's dtype
            if OmegaConf.select(cfg, "method.slim.mask") == "auto":  # no paper pair ships a mask
                assert p.mask.startswith(f"search to run: python -m experiments.run +exp=table1 scale=paper "
                                         f"pair={cfg.pair.name} search.keep_ratio=")
            if p.entry == "run":
                assert cfg.task.source == "hub" and "hub " in p.data[0]
            else:
                assert int(cfg.search.n_calibration) >= 256 and "builtin" not in list(cfg.search.calibration)


_CELLS: list = []


def _paper_cell(pair="llama2-7b-70b"):
    if not _CELLS:
        _CELLS.extend(compose_cells(["+exp=fig_tiers", "scale=paper"]))
    return next(c for c in _CELLS if c.pair.name == pair).copy()


def test_memory_that_cannot_fit_is_one_line(monkeypatch):
    monkeypatch.setenv("VIASD_DRYRUN_GPUS", "80")
    plan = dr.plan_cell(_paper_cell())  # marked, not raised: the rest of the grid is still planned
    assert plan.misfit and "\n" not in plan.misfit
    assert re.search(r"needs ~169 GiB .* fits only 1 GPU\(s\), 80 GiB", plan.misfit)
    monkeypatch.setenv("VIASD_DRYRUN_GPUS", "80,80,80")
    plan = dr.plan_cell(_paper_cell())
    assert plan.need_gib < 240 and plan.misfit is None


def test_dry_run_plans_every_cell_and_summarises_per_pair(monkeypatch, capsys):
    """A cell that does not fit is marked with its memory; the others are planned; strict fails after."""
    monkeypatch.setenv("VIASD_DRYRUN_GPUS", "30")
    cells = [_paper_cell("llama2-7b-70b"), _paper_cell("gemma2-2b-9b"), _paper_cell("llama2-7b-70b")]
    plans = dr.dry_run(cells, "three")
    out = capsys.readouterr().out
    assert [p.misfit is None for p in plans] == [False, True, False]
    assert "(1/3) run llama2-7b-70b/" in out and "[DOES NOT FIT: needs ~169.2 GiB]" in out
    assert "(3/3) run llama2-7b-70b/" in out and "(2/3) run gemma2-2b-9b/" in out
    assert "[viasd] pair llama2-7b-70b: DOES NOT FIT (2/2 cells); largest cell ~169.2 GiB" in out
    assert "[viasd] pair gemma2-2b-9b: fits (1 cells); largest cell ~26.5 GiB" in out
    assert "1 fit, 2 do not fit the visible GPUs" in out
    # the SLURM job is the launcher's (hydra.launcher.gpu_gib, 80 GiB), not one sized for the visible GPUs
    assert "llama2-7b-70b: DOES NOT FIT (2/2 cells); largest cell ~169.2 GiB; SLURM on 80 GiB GPUs " \
           "(hydra.launcher.gpu_gib): hydra.launcher.gpus_per_node=3 hydra.launcher.mem_gb=170" in out
    with pytest.raises(ConfigError, match=r"^2/3 cells do not fit the visible GPUs \(dry_run_strict=true\); "
                                          r"first: llama2-7b-70b/.*needs ~169 GiB"):
        dr.dry_run(cells, "three", strict=True)


def test_job_resources_follow_the_pair_size():
    """SLURM jobs sized per pair: the 70B pair needs three 80 GiB GPUs (two 141 GB ones), gemma2 one."""
    assert dr.job_resources(169.2) == {"gpus_per_node": 3, "mem_gb": 170}
    assert dr.job_resources(169.2, 140) == {"gpus_per_node": 2, "mem_gb": 170}
    assert dr.job_resources(26.5) == {"gpus_per_node": 1, "mem_gb": 27}
    assert dr.job_resources(5.0) == {"gpus_per_node": 1, "mem_gb": 16}
    with pytest.raises(ConfigError, match="hydra.launcher.gpu_gib"):
        dr.job_resources(5.0, 0)


def test_gated_model_without_token_when_hub_is_reachable(monkeypatch):
    monkeypatch.setattr(dr, "hub_reachable", lambda: True)
    monkeypatch.setattr(dr, "hf_token", lambda: None)
    with pytest.raises(ConfigError, match="gated model.*huggingface-cli login"):
        dr.plan_cell(_paper_cell(pair="gemma2-2b-9b"))
    monkeypatch.setattr(dr, "hf_token", lambda: "hf_x")
    assert dr.plan_cell(_paper_cell(pair="gemma2-2b-9b")).models[0]["gated"]


def test_unknown_model_and_short_calibration_are_one_line():
    cell = _paper_cell(pair="gemma2-2b-9b")
    cell.pair.target.id = "nobody/no-such-model"
    with pytest.raises(ConfigError, match="no parameter count for model 'nobody/no-such-model'"):
        dr.plan_cell(cell)
    search = compose_cells(["+exp=table1", "scale=smoke"])[0]
    search.search.calibration, search.search.n_calibration = ["builtin"], 50
    with pytest.raises(ConfigError, match="yields 7 texts < search.n_calibration=50"):
        dr.plan_cell(search)


def test_cli_dry_run_exit_codes(tmp_path):
    """On 24 GiB every cell is planned and the run exits 0; dry_run_strict=true makes a misfit exit 2."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VIASD_RUNS_DIR": str(tmp_path), "VIASD_DRYRUN_GPUS": "24"}
    cmd = [sys.executable, "-m", "experiments.run", "+exp=fig_tiers", "scale=paper", "dry_run=true",
           f"hydra.run.dir={tmp_path}/h"]
    p = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "dry run of fig_tiers: 10 runs; visible GPUs: 24 GiB" in p.stdout
    assert "(10/10) " in p.stdout and "[viasd] pair gemma2-2b-9b: DOES NOT FIT" in p.stdout
    p = subprocess.run(cmd + ["dry_run_strict=true"], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 2, p.stderr[-2000:]
    err = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and "cells do not fit the visible GPUs" in err[0]
    assert "(10/10) " in p.stdout  # the whole plan is printed before the strict verdict


def test_cpu_large_plan_counts_the_gguf_models_without_loading_them(monkeypatch, capsys):
    """The Qwen pair's plan comes from pinned counts (untied GGUF heads), never from loading 9 GB."""
    monkeypatch.setattr(dr, "built_params", lambda *a, **k: pytest.fail("the dry run loaded the pair"))
    # table2 at cpu-large is the verdict's interleaved group: one cell per variant; the first via_sd is the default.
    cell = next(c for c in compose_cells(["+exp=table2", "scale=cpu-large", "task=humaneval"])
                if c.method.name == "via_sd")
    plan = dr.plan_cell(cell)
    params = {m["role"]: m["params"] for m in plan.models}
    assert params == {"draft": 630_167_424, "target": 1_777_088_000}
    assert 10 < sum(m["gib"] for m in plan.models) * 1.2 < 11.5


@pytest.mark.parametrize("exp", CPU_LARGE)
def test_every_cpu_large_grid_plans_on_the_qwen_pair(exp, monkeypatch, capsys):
    """Each cpu-large grid composes on the Qwen-Coder pair, names distinct runs, and every cell fits
    beside a second one in 24 GiB: table4's independent verifier is the 0.5B draft, counted once."""
    monkeypatch.setattr(dr, "built_params", lambda *a, **k: pytest.fail("the dry run loaded the pair"))
    cells = compose_cells([f"+exp={exp}", "scale=cpu-large", "dry_run=true"])
    plans = dr.dry_run(cells, exp)
    assert {c.pair.name for c in cells} == {"qwen2.5-coder-0.5b-1.5b"}
    assert len({run_id_for(identity(c)) for c in cells}) == len(cells)
    assert 0 < max(p.need_gib for p in plans) < 11.5
    for p in plans:
        shared = [m for m in p.models if m["role"] == "intermediate"]
        assert all(m["gib"] == 0 and "draft" in m["id"] for m in shared)
    if exp == "table4":
        assert all(any(m["role"] == "intermediate" for m in p.models) for p in plans)
