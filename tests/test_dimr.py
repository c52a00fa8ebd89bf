"""DIMR search: artifact, pick-up by slim.mask=auto/path, baselines, KL geometry."""

from __future__ import annotations

import json

import pytest

from tests.conftest import PROMPTS
from viasd.dimr.masks import every_other_mask, first_k_mask, mask_path, random_mask
from viasd.dimr.search import SearchConfig, kl_geometry, search_mask
from viasd.errors import ConfigError
from viasd.methods.api import decode
from viasd.models.pairs import load_pair


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
