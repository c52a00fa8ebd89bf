"""Launchers report the truth (issue 29 item 1): a plain ``-m`` sweep works with the grid callback,
failed cells under any launcher are listed and exit non-zero, local cells run a bounded number at
a time, and a killed grid leaves no decode running. Launcher cases run ``submitit_local`` /
``viasd_local`` on tiny pairs (skipped where the submitit plugin is not installed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.app import run_app
from viasd.harness import launchers
from viasd.harness.grid import cell_names, exp_cells
from viasd.paths import PROJECT_ROOT
from viasd.tracking.store import RunStore

needs_submitit = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import hydra_plugins.hydra_submitit_launcher"],
                   capture_output=True).returncode != 0,
    reason="hydra-submitit-launcher (a dev dependency) is not installed")

TINY = ("pair=tiny-llama", "task=prompts", "task.n_examples=1")


def test_plain_multirun_sweep_runs_and_sums_up(tmp_path):
    runs = tmp_path / "runs"
    r = run_app("-m", *TINY, "method=ar,sd", "generation.max_new_tokens=4", runs=runs)
    assert r.returncode == 0 and "Callback" not in r.stderr, r.stderr[-3000:]
    assert "[viasd] exp sweep: 2 runs" in r.stdout and "[viasd] (2/2) tiny-llama/sd/prompts" in r.stdout
    assert "all 2 runs finished" in r.stdout and len(list(RunStore(runs).finished_runs())) == 2


@needs_submitit
def test_submitit_local_lists_failed_cells_and_exits_nonzero(tmp_path):
    """Cells run in processes of their own, whose failures the grid never sees: it reads their outcome
    from the run store. The cell asks for more tokens than tiny-llama's 16,384 positions hold next to
    its prompt (refused inside the cell, after the start-of-grid check)."""
    r = run_app("-m", *TINY, "method=ar", "generation.max_new_tokens=16383", "hydra/launcher=submitit_local",
                runs=tmp_path / "runs")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
    line = next(ln for ln in r.stderr.splitlines() if "runs failed" in ln)
    assert "exp sweep: 1 of 1 runs failed: tiny-llama/ar/prompts; job logs: " in line and ".submitit" in line
    assert "runs finished" not in r.stdout
    (log,) = (tmp_path / "multirun").glob("*/*/.submitit/*/*_log.err")
    assert "error in tiny-llama/ar/prompts: task 'prompts': example" in log.read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


@needs_submitit
@pytest.mark.skipif(not Path("/proc/self").exists(), reason="reads job processes from /proc")
def test_a_killed_grid_leaves_no_decode_running(tmp_path):
    runs = tmp_path / "runs"
    env = {**os.environ, "VIASD_RUNS_DIR": str(runs), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    grid = subprocess.Popen([sys.executable, "-m", "experiments.run", "-m", *TINY, "method=ar,sd",
                             "generation.max_new_tokens=1600", "generation.ignore_eos=true",
                             "hydra/launcher=viasd_local", "hydra.launcher.max_parallel=1"],
                            cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, logs = time.time() + 240, []
        while time.time() < deadline:  # the first cell is inside its decode loop (its progress bar)
            logs = list((tmp_path / "multirun").glob("*/*/.submitit/*/*_log.err"))
            if any("ar on tiny-llama" in p.read_text(errors="replace") for p in logs):
                break
            time.sleep(0.3)
        assert logs and len(logs) == 1, "max_parallel=1 starts one cell at a time"
        controller = int(logs[0].parent.name)  # submitit's local job id is its controller's pid
        grid.send_signal(signal.SIGKILL)
        grid.wait()
        deadline = time.time() + 90
        while time.time() < deadline and _alive(controller):
            time.sleep(0.3)
        assert not _alive(controller), "the cell outlived its grid"
        assert "the grid process is gone: stopping this cell" in logs[0].read_text(errors="replace")
        assert not list(RunStore(runs).finished_runs())  # left unfinished and resumable, never marked done
    finally:
        if grid.poll() is None:
            grid.kill()


class _Job:
    def __init__(self, log, idx, die):
        self.idx, self.die, self.polls, self.log = idx, die, 0, log
        self.paths = type("P", (), {"stderr": f"job{idx}.err"})()

    def done(self):
        self.polls += 1
        return self.polls > 2

    def results(self):
        self.log.append(("end", self.idx))
        if self.die:
            raise RuntimeError("killed")
        return [f"ret{self.idx}"]

    def cancel(self, check=True):
        self.log.append(("cancel", self.idx))


@needs_submitit
def test_viasd_local_runs_at_most_max_parallel_and_reports_a_dead_job(monkeypatch, tmp_path):
    import submitit
    from omegaconf import OmegaConf

    from hydra_plugins.viasd_launcher.viasd_launcher import CappedLocalLauncher

    log = []

    class Executor:
        def __init__(self, **kw):
            pass

        def update_parameters(self, **kw):
            assert "max_parallel" not in kw

        def submit(self, fn, overrides, key, idx, *rest):
            log.append(("start", idx))
            return _Job(log, idx, die=idx == 2)

    monkeypatch.setattr(submitit, "AutoExecutor", Executor)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    launcher = CappedLocalLauncher(max_parallel=2, submitit_folder=str(tmp_path), tasks_per_node=1)
    launcher.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    out = launcher.launch([[f"seed={i}"] for i in range(5)], initial_job_idx=0)
    running = peak = 0
    for what, _ in log:
        running += {"start": 1, "end": -1}.get(what, 0)
        peak = max(peak, running)
    assert peak == 2 and [e for e in log if e[0] == "start"] == [("start", i) for i in range(5)]
    assert [r if isinstance(r, str) else r.return_value for r in out] == [
        "ret0", "ret1", {"failed": "job 2 died (RuntimeError); log: job2.err"}, "ret3", "ret4"]
    with pytest.raises(Exception, match="tasks_per_node must be 1"):
        CappedLocalLauncher(max_parallel=2, submitit_folder=str(tmp_path), tasks_per_node=2)


def test_grid_lock_tells_cells_whether_the_grid_lives(monkeypatch, tmp_path):
    monkeypatch.setattr(launchers.tempfile, "gettempdir", lambda: str(tmp_path))
    grid = launchers.GridLock(slots=2)
    try:
        assert launchers._grid_alive(os.environ[launchers.ENV_LOCK])
        assert not launchers.in_cell_process()  # the grid's own process
        launchers.take_slot()
        launchers.take_slot()  # two slots: both taken at once
        assert len(launchers._HELD) == 2
    finally:
        for slot in launchers._HELD:
            slot.release()
        launchers._HELD.clear()
        path = grid.path
        grid.release()
    assert not launchers._grid_alive(str(path)) and launchers.ENV_LOCK not in os.environ


def test_cells_of_one_label_are_named_by_what_they_sweep():
    names = cell_names(exp_cells(["+exp=fig_gamma", "scale=smoke"]))
    assert len(set(names)) == len(names) == 4 and all(n.startswith("tiny-llama/") for n in names)
    assert any("method.gamma=" in n for n in names)


def test_slurm_jobs_are_sized_per_cell_from_the_pair():
    """hydra/launcher=viasd_slurm sizes each cell from the dry run's memory plan (80 GiB GPUs): the
    70B target spans several GPUs (and gets time per GPU), the 9B and 7B pairs one."""
    from viasd.harness.dryrun import cell_job
    from viasd.harness.grid import compose_cells

    sizes = {c.pair.name: cell_job(c, 80.0, 240) for c in compose_cells(["+exp=table2", "scale=paper"])}
    assert sizes["llama2-7b-70b"]["gpus_per_node"] >= 2 and sizes["llama2-7b-70b"]["mem_gb"] >= 140
    assert sizes["llama2-7b-70b"]["timeout_min"] == 240 * sizes["llama2-7b-70b"]["gpus_per_node"]
    assert sizes["gemma2-2b-9b"] == {**sizes["gemma2-2b-9b"], "gpus_per_node": 1, "timeout_min": 240}
    assert sizes["qwen2.5-0.5b-7b"]["gpus_per_node"] == 1


@needs_submitit
def test_sized_slurm_launcher_submits_one_array_per_cell_size(tmp_path):
    """Cells of the same size share a job array with that size's resources; results come back in
    sweep order. (Sizes and the executor are stand-ins: no SLURM here.)"""
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    from hydra_plugins.viasd_launcher.viasd_launcher import SizedSlurmLauncher, size_groups

    submitted = []

    class Job:
        def __init__(self, idx):
            self.ret = JobReturn(overrides=[], status=JobStatus.COMPLETED)
            self.ret.return_value = idx

        def results(self):
            return [self.ret]

    class Executor:
        def __init__(self, size):
            self.size = size

        def map_array(self, fn, overrides, key, idxs, *rest):
            submitted.append((self.size, list(idxs)))
            return [Job(i) for i in idxs]

    class Launcher(SizedSlurmLauncher):
        def cell_size(self, overrides):
            big = "pair=big" in overrides
            return {"gpus_per_node": 3 if big else 1, "mem_gb": 170 if big else 27}

        def executor(self, size):
            return Executor(size)

    launcher = Launcher(submitit_folder=str(tmp_path), timeout_min=240)
    launcher.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    jobs = [["pair=small", "method=ar"], ["pair=big", "method=ar"], ["pair=small", "method=sd"]]
    rets = launcher.launch(jobs, 10)
    assert [r.return_value for r in rets] == [10, 11, 12]
    assert submitted == [({"gpus_per_node": 1, "mem_gb": 27}, [10, 12]), ({"gpus_per_node": 3, "mem_gb": 170}, [11])]
    assert list(size_groups(jobs, 0, launcher.cell_size).values())[1] == [(1, ["pair=big", "method=ar"])]


def test_a_cells_own_run_checks_its_task_preflight(monkeypatch):
    """What a launcher's job runs (experiments.run -> runner.run -> Cell) checks the task's preflight
    there, on the compute node, before any model loads — not only the submitting host's grid check."""
    from viasd.harness.grid import compose_cells
    from viasd.harness.runner import Cell
    from viasd.tasks.base import Task

    def refuse(self):
        raise RuntimeError("preflight ran in the cell")

    monkeypatch.setattr(Task, "preflight", refuse)
    (cfg,) = compose_cells(list(TINY) + ["method=ar"])
    with pytest.raises(RuntimeError, match="preflight ran in the cell"):
        Cell(cfg)
