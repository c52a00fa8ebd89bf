"""Deferral rules of speculative cascades (Narasimhan et al., ICLR 2025) as pure functions.

This module owns the rules that build the *target distribution* ``π`` which ``faster_cascades``
verifies drafts against (accept ``x ~ p`` with ``min(1, π(x)/p(x))``, on rejection sample
``norm(max(0, π − p))`` — :func:`~viasd.core.rules.sd_accept_prob` /
:func:`~viasd.core.rules.sd_residual`). Nothing here touches a model or a cache.

Notation: ``p`` = drafter (small model), ``q`` = verifier (large model), ``α`` =
lenience. Every rule takes two pairs of distributions, all ``[..., V]``:

* ``p``, ``q`` — the distributions tokens are sampled from (after temperature / top-k / top-p;
  one-hot in greedy mode). ``π`` is built from these, so it is a proper mixture of them.
* ``p1``, ``q1`` — the distributions the *decision* is taken on (confidences, accepted sets).
  Methods pass the temperature-1 softmax of the raw logits, as the authors' public notebook
  does (its ``probs_*_unscaled``); they default to ``p``, ``q``. The one exception, also as in
  the notebook: OPT's TV term reads ``p``, ``q`` (see :func:`opt`).

Equation numbers follow the paper (as cited in the authors' public notebook,
google-research/speculative_cascades). Limits used by the tests: a very negative lenience
(``α ≤ −2`` for every rule) gives ``π = q`` exactly (speculative decoding); ``α = 1`` gives
``π = p`` for every rule (every draft token is accepted).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from viasd.registry import Registry

RuleFn = Callable[..., torch.Tensor]
RULES: Registry[RuleFn] = Registry("deferral rule")


def _decision(p: torch.Tensor, q: torch.Tensor, p1: torch.Tensor | None, q1: torch.Tensor | None):
    return (p if p1 is None else p1), (q if q1 is None else q1)


def _pick(use_p: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Position-level deferral: ``π = p`` where ``use_p`` (``[...]``) else ``q`` (``[..., V]``)."""
    return torch.where(use_p.unsqueeze(-1), p, q)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``TV(p, q) = Σ_v max(0, p(v) − q(v))`` (``= ½ Σ |p − q|``; exactly 0 when ``p == q``). ``[..., V]`` → ``[...]``."""
    return torch.clamp(p - q, min=0.0).sum(-1)


def token_mixture(p: torch.Tensor, q: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
    """Token-specific target ``π(v) = p(v)·1[v∈A] + (1 − Σ_{u∈A} p(u))·q(v)`` (Narasimhan et al. 2025,
    token-specific deferral, the mixture of Eqs. 13–15).

    The remaining mass is computed as ``Σ_{u∉A} p(u) / Σ_u p(u)`` (equal for a normalized
    ``p``) so that ``A = ∅`` gives exactly ``q`` and ``A ⊇ supp(p)`` gives exactly ``p``.
    ``p``, ``q``: ``[..., V]``; ``accept``: bool ``[..., V]`` (the set ``A``) → ``[..., V]``.
    """
    kept = torch.where(accept, p, torch.zeros_like(p))
    rest = torch.where(accept, torch.zeros_like(p), p).sum(-1, keepdim=True)
    rest = rest / p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
    return kept + rest * q


@RULES.register("chow")
def chow(p: torch.Tensor, q: torch.Tensor, alpha: float, p1: torch.Tensor | None = None,
         q1: torch.Tensor | None = None) -> torch.Tensor:
    """Chow's rule: ``π = p`` if ``max p1 ≥ 1 − α`` else ``q`` (Narasimhan et al. 2025, Eq. 2).

    ``p``, ``q`` (mixed) and ``p1``, ``q1`` (decision): ``[..., V]`` → ``π``: ``[..., V]``.
    """
    p1, _ = _decision(p, q, p1, q1)
    return _pick(p1.max(-1).values >= 1.0 - alpha, p, q)


@RULES.register("diff")
def diff(p: torch.Tensor, q: torch.Tensor, alpha: float, p1: torch.Tensor | None = None,
         q1: torch.Tensor | None = None) -> torch.Tensor:
    """Diff rule: ``π = p`` if ``max p1 ≥ max q1 − α`` else ``q`` (Narasimhan et al. 2025, Eq. 5).

    ``[..., V]`` inputs → ``π``: ``[..., V]``.
    """
    p1, q1 = _decision(p, q, p1, q1)
    return _pick(p1.max(-1).values >= q1.max(-1).values - alpha, p, q)


@RULES.register("opt")
def opt(p: torch.Tensor, q: torch.Tensor, alpha: float, p1: torch.Tensor | None = None,
        q1: torch.Tensor | None = None) -> torch.Tensor:
    """OPT (plug-in optimal) rule: ``π = p`` if ``max p1 ≥ max q1 − α·TV(p, q)`` else ``q``
    (Narasimhan et al. 2025, Eq. 10).

    The max-probability terms read the decision distributions ``p1``, ``q1``; the TV term reads
    the sampling distributions ``p``, ``q`` — as the authors' notebook does (its
    ``target_distribution_opt`` takes ``max`` of ``probs_*_unscaled`` and the TV of the
    temperature-scaled ``probs_small``/``probs_large``). In greedy mode ``p``, ``q`` are
    one-hot, so ``TV ∈ {0, 1}``: where the argmaxes agree ``π = p = q`` whatever the rule
    decides, and where they differ the slack is the full ``α``. Beyond the notebook, our
    sampling distributions also carry top-k / top-p.
    ``α·TV`` is taken as 0 where ``TV = 0`` (so infinite lenience is well defined).
    ``[..., V]`` inputs → ``π``: ``[..., V]``.
    """
    p1, q1 = _decision(p, q, p1, q1)
    tv = total_variation(p, q)
    slack = torch.where(tv > 0, alpha * tv, torch.zeros_like(tv))
    return _pick(p1.max(-1).values >= q1.max(-1).values - slack, p, q)


@RULES.register("token_v1")
def token_v1(p: torch.Tensor, q: torch.Tensor, alpha: float, p1: torch.Tensor | None = None,
             q1: torch.Tensor | None = None) -> torch.Tensor:
    """Token-specific V1: ``A = {v : p1(v) ≥ max q1 − α}`` (Narasimhan et al. 2025, Eq. 13), ``π`` by
    :func:`token_mixture`. ``[..., V]`` inputs → ``π``: ``[..., V]``.
    """
    p1, q1 = _decision(p, q, p1, q1)
    return token_mixture(p, q, p1 >= q1.max(-1, keepdim=True).values - alpha)


@RULES.register("token_v2")
def token_v2(p: torch.Tensor, q: torch.Tensor, alpha: float, p1: torch.Tensor | None = None,
             q1: torch.Tensor | None = None) -> torch.Tensor:
    """Token-specific V2: ``A = {v : q1(v) ≥ max q1 − α}`` (Narasimhan et al. 2025, Eq. 14), ``π`` by
    :func:`token_mixture`. ``[..., V]`` inputs → ``π``: ``[..., V]``.
    """
    _, q1 = _decision(p, q, p1, q1)
    return token_mixture(p, q, q1 >= q1.max(-1, keepdim=True).values - alpha)


@RULES.register("token_v3")
def token_v3(p: torch.Tensor, q: torch.Tensor, alpha: float, p1: torch.Tensor | None = None,
             q1: torch.Tensor | None = None) -> torch.Tensor:
    """Token-specific V3: ``A = {v : q1(v) ≥ (1 − α)·max q1}`` (Narasimhan et al. 2025, Eq. 15), ``π``
    by :func:`token_mixture`. ``[..., V]`` inputs → ``π``: ``[..., V]``.
    """
    _, q1 = _decision(p, q, p1, q1)
    return token_mixture(p, q, q1 >= (1.0 - alpha) * q1.max(-1, keepdim=True).values)


def target_distribution(rule: str, p: torch.Tensor, q: torch.Tensor, alpha: float,
                        p1: torch.Tensor | None = None, q1: torch.Tensor | None = None,
                        greedy: bool = False) -> torch.Tensor:
    """``π`` of the registered ``rule``; greedy: one-hot on ``argmax π``. ``[..., V]`` → ``[..., V]``."""
    pi = RULES.get(rule)(p, q, alpha, p1, q1)
    if greedy:
        pi = torch.nn.functional.one_hot(pi.argmax(-1), pi.shape[-1]).to(pi.dtype)
    return pi
