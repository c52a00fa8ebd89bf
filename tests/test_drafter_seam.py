"""The drafter seam (issue 61): a drafter returns its :class:`Proposal` and may read the verifier's hidden
states (:class:`Features`), which the target's :class:`Stream` returns with its logits.

A toy feature-level drafter — the shape of an EAGLE head — proposes from the target's own LM head over
the last hidden state it was given: it must see every verified position exactly once, each equal to the
target's own hidden state there, and ``sd`` over it stays lossless.
"""

from __future__ import annotations

import time

import pytest
import torch

from tests.conftest import PROMPTS, tiny_pair
from viasd.config import GenerationConfig
from viasd.core.sampling import probs_from_logits, sample
from viasd.engine.drafters import Drafter, DrafterConfig, Features, LengthPolicy, Proposal, make_drafter
from viasd.engine.paths import head
from viasd.engine.stream import Stream, start_sequence
from viasd.methods.api import decode
from viasd.methods.sd import speculate
from viasd.methods.via_sd import SlimConfig, VIASDConfig, via_sd

GEN = GenerationConfig(max_new_tokens=12, ignore_eos=True)


class ToyHeadDrafter(Drafter):
    """Proposes ``argmax head(h)`` of the latest hidden state it holds, repeated (a stand-in for a trained head)."""

    name = "toy_head"
    needs_hidden = True

    def __init__(self, target):
        self.target, self.seen, self.calls = target, [], 0

    def propose(self, seq, k, gen, rng, min_confidence=0.0, host=None, features=None):
        assert features is not None and features.start == sum(f.hidden.shape[1] for f in self.seen)
        self.seen.append(features)
        self.calls += 1
        h = torch.cat([f.hidden for f in self.seen], 1)  # [1, positions verified so far, H]
        logits = head(self.target, h, 1)[0].expand(k, -1)  # [k, V]
        p = probs_from_logits(logits, gen)
        y = torch.stack([sample(p[j], rng, gen.greedy) for j in range(k)]) if k else seq.new_zeros(0)
        return Proposal(y, p, logits)


def test_a_stream_returns_the_hidden_states_its_logits_come_from():
    pair = tiny_pair("llama")
    ids = pair.encode(" ".join(PROMPTS[:3]))
    logits, states = Stream(pair.target, ids, "target").logits(ids, last=3, hidden=True)
    assert states.shape[:2] == (1, 3) and torch.allclose(head(pair.target, states, 3), logits, atol=1e-5)
    assert torch.allclose(Stream(pair.target, ids, "again").logits(ids, last=3), logits, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_feature_drafter_sees_each_verified_position_once_and_sd_stays_lossless(family):
    pair = tiny_pair(family)
    ids = pair.encode(PROMPTS[1])
    drafter = ToyHeadDrafter(pair.target)
    res = speculate(pair, ids, drafter, LengthPolicy("constant", 3), GEN, torch.Generator().manual_seed(0), "sd",
                    time.perf_counter())
    assert res.tokens == decode(pair, ids, "ar", gen=GEN).tokens
    assert res.counters.accepted > 0  # the head over the target's own states agrees with it somewhere
    seq = torch.cat([start_sequence(pair.target, ids), torch.tensor([res.tokens])], 1)
    with torch.inference_mode():
        full = pair.target(input_ids=seq, output_hidden_states=True).hidden_states[-1]
    got = torch.cat([f.hidden for f in drafter.seen], 1)
    assert drafter.calls == len(drafter.seen) and got.shape[1] <= seq.shape[1] - 1
    assert torch.allclose(got, full[:, :got.shape[1]], atol=1e-4)


def test_built_in_drafters_return_a_proposal_and_need_no_features():
    pair = tiny_pair("llama")
    ids = pair.encode(PROMPTS[2])
    seq = start_sequence(pair.target, ids)
    for name in ("model", "ngram", "hybrid", "self", "cascade"):
        drafter = make_drafter(pair, ids, DrafterConfig(name=name))
        out = drafter.propose(seq, 3, GEN, None, host=seq[0].tolist())
        assert isinstance(out, Proposal) and not drafter.needs_hidden
        assert out.probs.shape[0] == len(out) <= 3
        assert out.logits is None or out.logits.shape == out.probs.shape
        assert out.host is None or out.host == out.tokens.tolist()
        tokens, probs = out  # unpacks as the (tokens, probs) pair
        assert tokens is out.tokens and probs is out.probs


def test_features_are_handed_over_once():
    f = Features(torch.zeros(1, 4, 2), 0)
    nxt = f.after(torch.ones(1, 3, 2), 3)  # a verifier forward repeating position 3
    assert (nxt.start, nxt.end) == (4, 6)
    assert nxt.after(torch.ones(1, 2, 2), 6).start == 6


def test_via_sd_feeds_a_feature_drafter_each_position_once_in_order(monkeypatch):
    """The target lags behind tier-1 commits: their features arrive with the next escalation, in order."""
    pair = tiny_pair("llama")
    ids = pair.encode(PROMPTS[0])
    drafter = ToyHeadDrafter(pair.target)  # asserts every call's features start where the previous ones ended
    monkeypatch.setattr("viasd.methods.via_sd.make_drafter", lambda *a: drafter)
    cfg = VIASDConfig(tau_accept=0.0, max_unverified=4, slim=SlimConfig(mask="every_other"))
    res = via_sd(pair, ids, cfg, GEN, None)
    seq = torch.cat([start_sequence(pair.target, ids), torch.tensor([res.tokens])], 1)
    with torch.inference_mode():
        full = pair.target(input_ids=seq, output_hidden_states=True).hidden_states[-1]
    got = torch.cat([f.hidden for f in drafter.seen], 1)
    assert res.counters.tiers["tier1_accepted"] > 0 and got.shape[1] > ids.shape[1]
    assert torch.allclose(got, full[:, :got.shape[1]], atol=1e-4)
