"""``hydra/launcher=viasd_slurm`` end to end (issue 62 item 2): ``python -m experiments.run -m …``
composes every cell, sizes it and submits one job array per size through ``sbatch`` — here a
stand-in ``sbatch`` on PATH that records each submitted script, prints ``Submitted batch job N`` and
leaves a result for every task of the array (the jobs themselves run nothing). The dry run's SLURM
sizes come from the same knob (``hydra.launcher.gpu_gib``), a job never spans more than one node
(``hydra.launcher.node_gpus``), and a bad ``VIASD_DRYRUN_GPUS`` is one line naming it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import viasd.harness.dryrun as dr
from viasd.errors import ConfigError
from viasd.harness.grid import compose_cells
from viasd.paths import PROJECT_ROOT

needs_submitit = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import hydra_plugins.hydra_submitit_launcher"],
                   capture_output=True).returncode != 0,
    reason="hydra-submitit-launcher (the [slurm] extra) is not installed")

SBATCH = '''
import pickle, re, sys
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus

record = Path(sys.argv[0]).parent / "submitted"
record.mkdir(exist_ok=True)
script = Path(sys.argv[-1]).read_text()
n = 1000 + len(list(record.glob("*.sh")))
(record / f"{n}.sh").write_text(script)
array = re.search(r"^#SBATCH --array=0-(\\d+)", script, re.M)
out = re.search(r"^#SBATCH --output=(.*)$", script, re.M).group(1)
for i in range(int(array.group(1)) + 1 if array else 1):  # what a finished job leaves: its result
    job = f"{n}_{i}" if array else str(n)
    folder = Path(out.replace("%A_%a", job).replace("%j", job)).parent
    folder.mkdir(parents=True, exist_ok=True)
    ret = JobReturn(overrides=[], status=JobStatus.COMPLETED)
    ret.return_value = {"failed": f"stand-in job {job} ran nothing"}
    with open(folder / f"{job}_0_result.pkl", "wb") as f:
        pickle.dump(("success", ret), f)
print(f"Submitted batch job {n}")
'''


def _fake_slurm(bin_dir: Path) -> Path:
    bin_dir.mkdir()
    (bin_dir / "sbatch.py").write_text(SBATCH)
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$(dirname "$0")/sbatch.py" "$@"\n')
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")  # submitit looks for srun before it submits
    for name in ("sbatch", "srun"):
        (bin_dir / name).chmod(0o755)
    return bin_dir / "submitted"


def _launch(tmp_path, *args):
    bin_dir = tmp_path / "bin"
    submitted = _fake_slurm(bin_dir)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "VIASD_RUNS_DIR": str(tmp_path / "runs"),
           "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("VIASD_DRYRUN_GPUS", None)
    p = subprocess.run([sys.executable, "-m", "experiments.run", "-m", *args, "hydra/launcher=viasd_slurm",
                        f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=PROJECT_ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    return p, submitted


def _sbatch(script: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", script, re.M))


@needs_submitit
def test_a_sized_sweep_submits_one_array_per_size_with_its_resources(tmp_path):
    """The paper pairs (sized from pinned parameter counts, nothing downloaded): gemma2-2b-9b on one
    80 GiB GPU, llama2-7b-70b on three for three times the time; each array holds its pair's cells."""
    import submitit

    p, submitted = _launch(tmp_path, "pair=gemma2-2b-9b,llama2-7b-70b", "method=ar,sd", "task=prompts")
    assert "Traceback" not in p.stderr and "MissingMandatoryValue" not in p.stderr, p.stderr[-3000:]
    scripts = sorted(submitted.glob("*.sh"))
    assert len(scripts) == 2, p.stderr[-3000:]
    heads = [_sbatch(s.read_text()) for s in scripts]
    assert [{k: h[k] for k in ("array", "gpus-per-node", "mem", "time", "nodes")} for h in heads] == [
        {"array": "0-1%2", "gpus-per-node": "1", "mem": "27GB", "time": "240", "nodes": "1"},
        {"array": "0-1%2", "gpus-per-node": "3", "mem": "170GB", "time": "720", "nodes": "1"}]
    cells = {}
    for n, script in zip((1000, 1001), scripts):
        for i in range(2):
            job = submitit.helpers.DelayedSubmission.load(tmp_path / "sweep" / ".submitit" / f"{n}_{i}" /
                                                          f"{n}_{i}_submitted.pkl")
            overrides = job.args[0]
            cells[" ".join(overrides)] = _sbatch(script.read_text())["gpus-per-node"]
    assert cells == {"pair=gemma2-2b-9b method=ar task=prompts": "1", "pair=gemma2-2b-9b method=sd task=prompts": "1",
                     "pair=llama2-7b-70b method=ar task=prompts": "3", "pair=llama2-7b-70b method=sd task=prompts": "3"}
    # the stand-in jobs ran nothing: the grid says so from the run store, in one line, exit 1
    assert p.returncode == 1 and "exp sweep: 4 of 4 runs failed" in p.stderr


