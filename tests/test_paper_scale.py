"""Paper scale without surprises (issue 28): the slim verifier's mask source, the sandbox preflight before
any cell, pinned hub data recorded at load, and run ids of the offline-file runs unchanged by the pins."""

from __future__ import annotations

import json
import warnings

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import viasd.harness.dryrun as dr
from tests.test_hub_data import _hub_rows, _write_hub
from viasd.dimr.masks import mask_path, mask_source
from viasd.errors import ConfigError
from viasd.harness import prereq, runner
from viasd.harness.config import PINNED_AFTER_RUNS
from viasd.harness.grid import check_prerequisites, compose_cells
from viasd.methods.api import decode
from viasd.methods.via_sd import SlimConfig
from viasd.models.pairs import load_pair
from viasd.paths import PROJECT_ROOT
from viasd.tasks import build_task, sandbox
from viasd.tasks.families import HUB
from viasd.tasks.loading import hub_data_files, is_commit, resolve_hub, use_hub_resolver
from viasd.tracking.store import RunStore, run_id_for

CONF = PROJECT_ROOT / "conf"
PAPER_VIA = ["+exp=table2", "scale=paper", "method=via_sd", "task=humaneval"]  # one via_sd cell per paper pair


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path / "cache"))  # no searched mask unless a test writes one
    monkeypatch.setenv("VIASD_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("VIASD_DRYRUN_GPUS", raising=False)


@pytest.fixture(scope="module")
def paper_cells():
    return compose_cells(PAPER_VIA)


def _artifact(pair: str, ratio: float, n_layers: int) -> None:
    path = mask_path(pair, ratio, "kl")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pair": pair, "n_layers": n_layers, "layers": [0, n_layers - 1]}))


def test_mask_source_names_every_kind():
    slim = SlimConfig(mask="auto", keep_ratio=0.8)
    smollm2 = OmegaConf.to_container(OmegaConf.load(CONF / "pair" / "smollm2.yaml"))["options"]
    assert mask_source("smollm2", smollm2, SlimConfig(mask="auto", keep_ratio=0.7)).kind == "shipped"
    margin = mask_source("smollm2", smollm2, SlimConfig(mask="auto", keep_ratio=0.7, objective="margin"))
    assert margin.kind == "search" and "search.objective=margin" in margin.detail  # shipped masks are KL's
    assert mask_source("smollm2", smollm2, slim).kind == "published"  # results/runs/_masks/smollm2/keep0.80-kl.json
    assert mask_source("tiny-llama", {"slim_fallback": "every_other"}, slim).describe() == \
        "pair fallback: every_other (pair.options.slim_fallback)"
    src = mask_source("gemma2-2b-9b", {}, slim, scale="paper")
    assert src.kind == "search" and src.detail == \
        "python -m experiments.run +exp=table1 scale=paper pair=gemma2-2b-9b search.keep_ratio=0.8"
    assert mask_source("hf", {}, SlimConfig(keep_ratio=0.5, objective="pythagorean")).detail == \
        "python -m experiments.search pair=hf search.keep_ratio=0.5 search.objective=pythagorean"
    _artifact("gemma2-2b-9b", 0.8, 42)
    assert mask_source("gemma2-2b-9b", {}, slim).kind == "artifact"
    assert mask_source("x", {}, SlimConfig(mask="every_other")).describe() == "explicit ablation: every_other"
    assert mask_source("x", {}, SlimConfig(mask=[0, 3])).kind == "explicit"
    with pytest.raises(ConfigError, match="unknown slim.mask 'evry_other'"):
        mask_source("x", {}, SlimConfig(mask="evry_other"))
    with pytest.raises(ConfigError, match="slim_fallback must be one of every_other, first_k, random"):
        mask_source("x", {"slim_fallback": "full"}, slim)


def test_auto_without_a_mask_is_one_error_never_every_other():
    pair = load_pair("tiny-llama")
    ids = pair.encode("The cat sat on the mat.")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the pair's named fallback is asked for: no warning
        assert decode(pair, ids, "viasd", {"gamma": 2}, {"max_new_tokens": 3}).tokens
    pair.extras.pop("slim_fallback")
    pair.extras.pop("_slim_plans", None)
    with pytest.raises(ConfigError, match=r"no DIMR mask for pair 'tiny-llama' at keep_ratio=0\.80 .*"
                                          r"`python -m experiments\.search pair=tiny-llama search\.keep_ratio=0\.8`"):
        decode(pair, ids, "viasd", {"gamma": 2}, {"max_new_tokens": 3})


def test_a_run_refuses_before_loading_the_models(monkeypatch):
    monkeypatch.setattr(runner, "cached_pair", lambda *a, **k: pytest.fail("the run loaded a model"))
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["pair=tiny-llama", "method=via_sd", "task=prompts",
                                                       "pair.options.slim_fallback=null"])
    with pytest.raises(ConfigError, match="search it first with `python -m experiments.search pair=tiny-llama"):
        runner.run(cfg)


