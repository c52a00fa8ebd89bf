"""The run store proves its runs: stray, copied, edited and truncated folders are listed as invalid
and never used (issue 29 cases 3 and 4), runs of the code before the proofs stay valid, a full disk
is one line with no folder left behind, the committed results store is read beside the local one,
and a stash carries an unfinished run to another machine."""

from __future__ import annotations

import errno
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from experiments import compare
from experiments import report as report_cli
from experiments import store as store_cli
from viasd.errors import ConfigError
from viasd.harness import runner
from viasd.harness.runner import run
from viasd.paths import PROJECT_ROOT
from viasd.report.build import build_all, collect
from viasd.tracking import run_folder as run_folder_mod
from viasd.tracking.ids import run_id_for
from viasd.tracking.proof import inspect
from viasd.tracking.results import publish, restore, stash
from viasd.tracking.store import RunStore, RunStores, StoreFull, find_run, valid_runs

OLD_STORE = Path(__file__).parent / "fixtures" / "store_3180974"  # written by the code at 3180974
CELL = ["pair=tiny-llama", "task=prompts", "seed=0", "task.n_examples=2", "generation.max_new_tokens=8"]
TABLE = ["task=prompts", "method=sd"]  # table2 at smoke scale, one cell: sd on the built-in prompts


def _run(*overrides: str, cell: list[str] = CELL) -> dict:
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return run(compose(config_name="config", overrides=[*cell, *overrides]))


def _report(tmp_path, store) -> tuple[dict, list]:
    """The table2 smoke cell of sd: its collected run and the sources of the written table."""
    runs, _ = collect("table2", "smoke", store, TABLE)
    build_all(tmp_path / "pf", store, "smoke", ["table2"], TABLE)
    return json.loads((tmp_path / "pf" / "smoke" / "table2.sources.json").read_text()), runs


@pytest.fixture
def ar_sd(runs_dir):
    """A finished ar and sd run of the table2 smoke cell (sd paired with that ar)."""
    ar, sd = _run("method=ar"), _run("method=sd")
    assert sd["ar_run_id"] == ar["run_id"]
    return ar, sd


