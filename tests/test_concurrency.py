"""A run is written by one process (issue 29 case 2): an identical command started while the first
decodes waits for it, naming the holder, and the run stays whole — over 10 tries; two identical
grids on one store decode every cell once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from hydra import compose, initialize_config_dir

from experiments import compare
from viasd.harness.runner import run
from viasd.paths import PROJECT_ROOT
from viasd.tracking.proof import inspect
from viasd.tracking.store import RunStore

ENV = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(PROJECT_ROOT)}


def _prompts(path, n: int, salt: str = "") -> None:
    path.write_text("".join(f"Prompt {salt}{i}: count the words of sentence number {i}.\n\n" for i in range(n)))


def _whole(folder, n: int) -> None:
    """The folder proves itself: n complete records, the summary's count and checksum."""
    v = inspect(folder)
    assert v.finished, v.reason
    lines = (folder / "examples.jsonl").read_text().splitlines()
    assert len(lines) == n == v.summary["n_examples"] and len({json.loads(x)["id"] for x in lines}) == n


# The second command, its imports done ahead (a cold start takes longer than the first run's
# remaining decode on a loaded machine), started when the file GO appears: `python -m experiments.run ARGS`.
SECOND = ("import os, runpy, sys, time\n"
          "import experiments.run\n"
          "while not os.path.exists(sys.argv[1]): time.sleep(0.005)\n"
          "sys.argv = ['experiments.run', *sys.argv[2:]]\n"
          "runpy.run_module('experiments.run', run_name='__main__')\n")


def test_the_identical_command_started_a_few_examples_later_waits_for_the_first(tmp_path):
    prompts, runs, go = tmp_path / "p.txt", tmp_path / "runs", tmp_path / "go"
    _prompts(prompts, 16)
    args = ["pair=tiny-llama", "method=sd", "task=prompts", f"task.path={prompts}", "generation.max_new_tokens=16"]
    env = {**ENV, "VIASD_RUNS_DIR": str(runs)}
    second = subprocess.Popen([sys.executable, "-c", SECOND, str(go), *args], cwd=PROJECT_ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = subprocess.Popen([sys.executable, "-m", "experiments.run", *args], cwd=PROJECT_ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and not any(p.read_bytes().count(b"\n") >= 3 for p in runs.glob("*/examples.jsonl")):
        time.sleep(0.01)
    go.touch()
    out1, err1 = first.communicate(timeout=300)
    out2, err2 = second.communicate(timeout=300)
    assert first.returncode == 0 and second.returncode == 0, (err1[-2000:], err2[-2000:])
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    assert re.search(rf"{folder.name}: being written by pid {first.pid} on \S+ since \S+; waiting", out2), out2
    assert f"{folder.name}: already finished" in out2 and "Traceback" not in err2
    _whole(folder, 16)
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        ar = run(compose(config_name="config", overrides=[*args[2:], "pair=tiny-llama", "method=ar",
                                                          f"tracking.store_dir={runs}"]))
    assert compare.main(["--ar", ar["run_id"], folder.name, "--runs-dir", str(runs), "--results", "none"]) == 0


def test_the_race_leaves_every_run_whole_over_ten_tries(tmp_path):
    runs, prompts = tmp_path / "runs", tmp_path / "prompts"
    prompts.mkdir()
    for k in range(10):
        _prompts(prompts / f"{k}.txt", 7, salt=f"{k}-")
    cmd = [sys.executable, "-m", "tests.helpers.race"]
    first = subprocess.Popen([*cmd, "first", str(runs), str(prompts), "10"], cwd=PROJECT_ROOT, env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen([*cmd, "second", str(runs), str(prompts), "10"], cwd=PROJECT_ROOT, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out1, err1 = first.communicate(timeout=600)
    out2, err2 = second.communicate(timeout=600)
    assert first.returncode == 0 and second.returncode == 0, (err1[-2000:], err2[-2000:])
    folders = [p for p in runs.iterdir() if p.is_dir()]
    assert len(folders) == 10
    for folder in folders:
        _whole(folder, 7)
    waited = out2.count("being written by pid")
    assert waited >= 8 and out2.count("already finished") == 10, out2  # the race was real in (nearly) every try
    assert "run folder:" not in out2  # the second decoded nothing


def test_two_identical_grids_on_one_store_decode_every_cell_once(tmp_path):
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "experiments.run", "+exp=fig_gap", "scale=smoke", "generation.max_new_tokens=16"]
    env = {**ENV, "VIASD_RUNS_DIR": str(runs)}
    grids = [subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [g.communicate(timeout=600) for g in grids]
    assert all(g.returncode == 0 for g in grids), [e[-2000:] for _, e in outs]
    assert all("all 3 runs finished" in o for o, _ in outs)
    assert sum(o.count("run folder:") for o, _ in outs) == 3  # every cell decoded by one grid only
    assert {r["run_id"] for r in RunStore(runs).finished_runs()} == {p.name for p in runs.iterdir() if p.is_dir()}


def test_a_folder_killed_while_its_holder_note_was_written_is_empty_not_invalid(tmp_path):
    """A kill inside the lock's atomic write of ``.holder.json`` leaves its temporary file and nothing else
    (seen once under a SIGKILL in test_killed_grid_resumes_…): that folder holds no run, so it is empty
    (dropped when its lock is released), never an invalid run set aside in ``_invalid/``."""
    store = RunStore(tmp_path)
    folder = tmp_path / "tiny-llama__sd__xsum__e8670108bc"
    folder.mkdir()
    (folder / "..holder.json.o9wx9_r6.tmp").write_text('{"pid": 1}')
    assert inspect(folder).state == "empty"
    store.drop_if_empty(folder.name)
    assert not folder.exists() and not (tmp_path / "_invalid").exists()
