"""Sampling: SD's output distribution equals the target's exact distribution (chi-square test)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from viasd.config import GenerationConfig
from viasd.decoding.api import decode
from viasd.decoding.sampling import probs_from_logits
from viasd.models.draft_model import SubsetHeadLlamaForCausalLM, make_config
from viasd.models.pairs import ModelPair
from viasd.models.tiny import byte_tokenizer

P_THRESHOLD = 1e-3  # reject "same distribution" only below this p-value
V = 6


def tiny_vocab_pair(draft_subset: list[int] | None = None) -> ModelPair:
    """Target and draft over a 6-token vocabulary; ``draft_subset``: the draft's head scores
    only those tokens (a :class:`SubsetHeadLlamaForCausalLM`, q = 0 elsewhere)."""

    def model(seed, layers, subset=None):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                          num_attention_heads=2, num_key_value_heads=1, initializer_range=0.5,
                          bos_token_id=0, eos_token_id=None, pad_token_id=0)
        if subset:
            return SubsetHeadLlamaForCausalLM(make_config(cfg, subset)).eval()
        return LlamaForCausalLM(cfg).eval()

    return ModelPair("tiny-vocab", target=model(1, 2), draft=model(2, 1, draft_subset), tokenizer=byte_tokenizer())


def exact_joint(pair, ids, gen: GenerationConfig, n: int) -> dict[tuple[int, ...], float]:
    """Exact target probability of every n-token continuation (enumerated)."""
    out = {}
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=n):
            full = torch.cat([ids, torch.tensor([seq[:-1]], dtype=torch.long)], 1) if n > 1 else ids
            q = probs_from_logits(pair.target(full).logits[0, -n:], gen)
            out[seq] = float(np.prod([q[i, t].item() for i, t in enumerate(seq)]))
    return out


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
    keys = [k for k in exact if exact[k] > 0]
    obs = np.array([counts[k] for k in keys], dtype=float)
    exp = np.array([exact[k] for k in keys]) * n
    assert sum(counts[k] for k in exact if exact[k] == 0) == 0  # never sample impossible tokens
    # Merge rare cells so the chi-square approximation holds (expected count >= 5).
    order = np.argsort(exp)
    obs, exp = obs[order], exp[order]
    small = exp < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    p = chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
    assert p > P_THRESHOLD, f"{method} sampling differs from the target (p={p:.2e})"


def test_sd_sampling_rejects_and_corrects():
    pair = tiny_vocab_pair()
    res = decode(pair, torch.tensor([[0, 3, 1]]), "sd", {"gamma": 3},
                 gen={"max_new_tokens": 40, "temperature": 1.0, "ignore_eos": True}, seed=1)
    assert res.counters.rejected > 0 and res.counters.accepted > 0