def test_runs_of_the_code_before_the_proofs_stay_valid(tmp_path):
    """Summaries without examples_lines/examples_sha256 are proved by their line count, complete
    records and counters: ar, sd_ngram, a resumed sd run, a DIMR search and a KL run of 3180974."""
    verdicts = RunStore(OLD_STORE).folders()
    assert len(verdicts) == 5 and all(v.finished for v in verdicts), [(v.path.name, v.reason) for v in verdicts]
    # a run stored under a method's name before its rename (docs/migration.md) keeps its id
    src = next(OLD_STORE.glob("tiny-llama__ar__*"))
    cfg = yaml.safe_load((src / "config.yaml").read_text())
    cfg["method"]["name"] = "viasd"
    old = tmp_path / run_id_for(cfg, renamed=False)
    shutil.copytree(src, old)
    (old / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    summary = json.loads((old / "summary.json").read_text())
    (old / "summary.json").write_text(json.dumps({**summary, "run_id": old.name, "method": "viasd"}))
    assert "__viasd__" in old.name and inspect(old).finished
    assert RunStore(tmp_path).find(old.name)["summary"]["method"] == "via_sd"
    # … and so does one named before method labels (sd with any drafter was `__sd__`)
    ngram = next(OLD_STORE.glob("tiny-llama__sd_ngram__*"))
    bare = tmp_path / ngram.name.replace("__sd_ngram__", "__sd__")
    shutil.copytree(ngram, bare)
    summary = json.loads((bare / "summary.json").read_text())
    (bare / "summary.json").write_text(json.dumps({**summary, "run_id": bare.name}))
    assert inspect(bare).finished
    shutil.copytree(ngram, tmp_path / ngram.name.replace("__sd_ngram__", "__ar__"))
    assert "renamed by hand" in inspect(tmp_path / ngram.name.replace("__sd_ngram__", "__ar__")).reason


def test_a_stray_folder_and_a_broken_summary_break_nothing(ar_sd, runs_dir, tmp_path, capsys):
    """Issue 29 case 3: a folder with only {"method": "ar"}, and a run whose summary.json is broken."""
    ar, sd = ar_sd
    stray = runs_dir / "stray"
    stray.mkdir()
    (stray / "summary.json").write_text('{"method": "ar"}')
    (runs_dir / sd["run_id"] / "summary.json").write_text('{"method": "sd", "tokens_')
    again = _run("method=sd")  # not "already finished": decoded again, the broken folder set aside
    out = capsys.readouterr().out
    assert "already finished" not in out and "summary.json does not read" in out and "moved to" in out
    assert again["run_id"] == sd["run_id"] and again["ar_run_id"] == ar["run_id"]
    assert RunStore(runs_dir).is_finished(sd["run_id"]) and list((runs_dir / "_invalid").iterdir())
    src, runs = _report(tmp_path, RunStore(runs_dir))
    assert src["baselines"] == {sd["run_id"]: ar["run_id"]}
    assert report_cli.main(["--scale", "smoke", "--only", "table2", "--out", str(tmp_path / "pf"),
                            "--runs", str(runs_dir), "--results", "none", "--override", *TABLE]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"invalid run folder {stray}: no config.yaml (not used; `python -m experiments.store check` "
                   "lists them)"]


def test_a_copied_ar_folder_is_no_baseline_and_an_edited_one_is_redone(ar_sd, runs_dir, tmp_path, capsys):
    """Issue 29 case 4: a copy of the ar folder under another name with tokens_per_s edited never
    becomes the baseline; the real ar run with config.yaml edited by hand is not "finished", and
    the command the report gives for the missing ar run decodes it (never "already finished")."""
    ar, sd = ar_sd
    copy = runs_dir / ar["run_id"].replace(ar["run_id"][-10:], "0123456789")
    shutil.copytree(runs_dir / ar["run_id"], copy)
    summary = json.loads((copy / "summary.json").read_text())
    (copy / "summary.json").write_text(json.dumps({**summary, "tokens_per_s": summary["tokens_per_s"] / 79}))
    assert "copied under another name" in inspect(copy).reason
    src, runs = _report(tmp_path, RunStore(runs_dir))
    assert src["baselines"] == {sd["run_id"]: ar["run_id"]}
    assert abs(runs[0]["speedup"] - sd["tokens_per_s"] / ar["tokens_per_s"]) < 1e-9
    # an in-place edit of the real ar run's numbers is caught too
    real = runs_dir / ar["run_id"] / "summary.json"
    kept = real.read_text()
    real.write_text(json.dumps({**json.loads(kept), "tokens_per_s": 1e-3}))
    assert "tokens_per_s" in inspect(real.parent).reason and not RunStore(runs_dir).is_finished(ar["run_id"])
    real.write_text(kept)
    cfg_file = runs_dir / ar["run_id"] / "config.yaml"
    cfg_file.write_text(cfg_file.read_text().replace("max_new_tokens: 8", "max_new_tokens: 9"))
    src, runs = _report(tmp_path, RunStore(runs_dir))
    (cmd,) = src["missing_ar"]
    capsys.readouterr()
    made = _run(*shlex.split(cmd)[3:], cell=[])
    out = capsys.readouterr().out
    assert made["run_id"] == ar["run_id"] and "already finished" not in out and "hashes to" in out
    assert _report(tmp_path, RunStore(runs_dir))[0]["baselines"] == {sd["run_id"]: ar["run_id"]}
    assert compare.main(["--ar", ar["run_id"], sd["run_id"], "--runs-dir", str(runs_dir), "--results", "none"]) == 0
    err = capsys.readouterr().err
    assert err.count("invalid run folder") == 1 and copy.name in err


def test_truncated_examples_are_neither_finished_nor_a_baseline(ar_sd, runs_dir):
    ar, _ = ar_sd
    ex = runs_dir / ar["run_id"] / "examples.jsonl"
    ex.write_text(ex.read_text().splitlines()[0] + "\n")
    assert "holds 1 complete records, the summary says 2" in inspect(ex.parent).reason
    ex.write_text(ex.read_text() + '{"id": "x", "new_tok')
    assert "line 2 is not a complete record" in inspect(ex.parent).reason
    assert not RunStore(runs_dir).is_finished(ar["run_id"]) and find_run(ar["run_id"], RunStore(runs_dir)) is None


def test_store_check_lists_and_moves_invalid_folders_and_ignores_reserved_ones(ar_sd, runs_dir, tmp_path, capsys):
    ar, sd = ar_sd
    for name in ("wandb", "_traces", "_cost", ".cache", "bench"):
        (runs_dir / name).mkdir(exist_ok=True)
    (runs_dir / "notes").mkdir()
    (runs_dir / "notes" / "todo.txt").write_text("compare these\n")
    (runs_dir / "left-empty").mkdir()
    (runs_dir / sd["run_id"] / "summary.json").unlink()  # an interrupted attempt: resumable, not invalid
    args = ["check", "--runs", str(runs_dir), "--results", "none"]
    assert store_cli.main(args) == 1
    out = capsys.readouterr().out
    assert "1 finished runs, 0 being written, 1 unfinished, 1 empty, 1 invalid" in out
    assert "invalid       notes: no config.yaml" in out and "unfinished    " + sd["run_id"] in out
    assert not any(f" {n}:" in out for n in ("wandb", "_traces", "_cost", ".cache", "bench"))
    assert store_cli.main([*args, "--move-aside", str(tmp_path / "aside")]) == 0
    assert not (runs_dir / "notes").exists() and (tmp_path / "aside" / "notes" / "todo.txt").is_file()
    assert not (runs_dir / "left-empty").exists() and (runs_dir / sd["run_id"]).is_dir()
    assert store_cli.main(args) == 0


def test_a_full_disk_is_one_line_and_leaves_no_run_folder(runs_dir, monkeypatch):
    """Issue 29 item 6: every write of a run folder goes through store_write; ENOSPC there (faked at
    our own helpers) is one StoreFull line, and a run that wrote nothing leaves no folder."""
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_folder_mod, "atomic_write_text", full)
    monkeypatch.setattr(run_folder_mod, "append_text", full)
    try:
        with pytest.raises(StoreFull, match=r"^no space left on device writing .*config.yaml \(run store .*free\); "
                                            r"free space there or point VIASD_RUNS_DIR") as e:
            _run("method=ar")
        assert "\n" not in str(e.value) and not list(runs_dir.iterdir())
        assert _run("method=sd")["failed"]  # the same store in this process: at once, silently (a grid's next cell)
    finally:
        runner.FULL_STORES.clear()


