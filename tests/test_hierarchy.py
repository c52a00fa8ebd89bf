"""VIA-SD over a hierarchy of routed verifiers (``method.verifiers``, issue 61 item 3): the routing climbs
the list, one verifier is today's gate, a two-verifier run replays its own counters, and the lossless
limit (every threshold > 1) is ``sd``."""

from __future__ import annotations

import pytest

from tests.test_families import family_pair
from tests.test_replay import PROMPTS, traced
from viasd.analysis.replay import Policy, replay
from viasd.core.tiers import (
    BONUS,
    CONTINUE,
    END,
    ESCALATE,
    KEEP,
    REWRITE,
    Band,
    Level,
    Step,
    route_levels,
    route_positions,
)
from viasd.engine.result import aggregate
from viasd.errors import ConfigError
from viasd.methods.api import decode, method_config

GEN = {"max_new_tokens": 12, "ignore_eos": True}
TWO = {"verifiers": [{"mask": "every_other@0.5", "tau_slim": 0.3},
                     {"mask": "first_k@0.75", "tau_slim": 0.05, "tau_accept": 0.5}], "tau_accept": 0.9}


def lv(s, conf, tokens, top=None):
    """A verifier's level over hand-written values; ``tokens``: its rewrite per position, then its bonus."""
    return Level(list(s), list(conf), tokens.__getitem__, lambda: tokens[-1], top)


def test_a_position_climbs_until_a_verifier_decides_and_deeper_passes_run_only_when_needed():
    draft, bands = [5, 6, 7], [Band(0.8, 0.9), Band(0.8, 0.5)]
    calls = []
    levels = [lv([0.9, 0.1, 0.1], [1, 0.5, 0.5, 1], [5, 9, 8, 4]), lv([0.0, 0.9, 0.1], [1, 1, 0.7, 1], [5, 6, 3, 2])]

    def level(j):
        calls.append(j)
        return levels[j]
    route = route_levels(level, draft, bands)
    # 0: the cheapest accepts; 1: climbs, the second accepts; 2: climbs, the second is confident and rewrites
    assert route.steps == [Step(0, 1, CONTINUE, "draft", 1), Step(1, 1, CONTINUE, "draft", 2),
                           Step(2, 2, REWRITE, "slim", 2)]
    assert route.token == 3 and calls == [0, 1] and route.levels_run == 2 and route.level == 2
    route = route_levels(lambda j: lv([0.9], [1, 0.95], [5, 4]), [5], bands)
    assert route.steps[-1] == Step(1, 0, BONUS, "slim", 1) and route.token == 4 and route.levels_run == 1
    # nobody decides: the target verifies from the position (tier 3), after asking every verifier
    route = route_levels(lambda j: lv([0.1], [0.1, 0.1], [1, 1]), [5], bands)
    assert route.action == ESCALATE and route.verify_from == 0 and route.levels_run == 2
    # the bonus asks only the verifiers that ran: an unconfident cheapest one ends the round
    route = route_levels(lambda j: lv([0.9], [1, 0.1], [5, 4]), [5], bands)
    assert route.steps[-1] == Step(1, 0, END, "none", 1) and route.levels_run == 1
    # a verifier that emits the draft's own token keeps the block going
    route = route_levels(lambda j: [lv([0.1, 0.9], [0.1, 1, 1], [0, 0, 0]), lv([0.1, 0.9], [1, 1, 1], [5, 0, 0])][j],
                         [5, 6], bands)
    assert route.steps[:2] == [Step(0, 2, KEEP, "slim", 2), Step(1, 1, CONTINUE, "draft", 1)]


@pytest.mark.parametrize("seed", range(20))
def test_one_verifier_is_the_three_tier_gate(seed):
    import random

    r = random.Random(seed)
    k = r.randint(0, 4)
    s, conf, draft = [r.random() for _ in range(k)], [r.random() for _ in range(k + 1)], [r.randint(0, 3) for _ in
                                                                                          range(k)]
    toks = [r.randint(0, 3) for _ in range(k + 1)]
    knobs = dict(tau_accept=r.choice([0.3, 0.6, 1.1]), tau_slim=r.choice([0.2, 0.5, 1.1]),
                 tau_escalate=r.choice([0.0, 0.2]), max_unverified=r.choice([None, 2]), unverified=r.randint(0, 2))
    one = route_positions(s, conf, draft, toks.__getitem__, lambda: toks[-1], **knobs)
    bands = [Band(knobs.pop("tau_accept"), knobs.pop("tau_slim"), knobs.pop("tau_escalate"))]
    assert route_levels(lambda j: lv(s, conf, toks), draft, bands, **knobs).steps == one.steps


def test_a_two_verifier_run_traced_and_replayed_reproduces_its_own_counters(tmp_path):
    pair = family_pair("llama")
    results = [decode(pair, pair.encode(p), "via_sd", TWO, GEN) for p in PROMPTS]
    real = aggregate(results)
    assert real.get("verifier2/passes", 0) > 0 and real["slim2_calls"] == real["verifier2/passes"]
    per_level = sum(real.get(f"verifier{j}/accepted", 0) for j in (1, 2))
    assert per_level == real["tier1_accepted"]
    typed = method_config("via_sd", TWO)
    traces = traced(pair, tmp_path, PROMPTS, [r.tokens for r in results], typed.slims())
    out = replay(traces, Policy("via_sd", typed))
    counters = [k for k, v in real.items() if isinstance(v, int) and not k.endswith("_s")]
    diff = {k: (real[k], out.get(k, 0)) for k in counters if k not in out["estimated"] and real[k] != out.get(k, 0)}
    assert not diff, diff
    assert out["replay/divergences"] == 0 and out["new_tokens"] == real["new_tokens"]


