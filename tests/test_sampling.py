"""Sampling: SD's output distribution equals the target's exact distribution (chi-square test)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.sampling import P_THRESHOLD, chi_square_pvalue, exact_joint, tiny_vocab_pair
from viasd.config import GenerationConfig
from viasd.methods.api import decode

HYBRID = {"gamma": 2, "drafter": {"name": "hybrid", "lookup_min": 1}}
VIASD_OFF = {"gamma": 2, "tau_accept": 1.1, "tau_slim": 1.1, "tau_escalate": 0.5, "slim": {"mask": "every_other"}}


@pytest.mark.parametrize("method,cfg,gen_kwargs,subset", [
    ("sd", {"gamma": 2}, {"temperature": 1.0}, None),
    ("sd", {"gamma": 2}, {"temperature": 0.7, "top_k": 4, "top_p": 0.9}, None),
    ("ar", None, {"temperature": 1.0}, None),
    ("sd", {"gamma": 2}, {"temperature": 1.0}, [1, 3, 4]),  # the draft cannot propose tokens 0, 2, 5
    ("sd", HYBRID, {"temperature": 1.0}, None),  # lookup blocks (one-hot) mixed with model blocks
    ("viasd", VIASD_OFF, {"temperature": 1.0}, None),  # tiers off (thresholds > 1): exactly sd
], ids=["sd", "sd-topk-topp", "ar", "sd-subset-head", "sd-hybrid", "viasd-tiers-off"])
def test_sampled_tokens_follow_target_distribution(method, cfg, gen_kwargs, subset):
    pair = tiny_vocab_pair(subset)
    ids = torch.tensor([[0, 3, 1]])
    gen = GenerationConfig(max_new_tokens=2, ignore_eos=True, **gen_kwargs)
    exact = exact_joint(pair, ids, gen, 2)
    n = 1500
    counts = dict.fromkeys(exact, 0)
    for seed in range(n):
        res = decode(pair, ids, method, cfg, gen=gen, seed=seed)
        counts[tuple(res.tokens)] += 1
    p = chi_square_pvalue(counts, exact)  # also asserts that no impossible sequence was sampled
    assert p > P_THRESHOLD, f"{method} sampling differs from the target (p={p:.2e})"


def test_sd_sampling_rejects_and_corrects():
    pair = tiny_vocab_pair()
    res = decode(pair, torch.tensor([[0, 3, 1]]), "sd", {"gamma": 3},
                 gen={"max_new_tokens": 40, "temperature": 1.0, "ignore_eos": True}, seed=1)
    assert res.counters.rejected > 0 and res.counters.accepted > 0
