"""DIMR search: artifact, pick-up by slim.mask=auto/path, baselines, sub-layer space, in-domain calibration,
held-out split, objectives, KL geometry (never NaN on widened heads)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.conftest import PROMPTS
from viasd.dimr.calibration import calibration_split, kl, resolve_runs, tv
from viasd.dimr.masks import every_other_mask, first_k_mask, mask_path, random_mask
from viasd.dimr.search import SearchConfig, kl_geometry, search_mask
from viasd.engine.routing import RoutingPlan
from viasd.errors import ConfigError
from viasd.harness.runner import identity
from viasd.methods.api import decode
from viasd.models.pairs import load_pair
from viasd.models.tiny import build_tiny_pair
from viasd.paths import PROJECT_ROOT
from viasd.tracking.proof import record_sha256
from viasd.tracking.store import RunStore, run_id_for


@pytest.fixture(scope="module")
def deep_pair():
    """A tiny Llama pair with an 8-layer target, so masks have room to differ."""
    return load_pair({"name": "tiny-llama-8", "loader": "tiny", "family": "llama",
                      "options": {"draft_layers": 1, "target_layers": 8, "hidden": 64, "damp": 0.5}})


def test_mask_helpers_keep_budget_first_and_last():
    for ratio in (0.3, 0.5, 0.8):
        for m in (random_mask(30, ratio, 3), every_other_mask(30, ratio)):
            assert m[0] == 0 and m[-1] == 29 and len(m) == round(ratio * 30)
        assert first_k_mask(30, ratio) == list(range(round(ratio * 30)))
    assert random_mask(30, 0.5, 1) == random_mask(30, 0.5, 1) != random_mask(30, 0.5, 2)


def test_search_writes_artifact_that_auto_picks_up(deep_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path))
    cfg = SearchConfig(keep_ratio=0.5, n_random=6, n_trials=12, n_calibration=6, seq_len=24,
                       objective="pythagorean", calibration=["builtin"])
    live: list[dict] = []
    art = search_mask(deep_pair, cfg, progress=False, on_trial=live.append)
    assert live == art["trials"]  # every trial reaches the callback as it is evaluated (W&B logs them live)
    path = mask_path("tiny-llama-8", 0.5, "pythagorean")
    saved = json.loads(path.read_text())
    assert saved["layers"] == art["layers"] and len(art["layers"]) == 4
    assert art["layers"][0] == 0 and art["layers"][-1] == 7
    # No early stop: every budget trial runs; screening (6 drops + the seed) is counted apart.
    phases = [t["phase"] for t in saved["trials"]]
    assert phases == ["screen"] * 6 + ["seed"] + ["random"] * 6 + ["bo"] * 6
    assert art["n_trials"] == 12 and art["n_screen"] == 7 and art["n_evaluations"] == len(phases) == 19
    assert art["value"] <= min(t["objective"] for t in saved["trials"] if t["phase"] != "screen") + 1e-9
    # The random baseline has as many evaluations as the search.
    assert len(art["baselines"]["random"]) == art["n_evaluations"]
    assert art["search_seconds"] > 0 and "first_k" in art["baselines"]
    gen = {"max_new_tokens": 12, "ignore_eos": True}
    slim = {"mask": "auto", "keep_ratio": 0.5, "objective": "pythagorean"}
    via = decode(deep_pair, PROMPTS[2], "viasd", {"slim": slim}, gen)
    explicit = decode(deep_pair, PROMPTS[2], "viasd", {"slim": {"mask": art["layers"]}}, gen)
    from_path = decode(deep_pair, PROMPTS[2], "viasd", {"slim": {"mask": str(path)}}, gen)
    assert via.tokens == explicit.tokens == from_path.tokens
    other = load_pair({"name": "tiny-llama-8", "loader": "tiny", "family": "llama",
                       "options": {"draft_layers": 1, "target_layers": 6}})
    with pytest.raises(ConfigError, match="searched for a model with 8 layers"):
        decode(other, PROMPTS[2], "viasd", {"slim": slim}, gen)


def test_corrupt_mask_file_is_a_clear_error(tmp_path, deep_pair):
    bad = tmp_path / "mask.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not a valid mask artifact"):
        decode(deep_pair, "hi", "viasd", {"slim": {"mask": str(bad)}})


def test_kl_geometry_terms(deep_pair):
    out = kl_geometry(deep_pair, [0, 3, 7], PROMPTS[:6], seq_len=16)
    assert out["kl_p_q"] > 0 and out["kl_q_slim"] > 0
    full = kl_geometry(deep_pair, None, PROMPTS[:6], seq_len=16)
    assert full["kl_q_slim"] == pytest.approx(0.0, abs=1e-6) and full["kl_p_slim"] == pytest.approx(full["kl_p_q"])
    assert 0 <= out["tv_p_q"] <= 1
    # per calibration row (the sample fig_kl's intervals resample): rows of equal length, so they average
    # back to the token means, also when a row spans two statistics chunks and batches are uneven
    small = kl_geometry(deep_pair, [0, 3, 7], PROMPTS[:6], seq_len=16, batch_size=4, stat_mib=0.05)
    for key in ("kl_p_q", "kl_p_slim", "kl_slim_q"):
        rows = small["per_text"][key]
        assert len(rows) == len(out["per_text"][key]) > 2 and all(v >= 0 for v in rows)
        assert sum(rows) / len(rows) == pytest.approx(out[key], rel=1e-4)


def test_sublayer_search_reads_the_parameter_budget_and_auto_picks_it_up(deep_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path))
    cfg = SearchConfig(keep_ratio=0.5, n_random=3, n_trials=5, n_calibration=8, seq_len=16, objective="kl",
                       calibration=["builtin"], space="sublayers", held_out=0.25, n_baseline_random=3)
    art = search_mask(deep_pair, cfg, progress=False)
    assert art["space"] == "sublayers" and RoutingPlan.build(art["layers"], 8).attn[0] == 0
    assert any(isinstance(t["layers"], dict) for t in art["trials"])  # candidates keep attention and MLPs apart
    assert sum(t["phase"] == "screen" for t in art["trials"]) == 2 * 6  # every middle attention and MLP alone
    assert all(t["param_fraction"] <= 0.5 + 1e-9 for t in art["trials"] if t["phase"] != "screen")
    for t in art["trials"]:  # every objective is reported for every mask (the pair has a draft: Pythagorean too)
        assert {"kl_q_slim", "top1_agreement", "confident_top1", "confident_share", "pythagorean"} <= set(t)
    held = art["held_out"]
    assert set(held) >= {"searched", "first_k", "every_other", "random_best"} and held["tokens"] > 0
    assert held["searched"]["layers"] == art["layers"]
    assert mask_path("tiny-llama-8", 0.5, "kl", "sublayers").is_file()
    gen = {"max_new_tokens": 10, "ignore_eos": True}
    auto = decode(deep_pair, PROMPTS[2], "viasd", {"slim": {"mask": "auto", "keep_ratio": 0.5, "space": "sublayers"}},
                  gen)
    assert auto.tokens == decode(deep_pair, PROMPTS[2], "viasd", {"slim": {"mask": art["layers"]}}, gen).tokens


def _fake_run(store, pair, prompts):
    """A finished ``ar`` run folder of ``pair`` on ``prompts`` that proves itself (its config hashes to its id)."""
    cfg = {"pair": {"name": pair}, "method": {"name": "ar"}, "task": {"name": "prompts"}}
    run = RunStore(store).open(run_id_for(cfg), cfg)
    for i, p in enumerate(prompts):
        run.log_example({"id": str(i), "prompt": p, "token_ids": list(range(40, 72))})
    run.finish({"pair": pair, "method": "ar", "task": "prompts", "n_examples": len(prompts)})
    return run.path


def test_in_domain_calibration_reads_stored_runs_and_holds_some_out(deep_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path))
    store = tmp_path / "runs"
    _fake_run(store, "tiny-llama-8", PROMPTS[:8])
    cfg = SearchConfig(keep_ratio=0.5, n_random=2, n_trials=3, n_calibration=8, seq_len=24, objective="confident_top1",
                       calibration_runs=["ar:prompts"], held_out=0.25, n_baseline_random=2, screen=False)
    search, held, info = calibration_split(deep_pair, cfg, store)
    assert info["kind"] == "runs" and info["examples"] == 8 and info["held_out_examples"] == 2
    assert len(search) == 6 and len(held) == 2 and all(len(c) == 24 for c in search + held)
    assert search[0][-1] == 71  # windows start from the end: the generated tokens come first
    art = search_mask(deep_pair, cfg, progress=False, store_dir=store)
    assert art["calibration"]["kind"] == "runs" and art["objective"] == "confident_top1"
    assert art["value"] == pytest.approx(1 - art["confident_top1"])
    with pytest.warns(UserWarning, match="calibrating on the built-in prompts"):
        _, _, info = calibration_split(deep_pair, SearchConfig(calibration_runs=["sd:xsum"], seq_len=16), store)
    assert info == {"kind": "texts", "sources": ["builtin"]}


def test_kl_and_tv_never_nan_on_widened_heads(tmp_path):
    """Like Qwen2.5 0.5B → 7B: one tokenizer, a draft head narrower than the target's (widened with −∞)."""
    draft, target, tok = build_tiny_pair("qwen2")
    target.resize_token_embeddings(len(tok) + 12)
    for name, model in (("t", target), ("d", draft)):
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    pair = load_pair({"name": "hf", "loader": "hf", "target": {"id": str(tmp_path / "t")},
                      "draft": {"id": str(tmp_path / "d")}})
    out = kl_geometry(pair, [0, 1, 3], PROMPTS[:6], seq_len=16)
    per_text = out.pop("per_text")
    assert all(math.isfinite(v) for v in out.values()), out
    assert all(math.isfinite(v) for rows in per_text.values() for v in rows), per_text
    a = torch.log_softmax(torch.tensor([[1.0, 2.0, float("-inf")]]), -1)
    b = torch.log_softmax(torch.tensor([[0.5, 1.0, 3.0]]), -1)
    assert math.isfinite(float(kl(a, b))) and math.isfinite(float(tv(a, b))) and float(kl(a, a)) == 0.0