def test_the_n_tier_oracle_commits_the_cheapest_verifiers_target_token(tmp_path):
    """Over the target's own trajectory the oracle never diverges, and a second verifier only adds tokens
    the target would have written: no more target calls than the oracle over the cheapest one alone."""
    pair = family_pair("llama")
    ar = [decode(pair, pair.encode(p), "ar", {}, GEN) for p in PROMPTS]
    typed = method_config("via_sd", {**TWO, "gate": "oracle"})
    traces = traced(pair, tmp_path, PROMPTS, [r.tokens for r in ar], typed.slims())
    two = replay(traces, Policy("via_sd", typed))
    one = replay(traces, Policy("via_sd", method_config("via_sd", {"slim": {"mask": "every_other", "keep_ratio": 0.5},
                                                                   "gate": "oracle"})))
    assert two["replay/divergences"] == 0 and two["exact"] and one["replay/divergences"] == 0
    assert two["target_calls"] <= one["target_calls"] and two["new_tokens"] == one["new_tokens"]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_threshold_above_one_is_sd(temperature):
    pair = family_pair("llama")
    off = {"verifiers": [{"mask": "every_other@0.5", "tau_slim": 1.1, "tau_accept": 1.1},
                         {"mask": "first_k@0.75", "tau_slim": 1.2}], "tau_accept": 1.1, "tau_slim": 1.1}
    gen = {**GEN, "temperature": temperature}
    for p in PROMPTS:
        via = decode(pair, pair.encode(p), "via_sd", off, gen, seed=3)
        sd = decode(pair, pair.encode(p), "sd", {}, gen, seed=3)
        assert via.tokens == sd.tokens and via.counters.tiers.get("escalations") == sd.counters.rounds


def test_without_a_list_the_config_is_todays():
    cfg = method_config("via_sd", {})
    assert cfg.depth == 1 and cfg.slims() == [cfg.slim] and cfg.bands() == [Band(0.8, 0.6, 0.0)]


@pytest.mark.parametrize("cfg, needle", [
    ({"slim": {"keep_ratio": 0.5}}, "leave method.slim at its default"),
    ({"verifiers": [{"mask": ""}]}, "mask is empty"),
    ({"verifiers": [{"mask": []}]}, "mask is empty"),
    ({"verifiers": [{"mask": "first_k@x"}]}, "NAME@KEEP"),
    ({"verifiers": [{"mask": "every_other", "tau_escalate": 0.9, "tau_accept": 0.5}]}, "cannot be reached"),
    ({"verifiers": [{"mask": "every_other", "tau_accept": 0.0}, {"mask": "first_k"}]}, "cannot be reached"),
    ({"verifiers": [{"mask": "every_other"}, {"mask": "first_k"}], "gate": "learned", "gate_path": "g.pt"},
     "gate=thresholds or oracle"),
])
def test_bad_hierarchies_are_one_line_each(cfg, needle):
    base = {"verifiers": [{"mask": "every_other"}]}
    with pytest.raises(ConfigError) as e:
        method_config("via_sd", {**base, **cfg}).validate()
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_list_not_ordered_by_cost_warns_once(capsys, monkeypatch):
    from viasd.methods import via_sd_verifiers

    monkeypatch.setattr(via_sd_verifiers, "_WARNED", set())  # whatever ran before in this process
    for _ in range(2):
        cfg = method_config("via_sd", {"verifiers": [{"mask": "first_k@0.75"}, {"mask": "every_other@0.5"}]})
        cfg.validate()
    method_config("via_sd", TWO).validate()
    err = capsys.readouterr().err
    assert err == ("warning: method.verifiers is not ordered by cost (keep ratios [0.75, 0.5]); list the cheapest "
                   "verifier first\n")
    assert cfg.bands()[1].tau_slim == cfg.tau_slim


def test_the_command_line_list_composes_and_names_another_run():
    from tests.test_config_schema import _compose, run_id

    cfg = _compose("pair=tiny-llama", "method=via_sd",
                   "method.verifiers=[{mask: every_other, tau_slim: 0.3}, {mask: first_k@0.75, tau_slim: 0.05}]")
    typed = method_config("via_sd", cfg.method)  # warns: every_other at method.slim's keep 0.8 > 0.75
    assert [s.mask for s in typed.slims()] == ["every_other", "first_k"] and typed.slims()[1].keep_ratio == 0.75
    assert [b.tau_slim for b in typed.bands()] == [0.3, 0.05] and typed.bands()[0].tau_accept == typed.tau_accept
    assert run_id("pair=tiny-llama", "method=via_sd", "method.verifiers=[{mask: every_other}]") != \
        run_id("pair=tiny-llama", "method=via_sd") == run_id("pair=tiny-llama", "method=via_sd", "method.verifiers=[]")


def test_a_hierarchys_mask_files_enter_the_run_identity(tmp_path):
    from tests.test_config_schema import _compose
    from viasd.harness.identity import input_files

    art = tmp_path / "mask.json"
    art.write_text("{}")
    cfg = _compose("pair=tiny-llama", "method=via_sd", f"method.verifiers=[{{mask: every_other@0.5}}, {{mask: '{art}'}}]")
    files = input_files(cfg)
    assert files.get("method.verifiers.1.mask") == art and "method.verifiers.0.mask" not in files
