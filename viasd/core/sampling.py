"""Logits → probabilities and token sampling, applied identically to every model.

Greedy decoding (temperature 0) is represented as a one-hot distribution on the argmax, so the
acceptance rules of :mod:`viasd.core.rules` serve greedy and sampling alike.
"""

from __future__ import annotations

import torch

from viasd.config import GenerationConfig


def probs_from_logits(logits: torch.Tensor, gen: GenerationConfig) -> torch.Tensor:
    """Processed next-token distribution.

    Args:
        logits: ``[..., V]`` raw logits (any float dtype).
        gen: temperature / top-k / top-p settings; temperature 0 gives one-hot argmax.

    Returns:
        ``[..., V]`` float32 probabilities (rows sum to 1).
    """
    logits = logits.float()
    if gen.temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / gen.temperature
    if gen.top_k and gen.top_k < logits.shape[-1]:
        kth = torch.topk(logits, gen.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if gen.top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop tokens once the mass *before* them already reaches top_p (keeps at least one).
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= gen.top_p
        drop = drop_sorted.scatter(-1, idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def confidence(logits: torch.Tensor) -> torch.Tensor:
    """Top probability at temperature 1: ``[..., V]`` logits → ``[...]`` (used by confidence gates)."""
    return logits.float().softmax(-1).max(-1).values


def sample(probs: torch.Tensor, rng: torch.Generator | None, greedy: bool = False) -> torch.Tensor:
    """Draw one token per row. ``probs``: ``[..., V]`` → ``LongTensor[...]``.

    One-hot rows (greedy) return their argmax without consuming randomness. ``greedy=True`` (the
    rows come from greedy decoding, one-hot by construction) skips the check, a host sync.
    """
    if greedy:
        return probs.argmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    if bool((flat.max(-1).values == 1).all()):
        return probs.argmax(-1)
    draws = torch.multinomial(flat, 1, generator=rng).squeeze(-1)
    return draws.reshape(probs.shape[:-1])