def test_keep_first_bounds_where_an_escalation_resumes(deep_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path))
    for space in ("layers", "sublayers"):
        cfg = SearchConfig(keep_ratio=0.6, n_random=3, n_trials=4, n_calibration=4, seq_len=16, calibration=["builtin"],
                           space=space, keep_first=3, n_baseline_random=1)
        art = search_mask(deep_pair, cfg, progress=False)
        for t in art["trials"]:
            if t["phase"] != "screen":
                plan = RoutingPlan.build(t["layers"], 8)
                assert plan.first_skipped(8) >= 6 and {0, 1, 2, 7} <= set(plan.layers), (space, t["layers"])
    with pytest.raises(ConfigError, match="lower search.keep_first"):
        search_mask(deep_pair, SearchConfig(keep_ratio=0.25, keep_first=3, calibration=["builtin"]), progress=False)


def test_an_in_domain_search_id_follows_the_runs_it_reads(tmp_path):
    run = _fake_run(tmp_path / "runs", "tiny-llama", PROMPTS[:3])

    def search_id(*overrides):
        with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=["pair=tiny-llama", f"tracking.store_dir={tmp_path / 'runs'}",
                                                           *overrides])
        return identity(cfg, "search"), run_id_for(identity(cfg, "search"))

    plain, plain_id = search_id()
    assert "inputs" not in plain  # searches without stored runs keep their ids
    resolved, first = search_id("search.calibration_runs=[ar:prompts]")
    assert list(resolved["inputs"]["search.calibration_runs"]) == [run.name]
    shutil.rmtree(run)
    assert _fake_run(tmp_path / "runs", "tiny-llama", PROMPTS[:4]) == run  # the same run, one example more
    assert search_id("search.calibration_runs=[ar:prompts]")[1] not in (first, plain_id)


