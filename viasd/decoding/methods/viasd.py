"""``viasd``: three-tier verification with a routed slim verifier (VIA-SD, DESIGN §2).

One round:

1. **Draft** ``γ`` tokens ``y_1..y_γ`` with ``p``.
2. **Slim pass**: one forward of ``q'`` (the target routed through a mask) → ``q'_1..q'_{γ+1}``.
3. **Route** positions in order: agreement ``s_i`` (``min(1, q'(y_i)/p(y_i))`` or ``1 − TV``):
   tier 1 ``s_i ≥ τ_accept`` → accept; tier 2 else if ``max q'_i ≥ τ_slim`` → emit ``q'``'s
   correction and end the round; tier 3 else escalate: one forward of ``q`` over everything it
   has not cached plus ``y_i..y_γ``, standard SD verification, end the round. If all ``γ`` pass
   tier 1, emit a bonus from ``q'_{γ+1}`` when it is confident.
4. Caches roll back to their own valid lengths (the :class:`~viasd.decoding.cache.Stream` helper);
   the full model may lag behind the committed tokens.

``tau_accept > 1`` and ``tau_slim > 1`` switch tiers 1 and 2 off: every round escalates at its
first token and the method reduces exactly to ``sd``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from viasd.config import to_dataclass
from viasd.decoding.api import register_method
from viasd.decoding.cache import Stream, start_sequence
from viasd.decoding.drafters import DrafterConfig, LengthPolicy, make_drafter
from viasd.decoding.result import Counters, DecodeResult, Output, RoundRecord
from viasd.decoding.rules import acceptance_rate, sd_accept_prob, sd_residual, verify_block
from viasd.decoding.sampling import confidence, probs_from_logits, sample
from viasd.errors import ConfigError


@dataclass
class SlimConfig:
    """Which slim verifier ``q'`` to use.

    ``mask``: ``auto`` (the searched DIMR mask for this pair and ``keep_ratio``), a path to a
    mask artifact, an explicit list of kept layers, or an ablation: ``random`` (seeded, same
    budget), ``first_k`` (early exit), ``every_other``, ``independent`` (the pair's intermediate
    model), ``full`` (the target itself).
    """

    mask: object = "auto"
    keep_ratio: float = 0.5
    objective: str = "kl"
    seed: int = 0


@dataclass
class VIASDConfig:
    """Every VIA-SD knob (DESIGN §2)."""

    gamma: int = 4
    tau_accept: float = 0.8
    tau_slim: float = 0.6
    agreement: str = "ratio"  # ratio | tv
    max_unverified: int | None = None
    reverify_on_escalation: bool = False
    slim_bonus: bool = True
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    slim: SlimConfig = field(default_factory=SlimConfig)

    def validate(self) -> None:
        if not isinstance(self.drafter, DrafterConfig):
            self.drafter = to_dataclass(DrafterConfig, self.drafter)
        if not isinstance(self.slim, SlimConfig):
            self.slim = to_dataclass(SlimConfig, self.slim)
        if int(self.gamma) < 1:
            raise ConfigError(f"gamma must be >= 1 (got {self.gamma}); set method.gamma")
        for k in ("tau_accept", "tau_slim"):
            if float(getattr(self, k)) < 0:
                raise ConfigError(f"{k} must be >= 0 (got {getattr(self, k)}); a value > 1 switches that tier off")
        if self.agreement not in ("ratio", "tv"):
            raise ConfigError(f"agreement must be 'ratio' or 'tv' (got {self.agreement!r})")
        if self.max_unverified is not None and int(self.max_unverified) < 0:
            raise ConfigError(f"max_unverified must be >= 0 or null (got {self.max_unverified})")
        if not 0 < float(self.slim.keep_ratio) <= 1:
            raise ConfigError(f"slim.keep_ratio must be in (0, 1] (got {self.slim.keep_ratio})")


def agreement_scores(p: torch.Tensor, q_slim: torch.Tensor, draft: torch.Tensor, kind: str) -> torch.Tensor:
    """Draft/slim agreement ``s_i`` per drafted position (DESIGN §2, VIA-SD step 3).

    ``ratio``: ``min(1, q'_i(y_i) / p_i(y_i))``; ``tv``: ``1 − TV(p_i, q'_i)``.
    ``p``, ``q_slim``: ``[k, V]``; ``draft``: ``[k]`` → ``[k]``.
    """
    if kind == "tv":
        return acceptance_rate(p, q_slim)
    idx = torch.arange(draft.shape[0], device=draft.device)
    return sd_accept_prob(p[idx, draft], q_slim[idx, draft])


@register_method("viasd", VIASDConfig, lossless=False, description="VIA-SD three-tier verification")
def viasd(pair, prompt_ids, cfg: VIASDConfig, gen, rng) -> DecodeResult:
    """VIA-SD decoding of one prompt ``[1, P]``; returns a :class:`DecodeResult` with tier counters."""
    from viasd.dimr.masks import slim_stream

    t0 = time.perf_counter()
    full = Stream(pair.target, prompt_ids, "target")
    slim = slim_stream(pair, prompt_ids, cfg.slim)
    drafter = make_drafter(pair, prompt_ids, cfg.drafter)
    policy = LengthPolicy(cfg.drafter.length_policy, cfg.gamma, cfg.drafter.min_confidence, cfg.drafter.max_gamma)
    out = Output(start_sequence(pair.target, prompt_ids), gen, gen.eos_ids(pair), pair.tokenizer)
    tiers_on = cfg.tau_accept <= 1 or cfg.tau_slim <= 1
    c, rounds, unverified = Counters(), [], 0
    while not out.done:
        y, p = drafter.propose(out.seq, policy.next(out.remaining), gen, rng, policy.min_confidence)
        k = y.shape[0]
        block = torch.cat([out.seq, y.view(1, -1)], 1)
        i, emit, tier = 0, None, "tier1"
        if tiers_on:
            logits_s = slim.logits(block, last=k + 1)[0]  # [k+1, V]
            q_s, conf = probs_from_logits(logits_s, gen), confidence(logits_s)
            s = agreement_scores(p, q_s[:k], y, cfg.agreement)
            for i in range(k + 1):
                forced = cfg.max_unverified is not None and unverified + i >= int(cfg.max_unverified)
                if i == k:
                    if cfg.slim_bonus and conf[k] >= cfg.tau_slim and not forced:
                        emit, tier = [int(sample(q_s[k], rng))], "slim_bonus"
                    else:  # nothing to emit from the slim side: escalate if the round would be empty
                        tier = "tier3" if forced or k == 0 else "tier1"
                    break
                if forced:
                    tier = "tier3"
                    break
                if s[i] >= cfg.tau_accept:
                    continue
                if conf[i] >= cfg.tau_slim:
                    emit, tier = [int(sample(sd_residual(p[i], q_s[i]), rng))], "tier2"
                else:
                    tier = "tier3"
                break
        else:
            tier = "tier3"
        accepted = i
        if tier == "tier3":  # escalate to the full verifier (optionally re-checking tier-1 tokens)
            start = 0 if cfg.reverify_on_escalation else i
            q = probs_from_logits(full.logits(block, last=k - start + 1)[0], gen)
            n, token = verify_block(y[start:], p[start:], q, rng)
            accepted = start + n
            emit = [token]
            c.bump("escalations")
            c.bump("tier3_accepted", n)
            c.bump("tier3_rejected", k - start - n)
            c.bonus += n == k - start
            c.corrected += n < k - start
        elif tier == "tier2":
            c.bump("tier2_regenerated")
        elif tier == "slim_bonus":
            c.bump("slim_bonus")
        c.bump("tier1_accepted", 0 if tier == "tier3" and cfg.reverify_on_escalation else i)
        tokens = y[:accepted].tolist() + (emit or [])
        emitted = out.commit(tokens)
        unverified = 0 if tier == "tier3" else unverified + emitted
        policy.update(k, accepted)
        c.rounds += 1
        c.drafted += k
        c.accepted += accepted
        c.rejected += k - accepted
        rounds.append(RoundRecord(drafted=k, accepted=accepted, emitted=emitted, extra={"tier": tier}))
    models = {**drafter.stats(), "slim": slim.stats, "target": full.stats}
    return DecodeResult("viasd", prompt_ids.shape[1], out.new, rounds, c, models, time.perf_counter() - t0,
                        out.stop_reason)
