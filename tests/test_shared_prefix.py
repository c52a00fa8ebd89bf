"""The slim and the full pass share the sub-layers before the mask's first skipped one.

On every family (T5's decoder included, tiny models, fp32) VIA-SD emits the same tokens with
``slim.share_prefix`` on and off, for whole-layer and sub-layer masks and with forced
escalations; the full model then runs fewer layer-tokens (``target_layer_tokens``). Each cache —
the shared prefix's, the slim stream's, the full stream's — is cropped to its own length. The
slim pass is skipped when no outcome of a round depends on it.
"""

from __future__ import annotations

import pytest
import torch

from tests.test_families import LONG, PROMPTS, family_pair
from viasd.dimr.masks import verifier_streams
from viasd.engine.stream import start_sequence
from viasd.methods.api import decode
from viasd.methods.via_sd import SlimConfig
from viasd.models.tiny import FAMILIES

GEN = {"max_new_tokens": 20, "ignore_eos": True}
MASKS = ([0, 1, 3], {"attn": [0, 1, 2, 3], "mlp": [0, 2, 3]})


def _via(pair, prompt, mask, share, **knobs):
    cfg = {"slim": {"mask": mask, "share_prefix": share}, "drafter": {"name": "ngram"},
           "tau_accept": 0.5, "tau_slim": 0.3, **knobs}
    return decode(pair, pair.encode(prompt), "via_sd", cfg, gen=GEN)


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_prefix_emits_the_same_tokens_on_every_family(family):
    pair = family_pair(family)
    saved = []
    for mask, (prompt, knobs) in zip(MASKS, ((LONG, {}), (PROMPTS[1], {"max_unverified": 3}))):
        on, off = _via(pair, prompt, mask, True, **knobs), _via(pair, prompt, mask, False, **knobs)
        assert on.tokens == off.tokens, (family, mask, knobs)
        s_on, s_off = on.summary(), off.summary()
        assert s_on["slim_layer_tokens"] > 0 and s_on["target_layer_tokens"] > 0
        assert s_on["target_layer_tokens"] <= s_off["target_layer_tokens"], (family, mask)
        saved.append(s_off["target_layer_tokens"] - s_on["target_layer_tokens"])
    assert max(saved) > 0  # escalations after a slim pass resume the full model at the boundary


@pytest.mark.parametrize("family", ["llama", "gemma2", "t5"])
def test_each_cache_is_cropped_to_its_own_length(family):
    pair = family_pair(family)
    ids = pair.encode(LONG)
    full, slim = verifier_streams(pair, ids, SlimConfig(mask=[0, 1, 3]))
    prefix = full.prefix
    assert prefix is slim.prefix and prefix.boundary == 4  # layers 0 and 1, both sub-layers
    seq = torch.cat([start_sequence(pair.target, ids), torch.randint(5, 200, (1, 12))], 1)

    def lengths(cache, layers):
        c = getattr(cache, "self_attention_cache", cache)
        return {i: c.layers[i].keys.shape[-2] for i in layers if i < len(c.layers) and c.layers[i].keys is not None}

    slim.logits(seq[:, :-6], last=3)  # tier-1 rounds: the full model lags
    slim.logits(seq[:, :-3], last=3)
    assert set(lengths(prefix.cache, [0, 1]).values()) == {seq.shape[1] - 3}
    assert prefix.lo == 0 and prefix.hidden.shape[1] == seq.shape[1] - 3  # the full model has seen nothing
    full.logits(seq[:, :-3], last=2)  # escalation: resumes at layer 2 from the boundary hidden states
    assert set(lengths(full.cache, [2, 3]).values()) == {seq.shape[1] - 3} and not lengths(full.cache, [0, 1])
    assert set(lengths(slim.cache, [3]).values()) == {seq.shape[1] - 3} and not lengths(slim.cache, [0, 1, 2])
    assert prefix.hidden is None  # every attached stream consumed it
    other = seq.clone()
    other[0, -5] += 1  # a different token 5 positions from the end: each cache rolls back to its own length
    slim.logits(other[:, :-2], last=2)
    assert set(lengths(prefix.cache, [0, 1]).values()) == {seq.shape[1] - 2}
    assert set(lengths(slim.cache, [3]).values()) == {seq.shape[1] - 2}
    assert set(lengths(full.cache, [2, 3]).values()) == {seq.shape[1] - 3}  # the lagging full cache is untouched
    assert prefix.lo == seq.shape[1] - 5 and prefix.hidden.shape[1] == 3  # kept for the full model from its valid end
    ref = verifier_streams(pair, ids, SlimConfig(mask=[0, 1, 3], share_prefix=False))[0].logits(other, last=4)
    # fp32 chunking noise only (T5's logits reach ~200: scale the tolerance)
    torch.testing.assert_close(full.logits(other, last=4), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def test_no_slim_pass_when_no_outcome_depends_on_it():
    pair = family_pair("llama")
    forced = _via(pair, PROMPTS[0], [0, 1, 3], True, max_unverified=0)  # every round escalates at position 0
    assert forced.models["slim"].calls == 0 and forced.counters.tiers["escalations"] == forced.counters.rounds
    assert forced.tokens == decode(pair, pair.encode(PROMPTS[0]), "ar", gen=GEN).tokens
    one = {"max_new_tokens": 1, "ignore_eos": True}  # one token left: the round drafts nothing
    out = decode(pair, pair.encode(PROMPTS[0]), "via_sd", {"slim": {"mask": [0, 1, 3]}, "tau_slim": 0.0}, gen=one)
    assert [r.drafted for r in out.rounds] == [0] and out.models["slim"].calls == 0 and out.models["target"].calls == 1