def test_calibration_runs_resolve_in_the_committed_results_store_longest_then_first_started(tmp_path, monkeypatch):
    """A fresh clone resolves ``ar:<task>`` to the committed run its searches read; a later run of the
    same length (e.g. an interleaved verdict ``ar`` cell) does not change the choice, a longer one does."""
    results, user = tmp_path / "results", tmp_path / "runs"
    monkeypatch.setenv("VIASD_RESULTS_DIR", str(results))

    def run(store, seed, n, started):
        cfg = {"pair": {"name": "tiny-llama"}, "method": {"name": "ar"}, "task": {"name": "prompts"}, "seed": seed}
        r = RunStore(store).open(run_id_for(cfg), cfg)
        for i in range(n):
            r.log_example({"id": str(i), "prompt": PROMPTS[i], "token_ids": list(range(40, 72))})
        r.finish({"pair": "tiny-llama", "method": "ar", "task": "prompts", "n_examples": n})
        meta = {**json.loads((r.path / "meta.json").read_text()), "started": started}
        (r.path / "meta.json").write_text(json.dumps(meta))
        summary = json.loads((r.path / "summary.json").read_text())  # sealed again: the checksum covers meta
        summary["record_sha256"] = record_sha256(summary, json.loads((r.path / "meta.json").read_text()))
        (r.path / "summary.json").write_text(json.dumps(summary))
        return r.path

    first = run(results, 1, 3, "2026-12-01T10:00:00")
    assert resolve_runs(["ar:prompts"], "tiny-llama", user) == [first]
    run(user, 2, 3, "2026-12-02T10:00:00")  # same length, started later: not chosen, in either store
    run(results, 3, 3, "2026-12-03T10:00:00")
    assert resolve_runs(["ar:prompts"], "tiny-llama", user) == [first]
    longer = run(user, 4, 4, "2026-12-04T10:00:00")
    assert resolve_runs(["ar:prompts"], "tiny-llama", user) == [longer]


