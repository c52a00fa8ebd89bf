"""``drafter=eagle`` under ``via_sd`` and ``faster_cascades`` (issue 65): the head reads the target's hidden
states of every committed position once, in order; tokens the target has not run on yet (``via_sd``'s tier-1/2
commits) are fed on the head's own predicted features until the target catches up. At each method's lossless
limit the output is the target's greedy output; a default-threshold ``via_sd`` run keeps its counters consistent."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import PROMPTS, tiny_pair
from viasd.config import GenerationConfig
from viasd.engine.drafters import Features
from viasd.engine.eagle import target_features
from viasd.engine.eagle_drafter import EagleDrafter
from viasd.engine.eagle_io import load_head, new_head, save_head
from viasd.methods.api import decode

GEN = GenerationConfig(max_new_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    pair = tiny_pair("llama")
    folder = save_head(new_head(pair.target, [-1], draft_ids=torch.arange(4, 200), seed=3),
                       tmp_path_factory.mktemp("eagle") / "head")
    return pair, {"name": "eagle", "path": str(folder)}


def test_via_sd_with_every_token_escalating_is_the_targets_greedy_output(head):
    pair, drafter = head
    for text in PROMPTS[1:3]:
        ids = pair.encode(text)
        ar = decode(pair, ids, "ar", gen=GEN).tokens
        sd = decode(pair, ids, "sd", {"gamma": 3, "drafter": drafter}, GEN)
        via = decode(pair, ids, "via_sd", {"gamma": 3, "tau_accept": 1.5, "tau_slim": 1.5, "drafter": drafter}, GEN)
        assert via.tokens == ar == sd.tokens
        assert via.counters.tiers.get("escalations", 0) == via.counters.rounds and via.counters.drafted == sd.counters.drafted


@pytest.mark.parametrize("rule", ["chow", "opt"])
def test_faster_cascades_at_its_lossless_limit_is_the_targets_greedy_output(head, rule):
    pair, drafter = head
    ids = pair.encode(PROMPTS[2])
    res = decode(pair, ids, "faster_cascades", {"gamma": 3, "rule": rule, "alpha": -2.0, "drafter": drafter}, GEN)
    assert res.tokens == decode(pair, ids, "ar", gen=GEN).tokens and res.counters.drafted > 0


def _consistent(c) -> None:
    per_tier = c.tiers.get("tier1_accepted", 0) + c.tiers.get("tier2_kept", 0) + c.tiers.get("tier3_accepted", 0)
    assert c.accepted == per_tier and c.drafted == per_tier + c.rejected > 0


def test_a_default_threshold_via_sd_run_completes_with_consistent_counters(head):
    pair, drafter = head
    ids = pair.encode(PROMPTS[3])
    res = decode(pair, ids, "via_sd", {"gamma": 4, "drafter": drafter, "slim": {"mask": "every_other"}}, GEN)
    assert len(res.tokens) == GEN.max_new_tokens
    _consistent(res.counters)


def test_via_sd_hands_the_head_the_targets_own_states_of_tokens_it_committed_without_it(head, monkeypatch):
    """Tier-1 tokens reach the target only at the next escalation: the head drafts past them on its own
    features meanwhile, and ends up holding the target's hidden state of every position once, in order."""
    import viasd.methods.via_sd as via
    from viasd.engine.drafters import make_drafter
    from viasd.engine.stream import start_sequence

    pair, drafter = head
    made = []
    monkeypatch.setattr(via, "make_drafter", lambda *a: made.append(make_drafter(*a)) or made[-1])
    ids = pair.encode(PROMPTS[1])
    cfg = {"gamma": 3, "tau_accept": 0.0, "max_unverified": 5, "drafter": drafter, "slim": {"mask": "every_other"}}
    res = decode(pair, ids, "via_sd", cfg, GEN)
    c = res.counters
    _consistent(c)
    assert c.tiers["tier1_accepted"] > 0 and c.tiers["escalations"] > 0
    seq = torch.cat([start_sequence(pair.target, ids), torch.tensor([res.tokens])], 1)
    with torch.inference_mode():
        full = pair.target(input_ids=seq, output_hidden_states=True).hidden_states[-1]
    held = made[-1].hidden
    assert held.shape[1] > ids.shape[1] and torch.allclose(held, full[:, :held.shape[1]], atol=1e-4)


def test_pending_tokens_draft_from_the_heads_own_features(tmp_path):
    """Committed tokens without target features are fed on the head's predicted features; once the target's
    features arrive, the drafter drafts what a fresh drafter handed every feature drafts."""
    pair = tiny_pair("llama")
    head = load_head(save_head(new_head(pair.target, [-1], seed=5), tmp_path / "h"), pair.target)
    gen = GenerationConfig(max_new_tokens=8)
    seq = pair.encode(PROMPTS[4])
    with torch.no_grad():
        feats, _ = target_features(pair.target, seq, [4])
    L, lag = seq.shape[1], 3
    used = EagleDrafter(head, 4)
    used.propose(seq[:, :L - lag], 2, gen, None, features=Features(feats[:, :L - lag], 0))
    ahead = used.propose(seq, 3, gen, None, features=Features(feats[:, :0], L - lag))  # 2 tokens pending
    assert len(ahead) == 3 and used.state.true == L - lag  # true slots up to the last held features
    caught = used.propose(seq, 3, gen, None, features=Features(feats[:, L - lag:L - 1], L - lag))
    fresh = EagleDrafter(head, 4).propose(seq, 3, gen, None, features=Features(feats[:, :L - 1], 0))
    assert torch.equal(caught.tokens, fresh.tokens) and torch.allclose(caught.logits, fresh.logits, atol=1e-4)

