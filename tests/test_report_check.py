"""``experiments.report --check`` (viasd/report/check.py): stale, fresh and not-checked outputs on
a synthetic tree, the cell composition it shares with the grid, and the committed tree itself.
Nothing decodes and no model loads: only configs are composed."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from hydra import initialize_config_dir
from omegaconf import OmegaConf

from experiments.report import main as report_main
from tests.conftest import REAL_DATA_DIR
from viasd.dimr.masks import mask_path, published_mask_path
from viasd.errors import ConfigError
from viasd.harness.grid import CONF_DIR, exp_cells
from viasd.harness.prereq import cell_mask_source
from viasd.harness.runner import identity
from viasd.models.pairs import store_name
from viasd.paths import PROJECT_ROOT, runs_dir
from viasd.report.check import (
    FRESH,
    STALE,
    UNCHECKED,
    check_main,
    check_tree,
    composed_cells,
    default_stores,
    expected_cells,
)
from viasd.tracking.store import run_id_for


@pytest.fixture(scope="module")
def hydra():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield


def _write(folder, name, runs=None, missing=(), suffixes=(".md",), **extra):
    folder.mkdir(parents=True, exist_ok=True)
    for s in suffixes:
        (folder / f"{name}{s}").write_text("x")
    if runs is not None:
        (folder / f"{name}.sources.json").write_text(json.dumps({"runs": runs, "missing": list(missing), **extra}))


def _store_run(store, ident):
    rid = run_id_for(ident)
    (store / rid).mkdir(parents=True)
    (store / rid / "config.yaml").write_text(yaml.safe_dump(ident, sort_keys=False))
    (store / rid / "summary.json").write_text("{}")
    return rid


@pytest.fixture(scope="module")
def checked(hydra, tmp_path_factory):
    """One check over a synthetic tree of every case: ``{output name: Verdict}``."""
    tmp = tmp_path_factory.mktemp("check")
    empty_data = tmp / "data"
    empty_data.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIASD_DATA_DIR", str(empty_data))  # no offline file: cells reading one are not checked
        smoke = tmp / "a" / "paper_figures" / "smoke"
        table1 = [c.run_id for c in expected_cells("table1", "smoke")]
        _write(smoke, "table1", table1, suffixes=(".md", ".tex"))
        _write(smoke, "fig_dimr", [table1[0], table1[1][:-10] + "0123456789"], suffixes=(".png", ".pdf"))
        _write(smoke, "table4")  # no sources file
        _write(smoke, "fig_keep_ratio", ["tiny-llama__via_sd__xsum__0123456789"])
        gap = expected_cells("fig_gap", "smoke")  # ar, sd, via_sd on built-in prompts: no input file
        _write(smoke, "fig_gap", [gap[0].run_id, gap[2].run_id], baselines={gap[2].run_id: "tiny-llama__ar__x__1"})
        _write(tmp / "b" / "paper_figures" / "smoke", "fig_gap", [gap[0].run_id, gap[2].run_id], [gap[1].run_id])
        _write(tmp / "a" / "paper_figures" / "cpu-large", "fig_gap", [gap[0].run_id])

        store = tmp / "store"
        cells = composed_cells(["+exp=fig_gap", "scale=smoke"])
        ar = _store_run(store, identity(cells[0][1]))
        old = identity(cells[1][1])
        del old["generation"]["top_k"]  # a run made before the current code added a key
        old_id = _store_run(store, old)
        _write(smoke, "shared_ok", [ar], baselines={ar: ar})
        _write(smoke, "shared_old", [ar, old_id])
        _write(smoke, "shared_gone", [ar, "tiny-llama__sd__prompts__0123456789"])
        _write(tmp / "bench_results", "bench", suffixes=(".md", ".json"))
        verdicts, skipped = check_tree([tmp / "a" / "paper_figures", tmp / "b" / "paper_figures",
                                        tmp / "bench_results"], [store])
    return {f"{v.path.parent.parent.parent.name}/{v.path.parent.name}/{v.path.name}": v for v in verdicts}, skipped, old_id


def test_fresh_when_the_sources_are_the_current_cells(checked):
    v = checked[0]["a/smoke/table1"]
    assert v.state == FRESH and sorted(v.files) == ["table1.md", "table1.sources.json", "table1.tex"]
    assert checked[0]["b/smoke/fig_gap"].state == FRESH  # a cell listed as missing is covered


def test_stale_source_run_names_the_run_and_its_current_id(checked):
    v = checked[0]["a/smoke/fig_dimr"]
    assert v.state == STALE
    assert "2 sources, 1 not made by the current configs (first: tiny-llama__dimr_search__calibration__0123456789 → now" \
        in v.reason
    assert "python -m experiments.run +exp=fig_dimr scale=smoke" in v.fix and "--scale smoke --only fig_dimr" in v.fix
    assert v.line().startswith("STALE       ") and "fig_dimr.{pdf,png,sources.json}" in v.line()


def test_stale_without_sources_a_lacking_cell_a_wrong_baseline_or_scale(checked):
    verdicts = checked[0]
    assert verdicts["a/smoke/table4"].state == STALE and "no sources file" in verdicts["a/smoke/table4"].reason
    gap = verdicts["a/smoke/fig_gap"]
    assert gap.state == STALE
    assert "1 of the exp's 3 current cells are neither among its runs nor among its missing cells" in gap.reason
    assert "1 speedups against an ar run that is not their workload's now (first: tiny-llama__ar__x__1" in gap.reason
    assert "exp fig_gap has no cpu-large scale" in verdicts["a/cpu-large/fig_gap"].reason


def test_an_absent_input_is_not_checked_and_fails_only_when_strict(checked, hydra, tmp_path, monkeypatch, capsys):
    v = checked[0]["a/smoke/fig_keep_ratio"]
    assert v.state == UNCHECKED and "offline data file" in v.reason and "absent" in v.reason
    monkeypatch.setenv("VIASD_DATA_DIR", str(tmp_path / "nowhere"))
    _write(tmp_path / "paper_figures" / "smoke", "fig_keep_ratio", ["tiny-llama__via_sd__xsum__0123456789"])
    assert check_main([tmp_path / "paper_figures"], []) == 0
    assert check_main([tmp_path / "paper_figures"], [], strict=True) == 1
    out = capsys.readouterr().out
    assert "no data folder: set VIASD_DATA_DIR" in out and "1 not checked" in out


def test_a_mask_searched_here_leaves_outputs_made_without_it_unchecked_not_stale(hydra, tmp_path, monkeypatch,
                                                                                synthetic_data):
    """A searched DIMR mask in this machine's cache changes what ``mask: auto`` reads, hence the via_sd
    run ids; an output made on a clean cache (the pair's shipped mask or fallback) is then not checked.
    The cells' offline files come from the synthetic data folder (their hashes enter the run ids), so the
    test runs on a fresh clone without the real data."""
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path / "cache"))
    clean = expected_cells("fig_tiers", "smoke")
    routed = [(c, cfg) for c, (_, cfg) in zip(clean, composed_cells(["+exp=fig_tiers", "scale=smoke"]))
              if (src := cell_mask_source(cfg)) is not None and src.kind in ("shipped", "fallback")]
    assert routed, "fig_tiers at smoke has a via_sd cell whose mask: auto reads a shipped mask or fallback"
    _write(tmp_path / "paper_figures" / "smoke", "fig_tiers", [c.run_id for c in clean])
    assert check_tree([tmp_path / "paper_figures"], [])[0][0].state == FRESH
    slim = routed[0][1].method.slim
    art = mask_path(store_name(OmegaConf.to_container(routed[0][1].pair, resolve=True)), float(slim.keep_ratio),
                    str(slim.objective), str(slim.get("space", "layers")))
    art.parent.mkdir(parents=True, exist_ok=True)
    art.write_text(json.dumps({"layers": [0]}))  # a user's own search result
    assert expected_cells("fig_tiers", "smoke")[clean.index(routed[0][0])].run_id != routed[0][0].run_id
    v = check_tree([tmp_path / "paper_figures"], [])[0][0]
    assert v.state == UNCHECKED and "reads the DIMR mask searched here" in v.reason and "fresh clone" in v.reason


def test_a_published_mask_is_what_a_fresh_clone_reads_so_its_cells_are_decided(hydra, tmp_path, monkeypatch,
                                                                                synthetic_data):
    """A mask published in the results store (``results/runs/_masks``) is read on every clone: cells reading
    it are checked (fresh when matched; an output made with the fallback it replaced is stale, not
    unchecked); a cached mask with other bytes than the published one is one error line."""
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VIASD_RESULTS_DIR", str(tmp_path / "results"))
    clean = expected_cells("fig_tiers", "smoke")
    routed = [(c, cfg) for c, (_, cfg) in zip(clean, composed_cells(["+exp=fig_tiers", "scale=smoke"]))
              if (src := cell_mask_source(cfg)) is not None and src.kind == "fallback"]
    slim = routed[0][1].method.slim
    key = (store_name(OmegaConf.to_container(routed[0][1].pair, resolve=True)), float(slim.keep_ratio),
           str(slim.objective), str(slim.get("space", "layers")))
    published = published_mask_path(*key)
    published.parent.mkdir(parents=True)
    published.write_text(json.dumps({"layers": [0]}))
    now = expected_cells("fig_tiers", "smoke")
    assert now[clean.index(routed[0][0])].run_id != routed[0][0].run_id and not any(c.unsure for c in now)
    _write(tmp_path / "pf" / "smoke", "fig_tiers", [c.run_id for c in now])
    assert check_tree([tmp_path / "pf"], [])[0][0].state == FRESH
    _write(tmp_path / "pf" / "smoke", "fig_tiers", [c.run_id for c in clean])  # made before the mask was published
    v = check_tree([tmp_path / "pf"], [])[0][0]
    assert v.state == STALE and "not made by the current configs" in v.reason
    cached = mask_path(*key)
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps({"layers": [1]}))
    with pytest.raises(ConfigError, match=f"cached at {cached} is not the one published at {published}"):
        check_tree([tmp_path / "pf"], [])


def test_compare_outputs_are_checked_against_the_runs_they_name(checked):
    verdicts, _, old_id = checked
    assert verdicts["a/smoke/shared_ok"].state == FRESH
    old = verdicts["a/smoke/shared_old"]
    assert old.state == STALE and f"{old_id} → now tiny-llama__sd__prompts__" in old.reason
    assert "experiments.compare" in old.fix
    gone = verdicts["a/smoke/shared_gone"]
    assert gone.state == UNCHECKED and "1 of 2 runs in no run store read" in gone.reason


def test_benchmark_outputs_without_sources_are_skipped(checked):
    assert [p.name for p in checked[1]] == ["bench"]


def test_report_check_flag_exits_1_on_a_stale_output(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "paper_figures" / "local", "table2", suffixes=(".md", ".tex"))
    assert report_main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "STALE       paper_figures/local/table2.{md,tex}: no sources file" in out
    assert "fix: python -m experiments.report --scale local --only table2" in out
    shutil.rmtree(tmp_path / "paper_figures" / "local")
    assert report_main(["--check"]) == 0
    assert "check of 0 outputs" in capsys.readouterr().out


def test_composed_cells_are_the_grids_cells(hydra):
    """Group choices composed once per distinct set, the other overrides applied as Hydra applies them:
    the same configs as composing every cell."""
    overrides = ["+exp=fig_thresholds", "scale=smoke"]
    fast, full = composed_cells(overrides), exp_cells(overrides)
    assert [j for j, _ in fast] == [j for j, _ in full] and len(full) > 1
    assert [OmegaConf.to_yaml(c, resolve=True) for _, c in fast] == [OmegaConf.to_yaml(c, resolve=True) for _, c in full]


def test_no_committed_output_is_stale(hydra, monkeypatch, tmp_path):
    """Checked as a fresh clone sees the tree: an empty cache, so a DIMR mask the user searched
    (which ``method.slim.mask: auto`` reads before the pair's shipped list) cannot make committed
    outputs look stale on one machine and fresh on another; with the data folder, none is unchecked.
    Every committed frontier is priced by a committed cost file (none is exempt)."""
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path / "cache"))
    if REAL_DATA_DIR is not None:
        monkeypatch.setenv("VIASD_DATA_DIR", str(REAL_DATA_DIR))
    verdicts, _ = check_tree([PROJECT_ROOT / "paper_figures", PROJECT_ROOT / "bench_results"],
                             default_stores(runs_dir()))
    stale = [f"{v.line()}\n    fix: {v.fix}" for v in verdicts if v.state == STALE]
    assert not stale, "stale committed outputs:\n" + "\n".join(stale)
    if REAL_DATA_DIR is not None:  # with the data, a fresh clone decides every output: the masks its runs read
        unchecked = [v.line() for v in verdicts if v.state == UNCHECKED]  # are published (results/runs/_masks)
        assert not unchecked, "committed outputs a fresh clone cannot check:\n" + "\n".join(unchecked)


def test_report_reads_each_tables_own_sources_when_an_exp_writes_one_table_per_task(tmp_path, monkeypatch, capsys):
    import json

    import experiments.report as report

    out = tmp_path / "pf" / "cpu-large"
    out.mkdir(parents=True)
    (out / "verdict_mbpp.sources.json").write_text(json.dumps({"missing_ar": ["python -m experiments.run ar-mbpp"]}))
    (out / "verdict_gsm8k.sources.json").write_text(json.dumps({"missing_ar": []}))
    paths = [str(out / f"verdict_{t}.{s}") for t in ("mbpp", "gsm8k") for s in ("md", "tex")]
    monkeypatch.setattr(report, "build_all", lambda *a, **k: {"verdict": paths})
    assert report.main(["--runs", str(tmp_path / "runs"), "--results", "none", "--out", str(tmp_path / "pf")]) == 0
    printed = capsys.readouterr().out
    assert "verdict_mbpp.md" in printed and printed.count("create it with: python -m experiments.run ar-mbpp") == 1
