"""Published DIMR masks (viasd/dimr/publish.py, viasd/dimr/masks.py ``find_mask``): ``mask: auto`` reads the
results store's mask on a fresh clone, a cached one must be byte-equal to it, ``experiments.store publish``
copies a search run's mask (rebuilt from its records when the file is gone) and a run's mask with its search,
a published mask is never replaced, and a search the results store holds is not run again. The committed
SmolLM2 mask is the file the committed runs read (its sha256 is in their ids)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import yaml
from hydra import compose, initialize_config_dir

from experiments import store as store_cli
from viasd.dimr import publish as publish_mod
from viasd.dimr.masks import find_mask, mask_path, mask_source, published_mask_path
from viasd.dimr.publish import publish_masks, rebuilt_artifact
from viasd.errors import ConfigError
from viasd.harness.dimr_runs import run_search
from viasd.harness.runner import identity, run
from viasd.methods.via_sd import SlimConfig
from viasd.paths import PROJECT_ROOT
from viasd.tracking.store import RunStore, RunStores

SEARCH = ["pair=tiny-llama", "search.keep_ratio=0.5", "search.n_random=2", "search.n_trials=3", "search.n_calibration=4",
          "search.seq_len=16", "search.calibration=[builtin]", "search.n_baseline_random=1"]
VIA = ["pair=tiny-llama", "task=prompts", "seed=0", "task.n_examples=2", "generation.max_new_tokens=6",
       "method=via_sd", "method.slim.mask=auto", "method.slim.keep_ratio=0.5"]


def _compose(overrides):
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def clone(tmp_path, monkeypatch):
    """This machine's cache and the results store in tmp: ``(cache, results)``."""
    cache, results = tmp_path / "cache", tmp_path / "results"
    results.mkdir()
    monkeypatch.setenv("VIASD_CACHE_DIR", str(cache))
    monkeypatch.setenv("VIASD_RESULTS_DIR", str(results))
    return cache, results


def test_auto_reads_the_published_mask_and_a_cached_one_must_be_byte_equal(clone):
    key = ("tiny-llama", 0.5, "kl", "layers")
    slim = SlimConfig(mask="auto", keep_ratio=0.5)
    assert find_mask(*key) is None and mask_source("tiny-llama", {"slim_fallback": "every_other"}, slim).kind == \
        "fallback"
    cached, published = mask_path(*key), published_mask_path(*key)
    cached.parent.mkdir(parents=True)
    cached.write_text('{"layers": [0, 1]}\n')
    assert find_mask(*key) == ("artifact", cached)  # only this machine's cache has it: a fresh clone lacks it
    via_cached = identity(_compose(VIA))["inputs"]["method.slim.mask"]
    published.parent.mkdir(parents=True)
    shutil.copy(cached, published)
    assert find_mask(*key) == ("published", published) and mask_source("tiny-llama", {}, slim).kind == "published"
    assert identity(_compose(VIA))["inputs"]["method.slim.mask"] == via_cached == _sha(published)  # same bytes, same id
    cached.write_text('{"layers": [0, 2]}\n')  # a re-search on this machine
    with pytest.raises(ConfigError, match=f"cached at {cached} is not the one published at {published}") as e:
        find_mask(*key)
    assert "\n" not in str(e.value) and "remove the cached file" in str(e.value)
    with pytest.raises(ConfigError, match="is not the one published"):
        identity(_compose(VIA))  # a run stops before anything loads
    cached.unlink()
    assert find_mask(*key) == ("published", published)  # a fresh clone