def test_paper_grid_stops_before_its_first_cell_with_the_search_commands(paper_cells):
    assert {c.pair.name for c in paper_cells} == {"gemma2-2b-9b", "llama2-7b-70b", "qwen2.5-0.5b-7b"}
    with pytest.raises(ConfigError) as e:
        check_prerequisites(paper_cells)
    msg = str(e.value)
    assert "\n" not in msg and "3 cell(s) use method.slim.mask=auto" in msg
    for pair in ("gemma2-2b-9b", "llama2-7b-70b", "qwen2.5-0.5b-7b"):
        assert f"`python -m experiments.run +exp=table1 scale=paper pair={pair} search.keep_ratio=0.8`" in msg
    for pair, n in (("gemma2-2b-9b", 42), ("llama2-7b-70b", 80), ("qwen2.5-0.5b-7b", 28)):
        _artifact(pair, 0.8, n)
    assert prereq.missing_masks(paper_cells) == {}
    assert {prereq.cell_mask_source(c).kind for c in paper_cells} == {"artifact"}


def test_dry_run_shows_mask_source_and_sandbox_check(paper_cells, capsys):
    assert len(dr.dry_run(paper_cells, "table2")) == 3  # a search still to run is a step of the plan, not an error
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("[viasd] before this grid can start: ")
    assert "3 cell(s) use method.slim.mask=auto" in out.strip().splitlines()[-1]
    assert out.count("slim mask    search to run: python -m experiments.run +exp=table1 scale=paper pair=") == 3
    plan = sandbox._isolation()[0]
    ok = f"sandbox: {plan.level} (isolated)" if plan else "REFUSED: refusing to execute"
    assert f"[viasd] preflight of humaneval: {ok}" in out and "nothing was downloaded" in out


def test_preflight_runs_once_per_task_and_a_refusal_stops_the_grid(monkeypatch, capsys):
    cells = compose_cells(["+exp=table2", "scale=smoke", "task=humaneval,mbpp,gsm8k", "method=ar,sd"])
    calls = []
    monkeypatch.setattr(sandbox, "_isolation", lambda: (calls.append(1), (None, "simulated: no CAP_SYS_ADMIN"))[1])
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    checks = prereq.task_preflights(cells)
    assert [(c.tasks, c.error is not None) for c in checks] == [(["humaneval", "mbpp"], True), (["gsm8k"], False)]
    assert len(calls) == 2  # humaneval and mbpp, once each (6 code cells)
    with pytest.raises(ConfigError, match=r"humaneval, mbpp: refusing to execute generated code: .*simulated"):
        check_prerequisites(cells)
    out = (dr.dry_run(cells, "table2"), capsys.readouterr().out)[1]
    assert "preflight of humaneval, mbpp: REFUSED: refusing" in out
    assert "before this grid can start: humaneval, mbpp: refusing to execute generated code" in out


