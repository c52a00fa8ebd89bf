"""``faster_cascades``: speculative cascades (Narasimhan et al., ICLR 2025, "Faster Cascades via
Speculative Decoding").

One round:

1. the drafter proposes ``γ`` tokens ``y_i ~ p_i``;
2. the target scores the block in one forward (``q_i`` at ``γ + 1`` positions);
3. a deferral rule (:mod:`viasd.core.cascade_rules`) builds the target ``π_i`` from ``p_i``
   and ``q_i`` with lenience ``α``;
4. speculative sampling against ``π``: accept ``y_i`` with ``min(1, π_i(y_i)/p_i(y_i))``; at the
   first rejection sample ``norm(max(0, π_i − p_i))``; if all ``γ`` are accepted, sample a bonus
   token from ``π_{γ+1}`` — the drafter's ``p_{γ+1}`` comes from one extra one-token proposal
   (its KV is reused next round; its sampled token is discarded, drawn from a side generator);
   a drafter with nothing to propose there leaves ``π_{γ+1} = q_{γ+1}``.

The public notebook drafts one token at a time; here blocks of ``γ ≥ 1`` are drafted. The loop
(:func:`deferral_rounds`) is written once: decoding runs it over live models (:class:`LiveDeferral`),
trace replay over a run's traces (:class:`viasd.analysis.deferral.DeferralTrace`).

A drafter reading the target's hidden states (``drafter=eagle``) gets those of every committed position the
target scored, once and in order (:meth:`~viasd.engine.world.LiveWorld.score`, handed over at the commit); the
bonus position's extra proposal reads none (it drafts on the head's own features). Live decoding only.

**Decisions vs. mixtures.** The rule's *decision* (confidences, accepted sets) is taken on the temperature-1 softmax of the raw logits — the logits of the drafter's proposal (a drafter
without logits, e.g. ``ngram``, counts as its one-hot proposal, i.e. fully confident) and the
target's — in greedy and sampling mode alike, as the authors' notebook does; ``π`` mixes the
processed distributions the tokens are sampled from (temperature / top-k / top-p), and OPT's TV
term is taken on those too, as in the notebook (:func:`~viasd.core.cascade_rules.opt`). Greedy mode:
``p`` and ``q`` are one-hot and ``π`` is taken one-hot on ``argmax π``, so a draft token is kept
iff the rule keeps it, and is otherwise replaced by the target's argmax.

Lossy by design (``π ≠ q``). Limits (tested): a lenience making ``π = q`` everywhere
(``α ≤ −2``) reproduces ``sd`` token for token, greedy and sampling with the same seed; one making
``π = p`` (``α = 1``) accepts every draft token.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from viasd.core.cascade_rules import RULES, target_distribution
from viasd.core.rules import sd_accept_prob, sd_residual
from viasd.core.sampling import probs_from_logits, sample
from viasd.core.tiers import gate_distribution
from viasd.engine.drafters import DrafterConfig, Proposal, make_drafter
from viasd.engine.result import DecodeResult, RoundRecord
from viasd.engine.world import LiveWorld
from viasd.errors import ConfigError
from viasd.methods.registry import register_method


@dataclass
class FasterCascadesConfig:
    """Speculative-cascade knobs: block length, deferral rule, lenience ``α`` and the drafter."""

    gamma: int = 4
    rule: str = "opt"  # chow | diff | opt | token_v1 | token_v2 | token_v3
    alpha: float = 0.5  # lenience: larger trusts the drafter more (α ≥ 1: π = p; α ≤ −2: π = q)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)

    def validate(self) -> None:
        if int(self.gamma) < 1:
            raise ConfigError(f"gamma must be >= 1 (got {self.gamma}); set method.gamma")
        if self.rule not in RULES:
            raise ConfigError(f"unknown deferral rule {self.rule!r}; set method.rule to one of {', '.join(RULES.names())}")
        if math.isnan(self.alpha):
            raise ConfigError("alpha (the lenience) must be a number, not NaN")


def decision_probs(proposal: Proposal) -> torch.Tensor:
    """Temperature-1 distribution behind a proposal, ``[k, V]`` (its ``probs`` if it has no logits)."""
    return gate_distribution(proposal.logits, 1.0, fallback=proposal.probs)


def first_rejection(draft: torch.Tensor, p: torch.Tensor, pi: torch.Tensor, rng: torch.Generator | None) -> int:
    """Index of the first draft token rejected against ``π`` (``k`` if none).

    Accept ``y_i`` with ``min(1, π_i(y_i)/p_i(y_i))`` (speculative sampling, Leviathan et al. 2023,
    Alg. 1, with ``π`` in place of ``q``); the uniforms are drawn exactly as
    :func:`~viasd.core.rules.verify_block` draws them. ``draft``: ``[k]``; ``p``, ``pi``: ``[k, V]``.
    """
    k = draft.shape[0]
    if not k:
        return 0
    idx = torch.arange(k, device=draft.device)
    ratio = sd_accept_prob(p[idx, draft], pi[idx, draft])
    u = torch.rand(k, generator=rng, device=ratio.device)
    rejected = (u >= ratio).nonzero()
    return int(rejected[0, 0]) if rejected.numel() else k


@dataclass
class Deferral:
    """One round's deferral decisions: the drafted tokens ``draft`` ``[m]`` (in the columns of ``p``),
    ``p`` and ``π`` ``[m, V]`` at the ``m = decided`` positions where the rule could be taken (a trace: up to
    the first context off its trajectory; live: all ``k``), and per position the tier of a kept token
    (``kept``: 1 where ``π = p``, 3 where the rule moved mass to ``q``; ``None``: not tracked)."""

    draft: torch.Tensor
    p: torch.Tensor
    pi: torch.Tensor
    decided: int
    kept: list[int] | None = None

    def tiers(self, n: int) -> list[int]:
        return self.kept[:n] if self.kept is not None else [1] * n


def deferral_rounds(world, drafter, cfg: FasterCascadesConfig) -> None:
    """Speculative cascade rounds until ``world`` is done, for live models and for a trace alike.

    ``world`` is a :class:`~viasd.engine.world.World` with ``defer(proposal)`` (the target's pass over the
    block and the rule's ``π``: a :class:`Deferral`), ``correction(deferral, n)`` and ``bonus(drafter,
    proposal, deferral)`` (``(token, tier)``), ``drafted(proposal, n)`` (the first ``n`` drafted tokens on
    the host) and ``rng``: live, :class:`LiveDeferral`; a trace, :class:`viasd.analysis.deferral.DeferralTrace`.
    """
    policy = cfg.drafter.length_policy_for(cfg.gamma)
    while not world.done:
        proposal = world.propose(drafter, policy.next(world.remaining), policy.min_confidence)
        k = len(proposal)
        d = world.defer(proposal)  # q at k + 1 positions; π = rule(p, q) where it can be decided
        n = first_rejection(d.draft, d.p, d.pi, world.rng)
        if n < d.decided:  # correction from the residual against π
            token, tier = world.correction(d, n)
        else:  # bonus from π_{k+1}: the drafter's distribution there needs one more proposal
            token, tier = world.bonus(drafter, proposal, d)
        emitted = world.commit(world.drafted(proposal, n) + [token], d.tiers(n) + [tier])
        policy.update(k, n)
        world.counters.record_round(k, n, emitted)
        world.record(RoundRecord(drafted=k, accepted=n, emitted=emitted))


class LiveDeferral(LiveWorld):
    """``faster_cascades``' live world: the target's stream, the rule's ``π`` on full rows (greedy: one-hot on
    ``argmax π``), and a side generator for the bonus position's extra proposal."""

    def __init__(self, pair, prompt_ids, gen, rng, cfg: FasterCascadesConfig):
        super().__init__(pair, prompt_ids, gen, rng)
        self.cfg = cfg
        self.side = torch.Generator(device=prompt_ids.device).manual_seed(rng.initial_seed() + 1) if rng is not None \
            else None
        self._scored: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def propose(self, drafter, k: int, min_confidence: float) -> Proposal:
        return drafter.propose(self.out.seq, k, self.gen, self.rng, min_confidence, features=self.handed())

    def pi_of(self, p: torch.Tensor, p1: torch.Tensor, q: torch.Tensor, q1: torch.Tensor) -> torch.Tensor:
        """``π`` ``[m, V]`` of the rule (counting ``deferred`` positions: ``π ≠ p`` before the greedy one-hot)."""
        pi = target_distribution(self.cfg.rule, p, q, self.cfg.alpha, p1, q1)
        self.counters.bump("deferred", int((pi != p).any(-1).sum()))
        return torch.nn.functional.one_hot(pi.argmax(-1), pi.shape[-1]).to(pi.dtype) if self.gen.greedy else pi

    def defer(self, proposal: Proposal) -> Deferral:
        y, p, k = proposal.tokens, proposal.probs, len(proposal)
        block = torch.cat([self.out.seq, y.view(1, -1)], 1)
        logits = self.score(block, k + 1)[0]  # [k+1, V] (and the target's hidden states for a drafter reading them)
        q, q1 = probs_from_logits(logits, self.gen), gate_distribution(logits)
        self._scored = (block, q, q1)
        return Deferral(y, p, self.pi_of(p, decision_probs(proposal), q[:k], q1[:k]), k)

    def correction(self, d: Deferral, n: int) -> tuple[int, int]:
        return int(sample(sd_residual(d.p[n], d.pi[n]), self.rng)), 3

    def bonus(self, drafter, proposal: Proposal, d: Deferral) -> tuple[int, int]:
        (block, q, q1), k = self._scored, len(proposal)
        nxt = drafter.propose(block, 1, self.gen, self.side)
        pi_next = q[k] if not len(nxt) else self.pi_of(nxt.probs, decision_probs(nxt), q[k:], q1[k:])[0]
        return int(sample(pi_next, self.rng)), 3

    def drafted(self, proposal: Proposal, n: int) -> list[int]:
        return proposal.tokens[:n].tolist()


@register_method("faster_cascades", FasterCascadesConfig, lossless=False,
                 description="speculative cascades: speculative sampling against a deferral-rule target",
                 replayable=True)
def faster_cascades(pair, prompt_ids, cfg: FasterCascadesConfig, gen, rng) -> DecodeResult:
    """Speculative cascade decoding of one prompt ``[1, P]``; returns a :class:`DecodeResult`.

    Extra counter ``deferred``: positions (drafted ones and bonus positions) where the rule moved
    mass from ``p`` to ``q`` (``π ≠ p`` before the greedy one-hot).
    """
    t0 = time.perf_counter()
    world = LiveDeferral(pair, prompt_ids, gen, rng, cfg)  # the target's stream before the drafter's
    drafter = make_drafter(pair, prompt_ids, cfg.drafter)
    world.attach(drafter)  # a drafter reading the target's hidden states: the pre-fill forward hands them over
    deferral_rounds(world, drafter, cfg)
    return world.result("faster_cascades", drafter.stats(), t0)
