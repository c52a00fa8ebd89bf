"""The margin violation of a slim verifier against the full target: DIMR's ``search.objective=margin``.

One reading of VIA-SD's eqs. 11–12 (Xian et al., ICML 2026; ``docs/method.md``): instead of the
mean ``KL(q ‖ q')``, the search minimizes how far the slim verifier ``q'`` over-weights tokens past
two margins of the target ``q``.
"""

from __future__ import annotations

import math

import torch


def margin_rows(logq: torch.Tensor, logq_slim: torch.Tensor, alpha: float = 0.5, beta: float = 0.3) -> torch.Tensor:
    """Per-position margin violation of the slim verifier (one reading of VIA-SD's eqs. 11–12), for log-probs
    ``[..., V]`` of the full target ``q`` and the slim ``q'`` → ``[...]``:
    ``R = Σ_v q'(v)·ReLU(log(1−α) + log q'(v) − log q(v)) + Σ_v q(v)·ReLU(log β + log q'(v) − log q(v))``.

    The first sum charges tokens the slim verifier over-weights past ``q/(1−α)`` (mass it would
    accept that the target would not), the second those past ``q/β``, weighted by the target's
    own mass; ``0`` when ``q' = q`` (``α ∈ (0, 1)``, ``β ∈ (0, 1]``). Rows of a widened head
    (``−∞`` in both) add nothing.
    """
    diff = logq_slim - logq
    both = torch.isfinite(logq_slim) & torch.isfinite(logq)
    diff = torch.where(both, diff, torch.zeros_like(diff))
    first = logq_slim.exp() * torch.relu(math.log(1 - alpha) + diff)
    second = logq.exp() * torch.relu(math.log(beta) + diff)
    return (first + second).sum(-1)