def test_an_interrupted_search_resumes_from_the_trials_it_finished(deep_pair, tmp_path, monkeypatch):
    """The samplers are seeded and the objective deterministic: a resumed search proposes the same masks,
    looks the finished ones up instead of evaluating them, and ends where an uninterrupted one ends."""
    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path))
    for space in ("layers", "sublayers"):
        cfg = SearchConfig(keep_ratio=0.5, n_random=3, n_trials=6, n_calibration=4, seq_len=16, calibration=["builtin"],
                           space=space, n_baseline_random=2)
        full = search_mask(deep_pair, cfg, progress=False)
        cut = full["trials"][:9]
        resumed = search_mask(deep_pair, cfg, progress=False, resume=cut)
        strip = (lambda trials: [{k: v for k, v in t.items() if k != "elapsed_s"} for t in trials])
        assert strip(resumed["trials"]) == strip(full["trials"]) and resumed["layers"] == full["layers"], space
        assert resumed["resumed_evaluations"] == len({json.dumps(t["layers"], sort_keys=True) for t in cut})
        assert full["resumed_evaluations"] == 0 and resumed["search_seconds"] >= cut[-1]["elapsed_s"]


def test_a_killed_search_run_resumes_in_the_store(tmp_path, monkeypatch, capsys):
    """Through the run store (`python -m experiments.search`): each trial is logged as it is evaluated, so a
    process killed mid-search leaves its trials, and the same command finishes the run from them."""
    from viasd.harness.dimr_runs import run_search

    monkeypatch.setenv("VIASD_CACHE_DIR", str(tmp_path))
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "pair=tiny-llama", f"tracking.store_dir={tmp_path / 'runs'}", "search.keep_ratio=0.5", "search.n_random=2",
            "search.n_trials=4", "search.n_calibration=4", "search.seq_len=16", "search.calibration=[builtin]",
            "search.n_baseline_random=1"])
    first = run_search(cfg)
    folder = RunStore(tmp_path / "runs").path(first["run_id"])
    lines = (folder / "examples.jsonl").read_text().splitlines()
    (folder / "summary.json").unlink()  # as if the process had been killed after its first trials
    (folder / "examples.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # and mid-line
    # carried to another machine: stashed, the local folder lost, restored
    from viasd.tracking.results import restore, stash
    stash([first["run_id"]], RunStore(tmp_path / "runs"), tmp_path / "stash")
    shutil.rmtree(folder)
    restore(tmp_path / "stash", RunStore(tmp_path / "runs"))
    capsys.readouterr()
    again = run_search(cfg)
    assert "resuming the search after 3 trials" in capsys.readouterr().out
    assert again["resumed_evaluations"] == 3 and again["layers"] == first["layers"]
    found = RunStore(tmp_path / "runs").find(first["run_id"])
    assert found is not None  # finished and proves itself (line count, checksum)
    after = (folder / "examples.jsonl").read_text().splitlines()
    layers = (lambda rows: [(json.loads(r)["layers"], json.loads(r)["objective"]) for r in rows])
    assert layers(after) == layers(lines)
