"""Interleaved runs (issue 30): cells of one workload decoded example by example in one process,
each its own run (another id than alone), with ar's tokens, paired with the group's ar, resumable
after a crash; and the main job they make (``make run``, issue 29 item 5) with no ``nan`` shown."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.helpers.app import run_app
from viasd.harness import runner
from viasd.harness.grid import exp_cells, sweep_overrides
from viasd.harness.interleave import run_interleaved
from viasd.harness.runner import identity, run
from viasd.paths import PROJECT_ROOT
from viasd.tracking.baseline import workload_key
from viasd.tracking.store import RunStore

SD = '+exp.variants.sd=["method=sd"]'  # a third cell beside the main job's ar and sd_ngram
BASE = ["+exp=main", "scale=smoke", SD, "generation.max_new_tokens=12"]


def _group(overrides: list[str]):
    """``(job overrides, composed config)`` of the one interleave job of the sweep (inside Hydra)."""
    top = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    (job,) = sweep_overrides(OmegaConf.to_container(top.hydra.sweeper.params, resolve=True), overrides)
    return job, compose(config_name="config", overrides=job)


def _lines(store: RunStore, run_id: str) -> list[dict]:
    return store.examples(run_id)


def test_interleaved_cells_are_own_runs_with_ar_tokens_paired_with_their_ar_and_resume(runs_dir, monkeypatch, capsys):
    store = RunStore(runs_dir)
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        job, cfg = _group(BASE)
        cells = exp_cells(BASE)  # the grid sees the variants as its cells
        ids = [runner.run_id_for(identity(c)) for _, c in cells]
        assert [i.split("__")[1] for i in ids] == ["ar", "sd_ngram", "sd"]
        real, calls = runner.decode, []

        def killed_at_the_sixth_decode(*a, **k):  # example 0 by all three cells, example 1 by two
            if len(calls) == 5:
                raise RuntimeError("killed")
            calls.append(1)
            return real(*a, **k)

        monkeypatch.setattr(runner, "decode", killed_at_the_sixth_decode)
        with pytest.raises(RuntimeError, match="killed"):
            run_interleaved(cfg, job)
        monkeypatch.setattr(runner, "decode", real)
        done = {i: len(_lines(store, i)) for i in ids}
        assert sorted(done.values()) == [1, 2, 2] and not any(store.is_finished(i) for i in ids)
        torn = runs_dir / ids[1] / "examples.jsonl"
        torn.write_text(torn.read_text() + '{"id": "half a li')  # as a kill -9 mid-write leaves it
        capsys.readouterr()
        out = run_interleaved(cfg, job)
        printed = capsys.readouterr().out
        inter = out["summaries"]
        assert [inter[label]["resumed_examples"] for label in ("ar", "sd_ngram", "sd")] == [done[i] for i in ids]
        sequential = {}
        for (overrides, _), label in zip(cells, ("ar", "sd_ngram", "sd")):
            alone = [o for o in overrides if o != "schedule=interleaved"]
            sequential[label] = run(compose(config_name="config", overrides=alone))
    ar_id = out["runs"]["ar"]
    for label, s in inter.items():
        seq = sequential[label]
        assert s["run_id"] != seq["run_id"], "an interleaved cell is another run than the same cell alone"
        assert yaml.safe_load((runs_dir / s["run_id"] / "config.yaml").read_text())["schedule"] == "interleaved"
        assert "schedule" not in yaml.safe_load((runs_dir / seq["run_id"] / "config.yaml").read_text())
        rows, alone = _lines(store, s["run_id"]), _lines(store, seq["run_id"])
        assert [r["token_ids"] for r in rows] == [r["token_ids"] for r in alone] == \
            [r["token_ids"] for r in _lines(store, ar_id)]  # same tokens; lossless: ar's
        assert len({r["interleave_slot"] for r in rows}) > 1  # the order rotates per example
        if label != "ar":
            assert s["ar_run_id"] == ar_id and seq["ar_run_id"] == sequential["ar"]["run_id"] != ar_id
            assert abs(s["speedup_vs_ar"] - s["tokens_per_s"] / inter["ar"]["tokens_per_s"]) < 1e-9
        meta = json.loads((runs_dir / s["run_id"] / "meta.json").read_text())
        assert meta["schedule"]["group"] == ids
    assert "ar's tokens/s (n=7)" in printed and printed.count("outputs identical to ar token for token: 7/7") == 2
    assert "prompt 1: " in printed and "nan" not in printed


def test_make_run_shows_the_speedup_identity_and_an_output_then_reuses_its_runs(tmp_path):
    """`make run` = `python -m experiments.run +exp=main` (here at smoke scale: tiny-llama)."""
    runs = tmp_path / "runs"
    r = run_app("+exp=main", "scale=smoke", "generation.max_new_tokens=8", runs=runs)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ar, sd_ngram interleaved example by example on tiny-llama/prompts" in r.stdout
    assert "x ar's tokens/s (n=7); outputs identical to ar token for token: 7/7" in r.stdout
    assert "prompt 1: 'Summarize" in r.stdout and "sd_ngram output: " in r.stdout and "nan" not in r.stdout
    assert "[viasd] exp main: all 2 runs finished" in r.stdout
    stamps = {p: p.stat().st_mtime_ns for p in runs.glob("*/summary.json")}
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        overrides = ["+exp=main", "scale=smoke", "generation.max_new_tokens=8", f"tracking.store_dir={runs}"]
        again = run_interleaved(*reversed(_group(overrides)))
    assert {p: p.stat().st_mtime_ns for p in runs.glob("*/summary.json")} == stamps and len(stamps) == 2
    assert set(again["runs"].values()) == {p.parent.name for p in stamps}  # reused, nothing decoded again


def test_a_run_without_its_ar_prints_no_nan_and_the_command_that_creates_it(tmp_path):
    runs = tmp_path / "runs"
    r = run_app("pair=tiny-llama", "method=sd_ngram", "task.n_examples=2", "generation.max_new_tokens=4", runs=runs)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "nan" not in r.stdout and "speedup_vs_ar           –" in r.stdout
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("no matched ar run")]
    cmd = line.split("create it with: ", 1)[1]
    assert cmd == "python -m experiments.run method=ar pair=tiny-llama task.n_examples=2 generation.max_new_tokens=4"
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        ar = run(compose(config_name="config", overrides=[*shlex.split(cmd)[3:], f"tracking.store_dir={runs}"]))
    (sd,) = [p.name for p in runs.iterdir() if "__sd_ngram__" in p.name]
    sd_cfg = yaml.safe_load((runs / sd / "config.yaml").read_text())
    assert workload_key(sd_cfg) == workload_key(yaml.safe_load((runs / ar["run_id"] / "config.yaml").read_text()))


def test_the_exps_table_names_each_row_by_its_variant_label_and_says_what_it_runs(runs_dir, tmp_path):
    from viasd.report.build import build_all

    overrides = ["+exp=main", "scale=smoke", '+exp.variants.ngram3=["method=sd_ngram","method.gamma=3"]',
                 "generation.max_new_tokens=6"]
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        job, cfg = _group(overrides)
        run_interleaved(cfg, job)
        out = build_all(tmp_path / "pf", RunStore(runs_dir), "smoke", ["main"], overrides=overrides[2:])
    assert not isinstance(out["main"], str), out
    md = (tmp_path / "pf" / "smoke" / "main.md").read_text()
    rows = [ln.split("|")[1].strip() for ln in md.splitlines() if ln.startswith("| ") and "__" in ln]
    assert rows == ["ar", "sd_ngram", "ngram3"]
    assert "`ngram3` = method=sd_ngram method.gamma=3" in md and "`ar` =" not in md


def test_a_multi_task_exp_names_its_tables_by_task_also_while_some_tasks_decode():
    """The verdict's MBPP table is verdict_mbpp.md from the first finished task on (not verdict.md,
    which would go stale when HumanEval finishes); a one-task exp keeps its own name."""
    from viasd.report.interleaved import table_names

    ar = {t: f"p__ar__{t}__{t[:2]}" for t in ("humaneval", "mbpp", "gsm8k")}
    cells = [*ar.values(), "p__sd__humaneval__x", "p__sd__mbpp__y", "p__sd__gsm8k__z"]
    assert table_names("verdict", [ar["mbpp"]], cells) == ["verdict_mbpp"]
    assert table_names("verdict", list(ar.values()), cells) == ["verdict_humaneval", "verdict_mbpp", "verdict_gsm8k"]
    assert table_names("main", ["p__ar__prompts__a"], ["p__ar__prompts__a", "p__sd_ngram__prompts__b"]) == ["main"]
    assert table_names("main", ["p__ar__prompts__a", "p__ar__prompts__b"], []) == ["main_1", "main_2"]


def test_a_cell_added_after_ar_finished_is_named_in_the_tables_note_as_decoded_apart(runs_dir, tmp_path):
    """A variant added to an exp whose other cells finished is decoded alone (its meta.json says so); the
    table keeps its row but its note names it as not decoded beside ``ar`` (its timed speedups compare two
    sessions), and names none of the cells that were."""
    from viasd.report.build import build_all

    first = ["+exp=main", "scale=smoke", "generation.max_new_tokens=6"]
    later = first + ['+exp.variants.ngram3=["method=sd_ngram","method.gamma=3"]']
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        for overrides in (first, later):  # the second decodes only the cell the first did not have
            job, cfg = _group(overrides)
            run_interleaved(cfg, job)
        out = build_all(tmp_path / "pf", RunStore(runs_dir), "smoke", ["main"], overrides=later[2:])
    assert not isinstance(out["main"], str), out
    md = (tmp_path / "pf" / "smoke" / "main.md").read_text()
    assert [ln.split("|")[1].strip() for ln in md.splitlines() if ln.startswith("| ") and "__" in ln] == \
        ["ar", "sd_ngram", "ngram3"]
    note = md[md.index("Not decoded beside"):]
    assert "`ngram3`" in note and "`sd_ngram`" not in note.split(": their speedup")[0]
