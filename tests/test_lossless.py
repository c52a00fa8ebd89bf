"""Lossless methods reproduce the target's greedy output token for token (fp32, four families)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import FAMILIES, PROMPTS, tiny_pair
from viasd.methods.api import decode


def hf_greedy(pair, ids, max_new_tokens, eos):
    """The target's own ``generate(do_sample=False)`` continuation (new tokens only)."""
    out = pair.target.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
        eos_token_id=eos, pad_token_id=0,
    )
    skip = 1 if pair.is_encoder_decoder else ids.shape[1]
    return out[0, skip:].tolist()


def eos_inside(pair, ids) -> int:
    """A token the target emits greedily at position ≥ 3 and not before: used as EOS."""
    ref = decode(pair, ids, "ar", gen={"max_new_tokens": 24, "ignore_eos": True}).tokens
    for i in range(3, len(ref)):
        if ref[i] not in ref[:i]:
            return ref[i]
    return ref[-1]


@pytest.mark.parametrize("family", FAMILIES)
def test_sd_equals_greedy_target(family):
    pair = tiny_pair(family)
    for i, prompt in enumerate(PROMPTS):
        ids = pair.encode(prompt)
        max_new = 17 + (i % 5)  # mostly not a multiple of gamma + 1
        eos = eos_inside(pair, ids) if i % 3 == 0 else pair.eos_token_ids[0]
        gen = {"max_new_tokens": max_new, "eos_token_ids": [eos]}
        ref = hf_greedy(pair, ids, max_new, eos)
        assert decode(pair, ids, "ar", gen=gen).tokens == ref, (family, prompt)
        for gamma in (1, 3, 5):
            res = decode(pair, ids, "sd", {"gamma": gamma}, gen=gen)
            assert res.tokens == ref, (family, prompt, gamma)
            assert res.counters.accepted + res.counters.rejected == res.counters.drafted
        if i % 4 == 0:
            assert decode(pair, ids, "hf_assisted", {"gamma": 3}, gen=gen).tokens == ref, (family, prompt)
            if not pair.is_encoder_decoder:
                res = decode(pair, ids, "hf_prompt_lookup", {"gamma": 3}, gen=gen)
                assert res.tokens == ref, (family, prompt)
                c = res.counters  # drafted read off the target's inputs: every token is drafted or verified
                assert c.accepted + c.rounds == len(ref) and c.accepted <= c.drafted <= 3 * c.rounds


def test_speculative_methods_stop_at_a_stop_string_where_ar_does():
    """Every stop rule is checked token by token, so a drafted block never runs past a stop string. Stop strings (QA, translation, summaries) reach transformers' assisted generation as a stopping
    criterion of the target alone: handed over in the generation config, the assistant's own ``generate``
    refuses them for lack of a tokenizer."""
    pair = tiny_pair("llama")
    ids = pair.encode(PROMPTS[1])
    free = decode(pair, ids, "ar", gen={"max_new_tokens": 24, "ignore_eos": True}).tokens
    stop = next(t for t in (pair.tokenizer.decode(free[k:k + 2]) for k in range(6, 20)) if t.strip())
    gen = {"max_new_tokens": 24, "ignore_eos": True, "stop_strings": [stop]}
    ref = decode(pair, ids, "ar", gen=gen).tokens
    assert len(ref) < len(free) and stop in pair.tokenizer.decode(ref)
    assert decode(pair, ids, "hf_assisted", {"gamma": 3}, gen=gen).tokens == ref
    assert decode(pair, ids, "hf_prompt_lookup", {"gamma": 3}, gen=gen).tokens == ref
    for gamma in (3, 8):  # a verified block that completes the stop string keeps nothing after it
        res = decode(pair, ids, "sd", {"gamma": gamma}, gen=gen)
        assert res.tokens == ref and res.stop_reason == "stop_string"


def test_hf_prompt_lookup_refuses_encoder_decoder():
    from viasd.errors import ConfigError

    pair = tiny_pair("t5")
    with pytest.raises(ConfigError, match="decoder-only"):
        decode(pair, pair.encode(PROMPTS[0]), "hf_prompt_lookup", gen={"max_new_tokens": 4})


@pytest.mark.parametrize("family", FAMILIES)
def test_eos_inside_a_draft_block_stops_there(family):
    pair = tiny_pair(family)
    ids = pair.encode(PROMPTS[2])
    eos = eos_inside(pair, ids)
    res = decode(pair, ids, "sd", {"gamma": 5}, gen={"max_new_tokens": 40, "eos_token_ids": [eos]})
    assert res.tokens[-1] == eos and eos not in res.tokens[:-1]
    assert res.stop_reason == "eos"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("drafter", ["ngram", "self"])
def test_other_drafters_are_lossless(family, drafter):
    pair = tiny_pair(family)
    for prompt in PROMPTS[5:10]:
        ids = pair.encode(prompt)
        gen = {"max_new_tokens": 20, "ignore_eos": True}
        ref = decode(pair, ids, "ar", gen=gen).tokens
        for policy in ("constant", "heuristic", "confidence"):
            res = decode(pair, ids, "sd", {"gamma": 3, "drafter": {"name": drafter, "length_policy": policy}}, gen=gen)
            assert res.tokens == ref


@pytest.mark.parametrize("family", FAMILIES)
def test_length_policies_keep_sd_lossless(family):
    pair = tiny_pair(family)
    ids = pair.encode(PROMPTS[7])
    gen = {"max_new_tokens": 30, "ignore_eos": True}
    ref = decode(pair, ids, "ar", gen=gen).tokens
    for policy in ("heuristic", "confidence"):
        res = decode(pair, ids, "sd", {"gamma": 3, "drafter": {"length_policy": policy, "min_confidence": 0.3}}, gen=gen)
        assert res.tokens == ref


def test_draft_equal_to_target_accepts_everything():
    from viasd.models.pairs import ModelPair

    base = tiny_pair("llama")
    pair = ModelPair("self", target=base.target, draft=base.target, tokenizer=base.tokenizer)
    for temperature in (0.0, 1.0):
        res = decode(pair, pair.encode(PROMPTS[3]), "sd", {"gamma": 4},
                     gen={"max_new_tokens": 30, "ignore_eos": True, "temperature": temperature})
        assert res.counters.drafted > 0
        assert res.counters.rejected == 0 and res.rejection_rate == 0.0
        assert res.counters.accepted == res.counters.drafted


def test_counters_are_consistent():
    pair = tiny_pair("qwen2")
    res = decode(pair, pair.encode(PROMPTS[1]), "sd", {"gamma": 4}, gen={"max_new_tokens": 25, "ignore_eos": True})
    c = res.counters
    assert res.new_tokens == 25
    assert c.accepted + c.bonus + c.corrected >= res.new_tokens  # last round may be truncated
    assert res.models["target"].calls == c.rounds
    assert res.mean_accepted == pytest.approx(res.new_tokens / c.rounds)
    assert 0.0 <= res.rejection_rate <= 1.0
