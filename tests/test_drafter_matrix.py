"""Drafters are an interface: every drafter works with every method and every draft-length policy."""

from __future__ import annotations

import pytest

from tests.conftest import PROMPTS, tiny_pair
from viasd.methods.api import METHODS, decode

DRAFTER_NAMES = ("model", "self", "ngram", "hybrid", "cascade")
METHOD_NAMES = ("sd", "cascade_sd", "faster_cascades", "viasd")
POLICIES = ("constant", "heuristic", "confidence")
# Thresholds at which the tiny drafters' top probabilities sometimes stop the confidence policy.
MIN_CONFIDENCE = {"llama": 0.15, "t5": 0.95}


def method_cfg(method: str, drafter: str, policy: str, min_confidence: float = 0.15) -> dict:
    """The config of ``method`` drafting with ``drafter`` under the length ``policy``."""
    options = {"length_policy": policy, "min_confidence": min_confidence}
    if method == "cascade_sd":  # the drafter heads the cascade: level 0 (vertically sped up by ngram), then ngram
        if drafter == "cascade":
            return {"drafter": options}  # the default cascade
        vertical = [] if drafter in ("ngram", "hybrid") else ["ngram"]
        first = {"name": drafter, "tokens": 2, "vertical": vertical, "vertical_tokens": 1}
        levels = [first] if drafter == "ngram" else [first, {"name": "ngram", "tokens": 1}]
        return {"levels": levels, "drafter": options}
    cfg = {"gamma": 3, "drafter": {"name": drafter, **options}}
    if method == "faster_cascades":
        cfg.update(rule="token_v2", alpha=0.05)
    if method == "viasd":
        cfg.update(tau_accept=0.8, tau_slim=0.6, slim={"mask": "every_other"})  # the method defaults
    return cfg


@pytest.mark.parametrize("family", ["llama", "t5"])
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_every_drafter_with_every_method_and_policy(family, method):
    pair = tiny_pair(family)
    ids = pair.encode(PROMPTS[7])  # repetitive: the n-gram drafter finds matches
    gen = {"max_new_tokens": 14, "ignore_eos": True}
    ref = decode(pair, ids, "ar", gen=gen).tokens
    lossless = METHODS.get(method).lossless
    drafted = dict.fromkeys(POLICIES, 0)
    for drafter in DRAFTER_NAMES:
        for policy in POLICIES:
            res = decode(pair, ids, method, method_cfg(method, drafter, policy, MIN_CONFIDENCE[family]), gen)
            c = res.counters
            where = (family, method, drafter, policy)
            assert res.new_tokens == 14, where
            assert c.drafted > 0, where
            assert c.accepted + c.rejected == c.drafted, where
            assert sum(r.drafted for r in res.rounds) == c.drafted, where
            assert sum(r.emitted for r in res.rounds) == res.new_tokens, where
            if lossless:
                assert res.tokens == ref, where
            if method == "viasd":
                t = c.tiers
                assert t.get("tier1_accepted", 0) + t.get("tier2_kept", 0) + t.get("tier3_accepted", 0) == c.accepted, where
            if drafter != "ngram":
                drafted[policy] += c.drafted
    assert drafted["confidence"] < drafted["constant"]  # the confidence policy did stop some drafts


def test_heuristic_policy_grows_cascade_blocks():
    """The +2/−1 heuristic changes the block length; surplus positions go to the last level."""
    pair = tiny_pair("llama")
    res = decode(pair, pair.encode(PROMPTS[6]), "cascade_sd",
                 {"levels": [{"name": "model", "tokens": 2}, {"name": "ngram", "tokens": 1}],
                  "drafter": {"length_policy": "heuristic"}},
                 {"max_new_tokens": 40, "ignore_eos": True})
    assert len({r.drafted for r in res.rounds}) > 1
    assert any(r.drafted > 3 for r in res.rounds)
