"""VIA-SD at its limits, its knobs, and its counters."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import FAMILIES, PROMPTS, tiny_pair
from viasd.core.tiers import agreement_scores
from viasd.errors import ConfigError
from viasd.methods.api import decode

OFF = {"tau_accept": 1.01, "tau_slim": 1.5}


@pytest.mark.parametrize("family", FAMILIES)
def test_tiers_off_equals_sd_and_greedy_target(family):
    pair = tiny_pair(family)
    for prompt in PROMPTS[:12]:
        ids = pair.encode(prompt)
        gen = {"max_new_tokens": 19, "ignore_eos": True}
        ar = decode(pair, ids, "ar", gen=gen).tokens
        for gamma in (1, 4):
            sd = decode(pair, ids, "sd", {"gamma": gamma}, gen).tokens
            via = decode(pair, ids, "viasd", {"gamma": gamma, **OFF, "slim": {"mask": "every_other"}}, gen)
            assert via.tokens == sd == ar
            assert via.counters.tiers.get("tier1_accepted", 0) == 0
            assert via.counters.tiers.get("tier2_regenerated", 0) == 0


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_tiers_off_equals_sd_when_sampling(family):
    pair = tiny_pair(family)
    ids = pair.encode(PROMPTS[2])
    gen = {"max_new_tokens": 25, "ignore_eos": True, "temperature": 1.0}
    for seed in range(3):
        sd = decode(pair, ids, "sd", {"gamma": 3}, gen, seed=seed).tokens
        via = decode(pair, ids, "viasd", {"gamma": 3, **OFF, "slim": {"mask": "random"}}, gen, seed=seed).tokens
        assert via == sd


def test_full_slim_rewriting_every_token_is_greedy_lossless():
    """With q' = q (mask=full), tier 1 off and tier 2 always on, every token is q's own argmax."""
    pair = tiny_pair("qwen2")
    ids = pair.encode(PROMPTS[7])
    gen = {"max_new_tokens": 30, "ignore_eos": True}
    ar = decode(pair, ids, "ar", gen=gen).tokens
    via = decode(pair, ids, "viasd", {"gamma": 3, "tau_accept": 1.5, "tau_slim": 0.0, "slim": {"mask": "full"}}, gen)
    assert via.tokens == ar
    empty = sum(r.drafted == 0 for r in via.rounds)  # the last round may draft nothing: it escalates
    assert via.models["target"].calls == empty <= 1  # everything else handled by tier 2
    assert {r.extra["action"] for r in via.rounds if r.drafted} <= {"slim_rewrite", "slim_bonus", "end"}
    assert via.counters.tiers.get("tier1_accepted", 0) == 0  # tier 2 (rewrite or keep) decided every token


def _run(pair, knobs, prompts=PROMPTS[:4], n=40):
    """Greedy viasd over a few prompts: (all tokens, summed tier counters)."""
    tokens, tiers = [], {}
    for prompt in prompts:
        res = decode(pair, pair.encode(prompt), "viasd",
                     {"gamma": 4, "tau_slim": 0.05, "slim": {"mask": "every_other"}, **knobs},
                     {"max_new_tokens": n, "ignore_eos": True})
        tokens.append(res.tokens)
        for k, v in res.counters.tiers.items():
            tiers[k] = tiers.get(k, 0) + v
    return tokens, tiers


def test_thresholds_change_greedy_output_and_tier_counters():
    """The gate reads raw distributions, so the bands matter in greedy mode too."""
    pair = tiny_pair("llama")
    lo, hi = _run(pair, {"tau_accept": 0.3}), _run(pair, {"tau_accept": 0.9})
    assert lo[0] != hi[0] and lo[1] != hi[1]
    assert lo[1]["tier1_accepted"] > hi[1]["tier1_accepted"]
    no_band, band = _run(pair, {"tau_accept": 0.9, "tau_escalate": 0.0}), _run(pair, {"tau_accept": 0.9, "tau_escalate": 0.5})
    assert no_band[0] != band[0] and no_band[1] != band[1]
    assert band[1]["escalations"] > no_band[1]["escalations"]
    assert band[1]["tier2_regenerated"] < no_band[1]["tier2_regenerated"]


def test_gate_temperature_changes_routing():
    pair = tiny_pair("llama")
    assert _run(pair, {"tau_accept": 0.6})[1] != _run(pair, {"tau_accept": 0.6, "gate_temperature": 0.25})[1]


def test_common_rejection_rate_and_full_model_calls_per_token():
    """accepted = drafted tokens emitted as drafted (tier 1, a tier-2 rewrite equal to the draft, tier 3)."""
    pair = tiny_pair("llama")
    res = decode(pair, pair.encode(PROMPTS[2]), "viasd",
                 {"gamma": 4, "tau_accept": 0.9, "tau_slim": 0.05, "slim": {"mask": "every_other"}},
                 {"max_new_tokens": 40, "ignore_eos": True})
    c, t, s = res.counters, res.counters.tiers, res.summary()
    assert t.get("tier1_accepted", 0) + t.get("tier2_kept", 0) + t.get("tier3_accepted", 0) == c.accepted
    assert s["rejection_rate"] == pytest.approx(1 - c.accepted / c.drafted)
    assert s["target_calls_per_token"] == pytest.approx(res.models["target"].calls / res.new_tokens)


@pytest.mark.parametrize("knobs", [
    {"agreement": "tv"}, {"max_unverified": 3}, {"tau_escalate": 0.3}, {"gate_temperature": 2.0}, {"reverify_on_escalation": True}, {"slim_bonus": False},
    {"drafter": {"name": "ngram"}}, {"drafter": {"name": "self", "layers": [0, 1]}},
    {"drafter": {"length_policy": "heuristic"}}, {"slim": {"mask": [0, 3]}}, {"slim": {"mask": "first_k"}},
])
def test_knobs_run_and_count_consistently(knobs):
    pair = tiny_pair("llama")
    res = decode(pair, pair.encode(PROMPTS[3]), "viasd", {"gamma": 4, "tau_accept": 0.5, "tau_slim": 0.2, **knobs},
                 {"max_new_tokens": 24, "ignore_eos": True})
    c, t = res.counters, res.counters.tiers
    assert res.new_tokens == 24
    assert c.accepted + c.rejected == c.drafted
    assert t.get("tier3_accepted", 0) + t.get("tier1_accepted", 0) + t.get("tier2_kept", 0) == c.accepted
    assert t.get("escalations", 0) == res.models["target"].calls
    assert sum(r.accepted for r in res.rounds) == c.accepted
    assert t.get("escalations", 0) + t.get("tier2_regenerated", 0) + t.get("slim_bonus", 0) <= c.rounds


def test_max_unverified_zero_forces_full_verification():
    pair = tiny_pair("llama")
    ids = pair.encode(PROMPTS[3])
    gen = {"max_new_tokens": 20, "ignore_eos": True}
    res = decode(pair, ids, "viasd", {"gamma": 3, "tau_accept": 0.0, "tau_slim": 0.0, "max_unverified": 0,
                                      "slim": {"mask": "every_other"}}, gen)
    assert res.tokens == decode(pair, ids, "ar", gen=gen).tokens
    assert res.counters.tiers["escalations"] == res.counters.rounds


def test_agreement_scores_by_hand():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.2, 0.6]])
    q = torch.tensor([[0.25, 0.75, 0.0], [0.6, 0.2, 0.2]])
    y = torch.tensor([0, 2])
    assert torch.allclose(agreement_scores(p, q, y, "ratio"), torch.tensor([0.5, 1 / 3]))
    assert torch.allclose(agreement_scores(p, q, y, "tv"), torch.tensor([0.75, 0.6]))


@pytest.mark.parametrize("knobs,match", [
    ({"tau_accept": -0.1}, "tau_accept must be >= 0"),
    ({"tau_slim": -1}, "tau_slim must be >= 0"),
    ({"tau_escalate": -0.5}, "tau_escalate must be >= 0"),
    ({"tau_accept": 0.5, "tau_escalate": 0.6}, "need 0 <= tau_escalate <= tau_accept"),
    ({"gate_temperature": 0}, "gate_temperature must be > 0"),
    ({"tau_accept": "high"}, "tau_accept must be a number"),
    ({"agreement": "kl"}, "agreement must be"),
    ({"slim": {"mask": [0, 9]}}, "does not fit the model"),
    ({"slim": {"mask": "independent"}}, "needs an intermediate model"),
    ({"slim": {"mask": "bogus"}}, "unknown slim.mask"),
    ({"slim": {"mask": "/nonexistent/mask.json"}}, "mask file not found"),
])
def test_bad_viasd_config(knobs, match):
    pair = tiny_pair("llama")
    with pytest.raises(ConfigError, match=match):
        decode(pair, "hello", "viasd", knobs)
