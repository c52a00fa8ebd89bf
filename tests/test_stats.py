"""Paired statistics (viasd.analysis.stats) against known values, and the audit of VIA-SD."""

from __future__ import annotations

import math

import pytest

from tests.conftest import PROMPTS, tiny_pair
from viasd.analysis.stats import is_binary, mcnemar, paired_delta, quality_delta, speedup_ci, wilson
from viasd.methods.api import decode


def test_mcnemar_is_the_exact_binomial_on_discordant_pairs():
    # 8 discordant pairs all one way: p = 2 * 0.5**8 (docs/metrics.md §6: a 20-point drop on 40 problems)
    run, ar = [0] * 8 + [1] * 32, [1] * 40
    m = mcnemar(run, ar)
    assert m.n == 40 and m.p == pytest.approx(2 * 0.5 ** 8) and m.estimate == pytest.approx(-0.2)
    assert m.detail == "0 better / 8 worse"
    assert mcnemar([1, 0, 1], [1, 0, 1]).p == 1.0  # no discordant pair
    assert mcnemar([0, 1, 1, 1, 1], [1, 0, 0, 0, 0]).p == pytest.approx(0.375)  # 4 vs 1 of 5 discordant


def test_continuous_scores_get_a_paired_bootstrap_interval_and_wilcoxon():
    run = [0.30, 0.42, 0.25, 0.51, 0.40, 0.33, 0.29, 0.45]
    ar = [x - 0.05 for x in run]
    d = paired_delta(run, ar)
    assert d.estimate == pytest.approx(0.05) and d.lo == pytest.approx(0.05) and d.hi == pytest.approx(0.05)
    assert d.p < 0.01 and d.test == "Wilcoxon signed-rank"
    noisy = paired_delta(run, list(reversed(run)))
    assert noisy.lo < noisy.estimate < noisy.hi and noisy.p > 0.05
    assert is_binary([1, 0, 1.0]) and not is_binary([0.5, 1])
    # per-example pass@1 / accuracy are percentages: 0 or 100 is pass/fail too (McNemar, not Wilcoxon)
    assert is_binary([100.0, 0.0, 100]) and not is_binary([0, 1, 100]) and not is_binary([50.0, 100.0])
    q = quality_delta([100.0, 100.0, 0.0, 100.0], [0.0, 100.0, 100.0, 0.0])
    assert q.test == "McNemar (exact)" and q.detail == "2 better / 1 worse" and q.estimate == pytest.approx(25.0)
    assert quality_delta([1, 0], [1, 1]).test.startswith("McNemar") and quality_delta(run, ar).test.startswith("Wil")


def test_speedup_ci_is_a_ratio_of_sums_with_a_bootstrap_interval():
    tokens, secs = [100, 200, 150, 120], [1.0, 2.0, 1.2, 1.1]
    ar_secs = [2.0, 4.2, 2.5, 2.0]
    s = speedup_ci(tokens, secs, tokens, ar_secs)
    assert s.estimate == pytest.approx((570 / 5.3) / (570 / 10.7)) and s.lo <= s.estimate <= s.hi and s.n == 4
    assert math.isnan(speedup_ci([10], [1.0], [10], [2.0]).lo)  # one example: no interval


def test_wilson_interval():
    lo, hi = wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert all(math.isnan(x) for x in wilson(0, 0))


def test_via_sd_audit_checks_every_token_the_full_model_sees_and_costs_no_tokens():
    pair = tiny_pair("llama")
    gen = {"max_new_tokens": 24, "ignore_eos": True}
    cfg = {"tau_accept": 0.3, "tau_slim": 0.3, "slim": {"mask": "every_other"}}
    for prompt in PROMPTS[:4]:
        on = decode(pair, prompt, "via_sd", cfg, gen)
        off = decode(pair, prompt, "via_sd", {**cfg, "audit": False}, gen)
        c, t = on.counters.tiers, on.counters.tiers
        assert on.tokens == off.tokens and on.models["target"].tokens == off.models["target"].tokens
        assert not any(k.startswith("audit/") for k in off.counters.tiers)
        gate_tokens = t.get("tier1_accepted", 0) + t.get("tier2_kept", 0) + t.get("tier2_regenerated", 0) + \
            t.get("slim_bonus", 0)
        checked = c.get("audit/tier1_checked", 0) + c.get("audit/tier2_checked", 0)
        assert checked + c["audit/unaudited"] == gate_tokens and c.get("audit/rows", 0) == checked
        assert c.get("audit/tier1_wrong", 0) <= c.get("audit/tier1_checked", 0)
        assert 0 <= c["audit/tokens_to_first_wrong"] <= len(on.tokens)
    assert "audit/rows" not in decode(pair, PROMPTS[1], "via_sd", {**cfg, "tau_accept": 1.1, "tau_slim": 1.1},
                                      gen).counters.tiers