def test_every_task_hub_revision_is_a_commit_or_recorded_at_load():
    branches = {name for name, hub in HUB.items() if not is_commit(hub["revision"])}
    assert branches == {"xsum"}, "pin the hub commit in conf/task/<name>.yaml"
    assert HUB["xsum"]["revision"] == "refs/convert/parquet"
    assert {HUB[t]["path"]: HUB[t]["revision"] for t in ("cnndm", "wmt14_deen", "nq_open", "mbpp")} == PINNED_AFTER_RUNS


def test_the_hub_path_reads_and_records_what_the_branch_resolved_to(tmp_path, monkeypatch):
    """A fake resolver stands in for the hub API: the rows are read at the commit it names, and the
    run's meta.json records that commit and the file hashes."""
    root = tmp_path / "hub"
    _write_hub(root, "xsum", [_hub_rows("xsum", i) for i in range(6)])
    fake = {"commit": "c0ffee" * 6 + "c0ff", "files": {"default/test/0000.parquet": "ab" * 32}}
    seen = []
    with use_hub_resolver(lambda hub: (seen.append(dict(hub)), fake)[1]):
        task = build_task({"name": "xsum", "source": "hub", "hub_root": str(root), "n_examples": 2})
        assert task.hub_record() == {"path": "EdinburghNLP/xsum", "revision": "refs/convert/parquet", **fake}
        assert hub_data_files(task.cfg["hub"], None, fake["commit"]) == \
            f"hf://datasets/EdinburghNLP/xsum@{fake['commit']}/default/test/*.parquet"
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[
                "pair=tiny-llama", "method=ar", "task=xsum", "task.source=hub", f"task.hub_root={root}",
                "task.n_examples=1", "generation.max_new_tokens=2"])
        summary = runner.run(cfg)
    assert len(seen) == 1  # resolved once per process and spec
    meta = json.loads((RunStore(cfg.tracking.store_dir).path(summary["run_id"]) / "meta.json").read_text())
    assert meta["task_hub"]["commit"] == fake["commit"] and meta["task_hub"]["files"] == fake["files"]
    mirror = resolve_hub(task.cfg["hub"], "xsum", str(root))  # the real mirror record: file sha256s, no commit
    assert mirror["commit"] is None and list(mirror["files"]) == ["default/test/0000.parquet"]


#: Ids recorded before the pins (commit 3180974) for runs that read the offline files, whose contents
#: here are the one line {"fixture": 1}: the pins must not rename them.
LOCAL_IDS = {
    "task=cnndm pair=tiny-llama method=ar": "tiny-llama__ar__cnndm__33955db934",
    "task=mbpp pair=qwen2.5-coder-0.5b-1.5b method=via_sd": "qwen2.5-coder-0.5b-1.5b__via_sd__mbpp__1d9b72630b",
    "task=nq_open pair=tiny-llama method=ar": "tiny-llama__ar__nq_open__d4f2e93c4f",
    "task=wmt14_deen pair=qwen2.5-coder-0.5b-1.5b method=via_sd":
        "qwen2.5-coder-0.5b-1.5b__via_sd__wmt14_deen__357b66f28a",
}


def test_pins_keep_the_run_ids_of_offline_file_runs(tmp_path, monkeypatch):
    for task in ("cnndm", "mbpp", "nq_open", "wmt14_deen"):
        f = tmp_path / build_task({"name": task}).cfg["offline_file"]
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text('{"fixture": 1}\n')
    monkeypatch.setenv("VIASD_DATA_DIR", str(tmp_path))
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for overrides, rid in LOCAL_IDS.items():
            cfg = compose(config_name="config", overrides=overrides.split())
            assert run_id_for(runner.identity(cfg)) == rid, overrides
            assert is_commit(cfg.task.hub.revision)  # the config itself is pinned