def test_publish_carries_a_search_mask_and_a_run_mask_and_a_fresh_clone_reads_them(clone, tmp_path, monkeypatch,
                                                                                    capsys):
    cache, results = clone
    runs = tmp_path / "runs"
    monkeypatch.setenv("VIASD_RUNS_DIR", str(runs))
    searched = run_search(_compose([*SEARCH, f"tracking.store_dir={runs}"]))
    art = mask_path("tiny-llama", 0.5)
    assert searched["path"] == str(art) and searched["mask_sha256"] == _sha(art)
    assert rebuilt_artifact(RunStore(runs).path(searched["run_id"])) == art.read_bytes()  # its records rebuild it
    decoded = run(_compose([*VIA, f"tracking.store_dir={runs}"]))  # reads the cached mask
    meta = json.loads((RunStore(runs).path(decoded["run_id"]) / "meta.json").read_text())
    assert meta["inputs"]["method.slim.mask"] == {"path": str(art), "sha256": searched["mask_sha256"]}

    art.unlink()  # the machine's cache is gone: the run's mask comes back from its search run's records
    capsys.readouterr()
    assert store_cli.main(["publish", decoded["run_id"], "--runs", str(runs), "--to", str(results)]) == 0
    out = capsys.readouterr().out
    published = published_mask_path("tiny-llama", 0.5, root=results)
    assert f"its DIMR mask published to {published}" in out and f"{searched['run_id']}: published to" in out
    assert _sha(published) == searched["mask_sha256"] and (results / searched["run_id"] / "summary.json").is_file()
    assert store_cli.main(["publish", searched["run_id"], "--runs", str(runs), "--to", str(results)]) == 0
    assert "already published" in capsys.readouterr().out

    shutil.rmtree(runs)  # a fresh clone: empty cache, empty local store, the results store committed
    assert find_mask("tiny-llama", 0.5) == ("published", published)
    assert identity(_compose(VIA))["inputs"]["method.slim.mask"] == searched["mask_sha256"]  # the same run id
    again = run_search(_compose([*SEARCH, f"tracking.store_dir={runs}"]))
    assert "finished in the results store" in capsys.readouterr().out and again["path"] == str(published)
    assert not art.exists() and not (runs / searched["run_id"]).exists()  # nothing searched again

    published.write_text(published.read_text().replace('"n_layers"', '"n_layers" ', 1))  # doctored bytes
    with pytest.raises(ConfigError, match="published with other contents"):
        publish_masks([searched["run_id"]], RunStores.default(tmp_path / "none", results), results)


def test_a_search_whose_records_do_not_rebuild_its_mask_is_not_published(clone, tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    searched = run_search(_compose([*SEARCH, f"tracking.store_dir={runs}"]))
    folder = tmp_path / "copy"
    shutil.copytree(RunStore(runs).path(searched["run_id"]), folder)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["search"]["seed"] = 7  # not the config the search ran with
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    assert rebuilt_artifact(folder) is None
    mask_path("tiny-llama", 0.5).unlink()  # the file is gone, and the records no longer rebuild it (as after a
    monkeypatch.setattr(publish_mod, "json_text", lambda obj: "{}\n")  # SearchConfig field added since)
    with pytest.raises(SystemExit) as e:
        store_cli.main(["publish", searched["run_id"], "--runs", str(runs), "--to", str(clone[1])])
    assert e.value.code == 2 and "no file here has its sha256" in capsys.readouterr().err
    assert not published_mask_path("tiny-llama", 0.5, root=clone[1]).exists()


def test_the_committed_smollm2_mask_is_the_one_its_runs_and_search_recorded():
    results = PROJECT_ROOT / "results" / "runs"
    mask = results / "_masks" / "smollm2" / "keep0.80-kl.json"
    sha = _sha(mask)
    search = json.loads((results / "smollm2__dimr_search__calibration__8238f4be5c" / "summary.json").read_text())
    assert search["mask_sha256"] == sha and json.loads(mask.read_text())["layers"] == search["layers"]
    readers = [p.parent.name for p in results.glob("smollm2__via_sd__*/config.yaml")
               if (yaml.safe_load(p.read_text()).get("inputs") or {}).get("method.slim.mask") == sha]
    assert len(readers) >= 10  # the via_sd runs of paper_figures/local/{table2,table5,fig_tiers}
