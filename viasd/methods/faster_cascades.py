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

The public notebook drafts one token at a time; here blocks of ``γ ≥ 1`` are drafted.

**Decisions vs. mixtures.** The rule's *decision* (confidences, accepted sets) is taken on the temperature-1 softmax of the raw logits — the drafter's ``last_logits`` (a drafter
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
from viasd.engine.drafters import Drafter, DrafterConfig, LengthPolicy, make_drafter
from viasd.engine.result import Counters, DecodeResult, Output, RoundRecord
from viasd.engine.stream import Stream, start_sequence
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


def decision_probs(drafter: Drafter, p: torch.Tensor) -> torch.Tensor:
    """Temperature-1 distribution behind the drafter's last proposal, ``[k, V]`` (``p`` if it has no logits)."""
    return gate_distribution(drafter.last_logits, 1.0, fallback=p)


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


@register_method("faster_cascades", FasterCascadesConfig, lossless=False,
                 description="speculative cascades: speculative sampling against a deferral-rule target")
def faster_cascades(pair, prompt_ids, cfg: FasterCascadesConfig, gen, rng) -> DecodeResult:
    """Speculative cascade decoding of one prompt ``[1, P]``; returns a :class:`DecodeResult`.

    Extra counter ``deferred``: positions (drafted ones and bonus positions) where the rule moved
    mass from ``p`` to ``q`` (``π ≠ p`` before the greedy one-hot).
    """
    t0 = time.perf_counter()
    target = Stream(pair.target, prompt_ids, "target")
    drafter = make_drafter(pair, prompt_ids, cfg.drafter)
    policy = LengthPolicy(cfg.drafter.length_policy, cfg.gamma, cfg.drafter.min_confidence, cfg.drafter.max_gamma)
    out = Output(start_sequence(pair.target, prompt_ids), gen, gen.eos_ids(pair), pair.tokenizer)
    side = torch.Generator(device=prompt_ids.device).manual_seed(rng.initial_seed() + 1) if rng is not None else None
    c, rounds = Counters(), []

    def pi_of(p: torch.Tensor, p1: torch.Tensor, q: torch.Tensor, q1: torch.Tensor) -> torch.Tensor:
        pi = target_distribution(cfg.rule, p, q, cfg.alpha, p1, q1)
        c.bump("deferred", int((pi != p).any(-1).sum()))
        return torch.nn.functional.one_hot(pi.argmax(-1), pi.shape[-1]).to(pi.dtype) if gen.greedy else pi

    while not out.done:
        y, p = drafter.propose(out.seq, policy.next(out.remaining), gen, rng, policy.min_confidence)
        k = y.shape[0]
        block = torch.cat([out.seq, y.view(1, -1)], 1)
        logits = target.logits(block, last=k + 1)[0]  # [k+1, V]
        q, q1 = probs_from_logits(logits, gen), gate_distribution(logits)
        pi = pi_of(p, decision_probs(drafter, p), q[:k], q1[:k])  # [k, V] target distributions
        n = first_rejection(y, p, pi, rng)
        if n < k:  # correction from the residual against π
            token = int(sample(sd_residual(p[n], pi[n]), rng))
        else:  # bonus from π_{k+1}: the drafter's distribution there needs one more proposal
            x, p_next = drafter.propose(block, 1, gen, side)
            pi_next = q[k] if not x.numel() else pi_of(p_next, decision_probs(drafter, p_next), q[k:], q1[k:])[0]
            token = int(sample(pi_next, rng))
        emitted = out.commit(y[:n].tolist() + [token])
        policy.update(k, n)
        c.record_round(k, n, emitted)
        rounds.append(RoundRecord(drafted=k, accepted=n, emitted=emitted))
    return DecodeResult("faster_cascades", prompt_ids.shape[1], out.new, rounds, c,
                        {**drafter.stats(), "target": target.stats}, time.perf_counter() - t0, out.stop_reason)
