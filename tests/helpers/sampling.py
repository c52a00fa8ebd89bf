"""Shared helpers for distribution tests: a tiny 6-token-vocabulary pair, the exact joint of its
target's continuations, and the chi-square test every sampling test uses."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from viasd.config import GenerationConfig
from viasd.core.sampling import probs_from_logits
from viasd.distill.draft_model import SubsetHeadLlamaForCausalLM, make_config
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


def chi_square_pvalue(counts: dict, exact: dict) -> float:
    """p-value of a chi-square test of sampled sequence ``counts`` against ``exact`` probabilities
    (rare cells merged to expected count >= 5); asserts that no impossible sequence was sampled."""
    assert sum(counts.get(k, 0) for k in exact if exact[k] == 0) == 0  # never an impossible sequence
    keys = [k for k in exact if exact[k] > 0]
    n = sum(counts.values())
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    exp = np.array([exact[k] for k in keys]) * n
    order = np.argsort(exp)
    obs, exp = obs[order], exp[order]
    small = exp < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