@needs_submitit
def test_a_cell_no_node_holds_is_refused_before_anything_is_submitted(tmp_path, capsys):
    """Every cell is sized before the first array is submitted: one that needs more GPUs than a node
    has is one ``error:`` line naming it (with the others that cannot be sized), exit 2, no sbatch."""
    from omegaconf import OmegaConf

    from hydra_plugins.viasd_launcher.viasd_launcher import SizedSlurmLauncher

    cells = {"pair=gemma2-2b-9b": _paper("gemma2-2b-9b"), "pair=llama2-7b-70b": _paper("llama2-7b-70b")}

    class Launcher(SizedSlurmLauncher):  # the sweep config of a cell without Hydra's config loader
        def executor(self, size):
            pytest.fail("something was submitted")

    launcher = Launcher(submitit_folder=str(tmp_path), timeout_min=240, node_gpus=2)
    launcher.hydra_context = type("Ctx", (), {"config_loader": type("Loader", (), {
        "load_sweep_config": staticmethod(lambda config, overrides: cells[overrides[0]].copy())})()})()
    launcher.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    with pytest.raises(SystemExit) as e:
        launcher.launch([["pair=gemma2-2b-9b"], ["pair=llama2-7b-70b"]], 0)
    err = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and err == [
        "error: 1 of 2 cells cannot be submitted, nothing was: llama2-7b-70b/ar/prompts: needs ~169 GiB: 3 GPUs of "
        "80 GiB, more than a node's 2 (hydra.launcher.node_gpus); size for larger GPUs (hydra.launcher.gpu_gib) or "
        "larger nodes"]
    assert not (tmp_path / "sweep").exists()
    launcher.node_gpus = 0
    with pytest.raises(SystemExit):
        launcher.launch([["pair=gemma2-2b-9b"]], 0)
    assert "hydra.launcher.node_gpus=0" in capsys.readouterr().err


_CELLS: dict = {}


def _paper(pair):
    """One paper-scale cell of ``pair`` (composed once per module)."""
    if pair not in _CELLS:
        _CELLS[pair] = compose_cells(["pair=" + pair, "method=ar", "task=prompts"])[0]
    return _CELLS[pair].copy()


@pytest.fixture
def _hub_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VIASD_RUNS_DIR", str(tmp_path / "runs"))
    dr.hub_reachable.cache_clear()
    yield
    dr.hub_reachable.cache_clear()


def test_the_dry_run_sizes_slurm_jobs_with_the_launchers_knob(_hub_offline, monkeypatch, capsys):
    """On one visible 24 GiB GPU the dry run's SLURM line is the launcher's (3 x 80 GiB), not 8 x 24."""
    monkeypatch.setenv("VIASD_DRYRUN_GPUS", "24")
    cell = _paper("llama2-7b-70b")
    dr.dry_run([cell], "one")
    out = capsys.readouterr().out
    assert "SLURM on 80 GiB GPUs (hydra.launcher.gpu_gib): hydra.launcher.gpus_per_node=3 hydra.launcher.mem_gb=170" \
           in out
    assert dr.cell_job(cell, *dr.slurm_node({}))["gpus_per_node"] == 3
    dr.dry_run([cell], "one", launcher={"gpu_gib": 141, "node_gpus": 8})
    assert "SLURM on 141 GiB GPUs (hydra.launcher.gpu_gib): hydra.launcher.gpus_per_node=2" in capsys.readouterr().out


def test_a_job_never_spans_more_than_a_node(_hub_offline, capsys):
    cell = _paper("llama2-7b-70b")
    plans = dr.dry_run([cell], "one", launcher={"gpu_gib": 1, "node_gpus": 8})
    out = capsys.readouterr().out
    assert plans[0].oversize and "[NO NODE HOLDS IT]" in out and "1 need more than a SLURM node" in out
    assert "NO NODE HOLDS IT: needs ~169 GiB: 170 GPUs of 1 GiB, more than a node's 8 (hydra.launcher.node_gpus)" in out
    assert "170 GPUs per node" not in out and "gpus_per_node=170" not in out
    with pytest.raises(ConfigError, match=r"^llama2-7b-70b/.*: needs ~169 GiB: 170 GPUs of 1 GiB, more than a node's 8"):
        dr.cell_job(cell, 1, 240, 8)
    assert dr.cell_job(cell, 1, 240, 256)["gpus_per_node"] == 170  # a node that large holds it


@pytest.mark.parametrize("knob,value", [("gpu_gib", 0), ("gpu_gib", "abc"), ("gpu_gib", float("nan")),
                                        ("node_gpus", 0), ("node_gpus", 2.5)])
def test_a_bad_launcher_knob_is_one_line_naming_it(knob, value):
    with pytest.raises(ConfigError, match=rf"^hydra.launcher.{knob}=") as e:
        dr.slurm_node({knob: value})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["abc", "1e-9x", "-1", "0", "nan", "inf", "80,", ","])
def test_a_bad_dryrun_gpus_value_is_one_line_naming_the_variable(value, monkeypatch):
    monkeypatch.setenv("VIASD_DRYRUN_GPUS", value)
    if value == "80,":  # a trailing comma is fine
        assert dr.visible_gpus_gib() == [80.0]
        return
    with pytest.raises(ConfigError, match=r"^VIASD_DRYRUN_GPUS=.* is not a list of GPU sizes") as e:
        dr.visible_gpus_gib()
    assert "\n" not in str(e.value)


def test_the_launcher_config_comment_says_what_the_plan_needs():
    text = (PROJECT_ROOT / "conf" / "hydra" / "launcher" / "viasd_slurm.yaml").read_text()
    need = dr.job_resources(dr.plan_cell(_paper("llama2-7b-70b")).need_gib, 80)["gpus_per_node"]
    assert f"llama2-7b-70b (~169 GiB) on {need} x 80 GiB GPUs" in text
