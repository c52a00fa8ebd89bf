"""Baselines from the paper's tables: ``cascade_sd`` (lossless) and ``faster_cascades`` (deferral rules)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import FAMILIES, PROMPTS, tiny_pair
from tests.helpers.sampling import P_THRESHOLD, chi_square_pvalue, exact_joint, tiny_vocab_pair
from viasd.config import GenerationConfig
from viasd.core.cascade_rules import RULES, target_distribution, token_mixture, total_variation
from viasd.core.rules import lenient_distribution
from viasd.core.sampling import probs_from_logits
from viasd.engine.cascade import CascadeDrafter, MaxGramDrafter, bigram_next, cascade_levels
from viasd.engine.drafters import DrafterConfig, NgramDrafter
from viasd.engine.stream import Stream, start_sequence
from viasd.errors import ConfigError
from viasd.methods.api import decode

# Cascades: the default (draft model accelerated by ngram, then ngram), a three-deep vertical chain
# (self ← model ← ngram) plus horizontal levels, a purely horizontal one, and ngram alone.
CASCADES = {
    "default": None,
    "deep": {"levels": [{"name": "self", "tokens": 3, "vertical": ["model", "ngram"], "vertical_tokens": [2, 1]},
                        {"name": "model", "tokens": 1}, {"name": "ngram", "tokens": 1}]},
    "horizontal": {"levels": [{"name": "model", "tokens": 2}, {"name": "ngram", "tokens": 3}]},
    "ngram": {"levels": [{"name": "ngram", "tokens": 4}]},
}


# ----------------------------------------------------------------------------------- cascade_sd


@pytest.mark.parametrize("family", FAMILIES)
def test_cascade_sd_equals_greedy_target(family):
    pair = tiny_pair(family)
    names = list(CASCADES)
    for i, prompt in enumerate(PROMPTS[1::5]):
        ids = pair.encode(prompt)
        gen = {"max_new_tokens": 15 + i, "ignore_eos": True}
        ref = decode(pair, ids, "ar", gen=gen).tokens
        for name in (names[i % 4], names[(i + 1) % 4]):
            res = decode(pair, ids, "cascade_sd", CASCADES[name], gen=gen)
            assert res.tokens == ref, (family, prompt, name)
            c, t = res.counters, res.counters.tiers
            assert c.accepted + c.rejected == c.drafted
            levels = {int(k[5:].split("_")[0]) for k in t if k.endswith("_drafted") and "_for_" not in k}
            assert sum(t[f"level{j}_drafted"] for j in levels) == c.drafted
            assert sum(t.get(f"level{j}_accepted", 0) for j in levels) == c.accepted
            assert res.models["target"].calls == c.rounds + pair.is_encoder_decoder  # + T5 encoder


def test_cascade_sd_stops_at_eos_and_reports_vertical_counters():
    pair = tiny_pair("llama")
    ids = pair.encode(PROMPTS[7])
    ref = decode(pair, ids, "ar", gen={"max_new_tokens": 30, "ignore_eos": True}).tokens
    eos = next(t for i, t in enumerate(ref) if i >= 3 and t not in ref[:i])
    res = decode(pair, ids, "cascade_sd", CASCADES["deep"], gen={"max_new_tokens": 30, "eos_token_ids": [eos]})
    assert res.tokens == ref[:ref.index(eos) + 1] and res.stop_reason == "eos"
    t = res.counters.tiers
    assert t["level0_model_drafted_for_self"] >= t["level0_model_accepted_by_self"] > 0
    assert t["level0_ngram_drafted_for_model"] >= t["level0_ngram_accepted_by_model"]
    assert {"self_draft", "draft", "target"} <= set(res.models)


@pytest.mark.parametrize("leniency", [0.0, 0.6])
def test_cascade_sd_sampling_follows_target_distribution(leniency):
    """Same chi-square test as ``sd``, on the first two tokens. Round 1 drafts 4 tokens: 3 by ``self``
    verifying the draft model's proposals (vertical), the 4th by the n-gram model (horizontal).
    ``self`` keeps all target layers here, which makes a wrong ``p`` for accepted proposals show.
    A lenient vertical link reports the distribution its tokens follow, so the target stays exact."""
    pair = tiny_vocab_pair()
    ids = torch.tensor([[0, 3, 1, 3, 1]])
    gen = GenerationConfig(max_new_tokens=5, ignore_eos=True, temperature=1.0)
    exact = exact_joint(pair, ids, gen, 2)
    cfg = {"levels": [{"name": "self", "tokens": 3, "vertical": ["model"], "vertical_tokens": [2], "leniency": leniency},
                      {"name": "ngram", "tokens": 1}],
           "drafter": {"layers": [0, 1]}}
    counts: dict = {}
    tiers: dict = {}
    for seed in range(400):
        res = decode(pair, ids, "cascade_sd", cfg, gen=gen, seed=seed)
        key = tuple(res.tokens[:2])
        counts[key] = counts.get(key, 0) + 1
        for k, v in res.counters.tiers.items():
            tiers[k] = tiers.get(k, 0) + v
    p = chi_square_pvalue(counts, exact)
    assert p > P_THRESHOLD, f"cascade_sd sampling differs from the target (p={p:.2e})"
    # Both cascades were exercised: the vertical one accepted and rejected proposals.
    assert 0 < tiers["level0_model_accepted_by_self"] < tiers["level0_model_drafted_for_self"]
    assert tiers["level1_drafted"] > 0


def test_vertical_drafter_returns_the_verifying_models_distribution():
    """Tokens emitted by a vertical level carry the top model's ``p`` (never the proposer's)."""
    pair = tiny_pair("qwen2")
    ids = pair.encode(PROMPTS[7])
    gen = GenerationConfig(temperature=1.0, top_k=20)
    levels = cascade_levels([{"name": "model", "tokens": 6, "vertical": ["ngram"], "vertical_tokens": [3]},
                             {"name": "ngram", "tokens": 2}])
    drafter = CascadeDrafter.build(pair, ids, levels, DrafterConfig(name="cascade"))
    seq = start_sequence(pair.target, ids)
    rng = torch.Generator().manual_seed(0)
    for _ in range(3):
        proposal = drafter.propose(seq, 8, gen, rng)
        tokens, probs = proposal
        full = torch.cat([seq, tokens.view(1, -1)], 1)
        k = tokens.shape[0]
        p_ref = probs_from_logits(Stream(pair.draft, ids, "check").logits(full[:, :-1], last=k)[0], gen)
        for j, level in enumerate(proposal.levels):
            if level == 0:
                assert torch.allclose(probs[j], p_ref[j], atol=1e-5)
            else:
                assert probs[j, tokens[j]] == 1 and probs[j].sum() == 1
        seq = full
    counters = drafter.counters()
    assert counters["level0_ngram_drafted_for_model"] > 0


@pytest.mark.parametrize("cfg,match", [
    ({"levels": []}, "non-empty list"),
    ({"levels": [{"name": "ngram", "tokens": 2, "vertical": ["model"]}]}, "cannot verify proposals"),
    ({"levels": [{"name": "model", "tokens": 0}]}, "tokens must be an integer >= 1"),
    ({"levels": [{"name": "model", "vertical": ["ngram"], "vertical_tokens": [1, 2]}]}, "one count per vertical"),
    ({"levels": [{"name": "modle"}]}, "unknown cascade drafter 'modle'"),
    ({"levels": [{"name": "cascade"}]}, "unknown cascade drafter 'cascade'"),
    ({"levels": [{"name": "model", "vertical": ["model"]}]}, "appears twice"),
    ({"levels": [{"name": "model", "depth": 2}]}, "unknown CascadeLevel keys"),
    ({"drafter": {"name": "self"}}, "set the drafters in method.levels"),
    ({"gamma": 0}, "gamma must be an integer >= 1 or null"),
    ({"levels": [{"name": "model", "vertical": ["ngram"], "leniency": 1.0}]}, "leniency must be a number in"),
])
def test_bad_cascade_config(cfg, match):
    with pytest.raises(ConfigError, match=match):
        decode(tiny_pair("llama"), "hello", "cascade_sd", cfg)


def test_cascade_gamma_and_surplus_go_to_the_last_level():
    pair = tiny_pair("llama")
    res = decode(pair, pair.encode(PROMPTS[7]), "cascade_sd",
                 {"levels": [{"name": "model", "tokens": 1}, {"name": "ngram", "tokens": 1}], "gamma": 4},
                 {"max_new_tokens": 12, "ignore_eos": True})
    first = res.rounds[0].extra["levels"]
    assert first[0] == 0 and set(first[1:]) <= {1} and len(first) <= 4


def test_lenient_distribution_by_hand():
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.2, 0.3, 0.5])
    assert torch.allclose(lenient_distribution(p, q, 0.0), q)
    # l = 0.5: kept = min(p, 2q) = (.4, .5, 0); rest .1 goes to norm(max(0, q − p)) = (0, 0, 1)
    assert torch.allclose(lenient_distribution(p, q, 0.5), torch.tensor([0.4, 0.5, 0.1]))


def test_bigram_next_by_hand():
    assert bigram_next([5, 1, 5, 2, 5, 2, 7, 5]) == 2  # successors of 5: 1, 2, 2
    assert bigram_next([3, 3, 4, 9]) == 3  # 9 never followed: the most frequent token
    assert bigram_next([6]) == 6


def test_max_gram_always_proposes():
    """The statistical bottom level proposes k tokens even where prompt lookup finds nothing."""
    lookup = NgramDrafter(10, ngram_max=3, ngram_min=1)
    mag = MaxGramDrafter(lookup)
    gen = GenerationConfig()
    seq = torch.tensor([[1, 2, 3, 1, 2, 4]])  # 4 never seen before: lookup proposes nothing
    assert lookup.propose(seq, 3, gen, None).tokens.numel() == 0
    tokens, probs = mag.propose(seq, 3, gen, None)
    assert tokens.tolist() == [1, 2, 3]  # most frequent token (1 and 2 tie: lowest id), 1→2, 2→3 (3 and 4 tie)
    assert torch.equal(probs, torch.nn.functional.one_hot(tokens, 10).float())
    tokens, _ = mag.propose(torch.tensor([[1, 2, 3, 1, 2]]), 3, gen, None)  # lookup finds "3 1 2", then runs out
    assert tokens.tolist() == [3, 1, 2]
    assert mag.fallback_tokens == 3


def test_cascade_sd_bigram_fallback_counts_and_can_be_switched_off():
    pair = tiny_pair("llama")
    ids = pair.encode(PROMPTS[9])
    gen = {"max_new_tokens": 16, "ignore_eos": True}
    ref = decode(pair, ids, "ar", gen=gen).tokens
    on = decode(pair, ids, "cascade_sd", {}, gen)
    off = decode(pair, ids, "cascade_sd", {"bigram_fallback": False}, gen)
    assert on.tokens == off.tokens == ref  # the top level stays exact
    assert on.counters.tiers["bigram_fallback_tokens"] > 0 and "bigram_fallback_tokens" not in off.counters.tiers
    assert on.counters.tiers["level1_drafted"] > off.counters.tiers.get("level1_drafted", 0)
    with pytest.raises(ConfigError, match="bigram_fallback must be true or false"):
        decode(pair, "hello", "cascade_sd", {"bigram_fallback": "maybe"})  # OmegaConf reads yes/no/on/off as bools


# ------------------------------------------------------------------------------ deferral rules

P = torch.tensor([[0.6, 0.3, 0.1], [0.4, 0.35, 0.25]])
Q = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.8, 0.1]])
# max p = (.6, .4), max q = (.5, .8), TV(p, q) = (.4, .45).


@pytest.mark.parametrize("rule,alpha,expected", [
    ("chow", 0.45, [[0.6, 0.3, 0.1], [0.1, 0.8, 0.1]]),  # .6 >= .55 keeps p; .4 < .55 defers
    ("chow", 0.7, [[0.6, 0.3, 0.1], [0.4, 0.35, 0.25]]),  # 1 - α = .3: both keep p
    ("diff", 0.3, [[0.6, 0.3, 0.1], [0.1, 0.8, 0.1]]),  # .6 >= .2; .4 < .5
    ("opt", 0.5, [[0.6, 0.3, 0.1], [0.1, 0.8, 0.1]]),  # .6 >= .5 - .2; .4 < .8 - .225
    ("opt", 0.9, [[0.6, 0.3, 0.1], [0.4, 0.35, 0.25]]),  # .4 >= .8 - .405
    ("token_v1", 0.3, [[0.62, 0.35, 0.03], [0.1, 0.8, 0.1]]),  # A = {0, 1} (p >= .2); A = {} (p >= .5)
    ("token_v2", 0.25, [[0.12, 0.6, 0.28], [0.065, 0.87, 0.065]]),  # A = {1, 2} (q >= .25); A = {1} (q >= .55)
    ("token_v3", 0.3, [[0.14, 0.65, 0.21], [0.065, 0.87, 0.065]]),  # A = {1} (q >= .35); A = {1} (q >= .56)
])
def test_deferral_rules_by_hand(rule, alpha, expected):
    pi = RULES.get(rule)(P, Q, alpha)
    assert torch.allclose(pi, torch.tensor(expected), atol=1e-6)
    assert torch.allclose(pi.sum(-1), torch.ones(2))


def test_rule_helpers_by_hand():
    assert torch.allclose(total_variation(P, Q), torch.tensor([0.4, 0.45]))
    assert torch.equal(total_variation(P, P), torch.zeros(2))
    none, every = torch.zeros(2, 3, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool)
    assert torch.equal(token_mixture(P, Q, none), Q) and torch.equal(token_mixture(P, Q, every), P)


def test_rules_decide_on_decision_distributions_and_greedy_is_one_hot():
    """Greedy: mixtures of one-hots ``p``, ``q``; decisions on the temperature-1 ``p1``, ``q1``."""
    p, q = torch.tensor([[1.0, 0, 0]]), torch.tensor([[0, 1.0, 0]])
    p1, q1 = P[:1], Q[:1]
    assert torch.equal(RULES.get("chow")(p, q, 0.45, p1, q1), p)  # .6 >= .55
    assert torch.equal(RULES.get("chow")(p, q, 0.3, p1, q1), q)  # .6 < .7
    assert torch.equal(RULES.get("token_v1")(p, q, 0.3, p1, q1), p)  # A = {0, 1} holds p's token 0
    assert torch.equal(RULES.get("token_v3")(p, q, 0.3, p1, q1), q)  # A = {1}
    # OPT: max terms on p1, q1, the TV term on p, q (as the authors' notebook): .4 >= .8 - .5·TV(p, q) = .3,
    # whereas TV(p1, q1) = .45 would give .4 < .575 and defer.
    assert torch.equal(RULES.get("opt")(p, q, 0.5, P[1:], Q[1:]), p)
    assert torch.equal(RULES.get("opt")(p, p, 0.5, P[1:], Q[1:]), p)  # TV(p, q) = 0: no slack, π = q = p
    pi = target_distribution("token_v1", P, Q, 0.3, greedy=True)
    assert torch.equal(pi, torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]))


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_limits_on_random_distributions(rule):
    g = torch.Generator().manual_seed(0)
    p = torch.randn(64, 50, generator=g).mul(3).softmax(-1)
    q = torch.randn(64, 50, generator=g).mul(3).softmax(-1)
    assert torch.equal(RULES.get(rule)(p, q, -2.0), q)
    assert torch.equal(RULES.get(rule)(p, q, 1.0), p)
    assert torch.allclose(RULES.get(rule)(p, q, 0.2).sum(-1), torch.ones(64), atol=1e-5)


# ----------------------------------------------------------------------------- faster_cascades


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_lenience_giving_pi_equal_q_reproduces_sd_greedy(family):
    pair = tiny_pair(family)
    ids = pair.encode(PROMPTS[2])
    gen = {"max_new_tokens": 18, "ignore_eos": True}
    sd = decode(pair, ids, "sd", {"gamma": 3}, gen).tokens
    assert sd == decode(pair, ids, "ar", gen=gen).tokens
    for rule in sorted(RULES):
        res = decode(pair, ids, "faster_cascades", {"gamma": 3, "rule": rule, "alpha": -2.0}, gen)
        assert res.tokens == sd, rule
        assert res.counters.tiers["deferred"] > 0


def test_lenience_giving_pi_equal_q_reproduces_sd_sampling():
    pair = tiny_pair("llama")
    ids = pair.encode(PROMPTS[5])
    gen = {"max_new_tokens": 16, "ignore_eos": True, "temperature": 1.0, "top_p": 0.9}
    for seed in range(2):
        sd = decode(pair, ids, "sd", {"gamma": 3}, gen, seed=seed)
        for rule in sorted(RULES):
            res = decode(pair, ids, "faster_cascades", {"gamma": 3, "rule": rule, "alpha": -2.0}, gen, seed=seed)
            assert res.tokens == sd.tokens, (rule, seed)
            assert res.counters.rejected == sd.counters.rejected


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lenience_giving_pi_equal_p_accepts_every_draft(temperature):
    pair = tiny_pair("gemma2")
    ids = pair.encode(PROMPTS[3])
    gen = {"max_new_tokens": 16, "ignore_eos": True, "temperature": temperature}
    for rule in sorted(RULES):
        res = decode(pair, ids, "faster_cascades", {"gamma": 4, "rule": rule, "alpha": 1.0}, gen, seed=3)
        assert res.counters.drafted > 0 and res.counters.rejected == 0 and res.rejection_rate == 0.0, rule
        assert res.counters.accepted == res.counters.drafted


@pytest.mark.parametrize("cfg,match", [
    ({"rule": "cho"}, "unknown deferral rule 'cho'"),
    ({"alpha": "lots"}, "must be a number"),
    ({"alpha": float("nan")}, "not NaN"),
    ({"gamma": 0}, "gamma must be >= 1"),
])
def test_bad_faster_cascades_config(cfg, match):
    with pytest.raises(ConfigError, match=match):
        decode(tiny_pair("llama"), "hello", "faster_cascades", cfg)
