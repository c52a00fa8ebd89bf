"""Acceptance rules as pure functions over probability tensors.

Each rule cites its equation. Methods compose them; nothing here touches a model or a cache.
Shapes: ``p``/``q`` are ``[..., V]`` distributions; ``x`` indexes the last axis.
"""

from __future__ import annotations

import torch

from viasd.core.sampling import sample

EPS = 1e-12


def sd_accept_prob(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """Speculative sampling acceptance ``min(1, q(x) / p(x))``.

    Leviathan et al. 2023, Alg. 1 (step "accept if r < q(x)/p(x)"); Chen et al. 2023, Alg. 2.
    ``p_x``, ``q_x``: ``[...]`` probabilities of the drafted tokens → ``[...]`` in [0, 1].
    """
    return torch.clamp(q_x / p_x.clamp_min(EPS), max=1.0)


def sd_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Residual distribution ``norm(max(0, q − p))`` sampled after a rejection.

    Leviathan et al. 2023, Alg. 1 (``p'(x) = norm(max(0, q(x) − p(x)))``). If the residual is
    all zero (only when p == q, where no rejection can happen) it falls back to ``q``.
    ``p``, ``q``: ``[..., V]`` → ``[..., V]``.
    """
    r = torch.clamp(q - p, min=0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > EPS, r / mass.clamp_min(EPS), q)


def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``α = Σ_v min(p(v), q(v)) = 1 − TV(p, q)`` (Leviathan et al. 2023, Def. 3.1). ``[..., V]`` → ``[...]``."""
    return torch.minimum(p, q).sum(-1)


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per verifier call ``(1 − α^{γ+1}) / (1 − α)`` (Leviathan et al. 2023, Eq. 1)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def ideal_speedup(alpha: float, gamma: int, c: float) -> float:
    """Ideal walltime improvement ``(1 − α^{γ+1}) / ((1 − α)(γc + 1))`` (Leviathan et al. 2023, Thm. 3.8)."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def lenient_distribution(p: torch.Tensor, q: torch.Tensor, leniency: float) -> torch.Tensor:
    """Distribution of the token lenient speculative sampling emits at one position.

    Accepting ``x ~ p`` with ``min(1, q(x) / ((1 − l)·p(x)))`` (Leviathan et al. 2023, App. A.5)
    and otherwise sampling ``norm(max(0, q − p))`` emits ``x`` with probability
    ``min(p(x), q(x)/(1 − l)) + (1 − Σ_v min(p(v), q(v)/(1 − l)))·norm(max(0, q − p))(x)``;
    ``l = 0`` gives ``q`` (exact SD). ``p``, ``q``: ``[..., V]`` → ``[..., V]``.
    """
    kept = torch.minimum(p, q / (1.0 - leniency))
    rest = (1.0 - kept.sum(-1, keepdim=True)).clamp_min(0.0)
    return kept + rest * sd_residual(p, q)


def verify_block(
    draft: torch.Tensor, p: torch.Tensor, q: torch.Tensor, rng: torch.Generator | None, leniency: float = 0.0
) -> tuple[int, int]:
    """Standard speculative verification of one drafted block.

    Args:
        draft: ``LongTensor[k]`` drafted tokens ``y_1..y_k``.
        p: ``[k, V]`` draft distributions the tokens were sampled from.
        q: ``[k + 1, V]`` verifier distributions at the same positions plus one.
        rng: generator for the uniform draws and residual/bonus sampling.
        leniency: ``l ∈ [0, 1)``; accept with ``min(1, q(x) / ((1 − l)·p(x)))`` (Leviathan et al.
            2023, App. A.5; 0: exact). The emitted tokens then follow :func:`lenient_distribution`.

    Returns:
        ``(n, token)``: the first ``n`` drafts are accepted and ``token`` follows them — a
        residual sample after a rejection (``n < k``) or a bonus sample from ``q_{k+1}``.
    """
    k = draft.shape[0]
    if k:
        idx = torch.arange(k, device=draft.device)
        ratio = sd_accept_prob(p[idx, draft] * (1.0 - leniency), q[idx, draft])
        u = torch.rand(k, generator=rng, device=ratio.device)
        rejected = (u >= ratio).nonzero()
        if rejected.numel():
            n = int(rejected[0, 0])
            return n, int(sample(sd_residual(p[n], q[n]), rng))
    return k, int(sample(q[k], rng))


def verify_greedy(draft: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """:func:`verify_block` of greedy decoding on the device, without a host sync: with one-hot
    ``p`` and ``q`` a draft is accepted exactly when it is ``q``'s argmax.

    Args:
        draft: ``LongTensor[k]`` drafted tokens.
        q: ``[k + 1, V]`` verifier scores (probabilities or logits: only the argmax is read).

    Returns:
        ``LongTensor[2]``: ``(n, token)`` as :func:`verify_block` returns them.
    """
    best = q.argmax(-1)  # [k + 1]
    n = torch.cumprod((best[: draft.shape[0]] == draft).long(), 0).sum()
    return torch.stack([n, best[n]])