def test_a_full_disk_stops_a_grid_after_one_line(tmp_path):
    """A grid on a full store: one error line, the other cells listed as failed, no run folders."""
    runs = tmp_path / "runs"
    code = ("import errno, runpy, sys; import viasd.tracking.run_folder as s\n"
            "def full(*a, **k): raise OSError(errno.ENOSPC, 'No space left on device')\n"
            "s.atomic_write_text = s.append_text = full\n"
            "sys.argv = ['experiments.run', '+exp=fig_gap', 'scale=smoke', 'generation.max_new_tokens=2']\n"
            "runpy.run_module('experiments.run', run_name='__main__')\n")
    env = {"VIASD_RUNS_DIR": str(runs), "WANDB_MODE": "disabled", "PYTHONPATH": str(PROJECT_ROOT),
           "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if "no space left" in ln]
    assert len(errors) == 1 and errors[0].startswith("error in tiny-llama/"), r.stderr[-3000:]
    assert "3 of 3 runs failed" in r.stderr and not [p for p in runs.iterdir() if p.is_dir()]


def test_results_store_is_read_beside_the_local_one_and_only_publish_writes_it(ar_sd, runs_dir, tmp_path, capsys):
    ar, sd = ar_sd
    results = tmp_path / "results"
    assert store_cli.main(["publish", ar["run_id"], sd["run_id"], "--runs", str(runs_dir), "--to", str(results)]) == 0
    assert "published to" in capsys.readouterr().out
    assert {p.name for p in (results / ar["run_id"]).iterdir()} == {"config.yaml", "meta.json", "examples.jsonl",
                                                                    "summary.json"}
    assert publish([ar["run_id"]], RunStore(runs_dir), results) == [(ar["run_id"], f"already in {results}")]
    fresh = RunStores.default(tmp_path / "empty", results)  # a fresh clone: no local runs
    assert find_run(sd["run_id"], fresh)["root"] == results.resolve()
    assert {r["run_id"] for r in valid_runs(fresh)} == {ar["run_id"], sd["run_id"]}
    src, _ = _report(tmp_path, fresh)
    assert src["baselines"] == {sd["run_id"]: ar["run_id"]}
    assert compare.main(["--ar", ar["run_id"], sd["run_id"], "--runs-dir", str(tmp_path / "empty"),
                         "--results", str(results)]) == 0
    # the same rules there: an edited copy in the results store is listed, never used
    shutil.copytree(results / ar["run_id"], results / (ar["run_id"][:-10] + "aaaaaaaaaa"))
    assert len(fresh.invalid_runs()) == 1
    # a normal run writes only into its own store
    before = sorted(p.name for p in results.iterdir())
    _run("method=sd_ngram")
    assert sorted(p.name for p in results.iterdir()) == before
    with pytest.raises(Exception, match="not a finished valid run"):
        publish(["tiny-llama__ar__prompts__nonexistent"], RunStore(runs_dir), results)


def test_a_stash_carries_an_unfinished_run_to_another_machine(runs_dir, tmp_path, monkeypatch, capsys):
    """stash copies the complete examples of an interrupted run (not the line being written),
    restore puts them into another (empty) store, the same command resumes after them and ends
    with the outputs of a run never interrupted; publish then removes the stash and carries the pair's
    cost file along (a committed one is kept)."""
    whole = _run("method=ar")
    rid, folder = whole["run_id"], runs_dir / whole["run_id"]
    tokens = [r["token_ids"] for r in RunStore(runs_dir).examples(rid)]
    (folder / "summary.json").unlink()
    first = (folder / "examples.jsonl").read_text().splitlines()[0]
    (folder / "examples.jsonl").write_text(first + '\n{"id": "x", "new_tok')  # killed while appending line 2
    stash_dir = tmp_path / "unfinished"
    assert store_cli.main(["stash", "--runs", str(runs_dir), "--to", str(stash_dir)]) == 0
    assert f"stashed 1 examples to {stash_dir / rid}" in capsys.readouterr().out
    assert (stash_dir / rid / "examples.jsonl").read_text() == first + "\n"
    assert {p.name for p in (stash_dir / rid).iterdir()} == {"config.yaml", "meta.json", "examples.jsonl", "stash.json"}
    assert "kept: the stash" in stash([rid], RunStore(runs_dir), stash_dir)[0][1]
    with pytest.raises(ConfigError, match="no such folder"):
        stash(["tiny-llama__ar__prompts__0000000000"], RunStore(runs_dir), stash_dir)
    other = tmp_path / "other-machine"
    monkeypatch.setenv("VIASD_RUNS_DIR", str(other))
    assert store_cli.main(["restore", "--runs", str(other), "--from", str(stash_dir)]) == 0
    assert "restored 1 examples" in capsys.readouterr().out
    assert "kept:" in restore(stash_dir, RunStore(other))[0][1]  # it has them now
    resumed = _run("method=ar")
    assert resumed["run_id"] == rid and json.loads((other / rid / "meta.json").read_text())["resumed_examples"] == 1
    assert [r["token_ids"] for r in RunStore(other).examples(rid)] == tokens
    with pytest.raises(ConfigError, match="publish it instead"):
        stash([rid], RunStore(other), stash_dir)
    (other / "_cost").mkdir()
    (other / "_cost" / "tiny-llama__vm__packed-float32-t1.json").write_text("{}")  # what prices its speedups
    done = publish([rid], RunStore(other), tmp_path / "results", stash_dir=stash_dir)
    assert done[-1] == (rid, f"its stash removed from {stash_dir}") and not (stash_dir / rid).exists()
    assert (tmp_path / "results" / "_cost" / "tiny-llama__vm__packed-float32-t1.json").read_text() == "{}"
    (other / "_cost" / "tiny-llama__vm__packed-float32-t1.json").write_text('{"remeasured": 1}')
    assert "kept the committed cost file" in publish([rid], RunStore(other), tmp_path / "results")[-1][1]
