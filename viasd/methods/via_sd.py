"""``viasd``: three-tier verification with a routed slim verifier (VIA-SD, Xian et al., ICML 2026).

This module owns the method loop (:func:`via_rounds`, written once for live models — :class:`LiveVerifiers` —
and for trace replay — :class:`viasd.analysis.replay.VerifiersTrace`) and its knobs; the routing itself is the
pure function :func:`~viasd.core.tiers.route_levels`. One round:

1. **Draft** ``γ`` tokens ``y_1..y_γ`` with ``p`` (the drafter also keeps its raw logits).
2. **Slim pass**: one forward of ``q'`` (the target routed through a layer or sub-layer mask)
   over what it has not cached plus the block → raw logits at ``γ + 1`` positions. Skipped when
   no outcome of the round depends on it (tiers off, an empty block, a forced escalation at
   position 0: :func:`~viasd.core.tiers.escalates_at_start`).
3. **Route** (:func:`~viasd.core.tiers.route_levels`): the gate reads
   ``p̂ = softmax(draft logits / T_g)`` and ``q̂' = softmax(slim logits / T_g)``
   (``gate_temperature``, default 1). Agreement ``s_i`` (``min(1, q̂'(y_i)/p̂(y_i))`` or
   ``1 − TV``): ``s_i ≥ τ_accept`` → tier 1 (accept, continue); ``τ_escalate ≤ s_i < τ_accept``
   and ``max q̂'_i ≥ τ_slim`` → tier 2 (the slim verifier rewrites the token, the round ends);
   otherwise → tier 3 (escalate). After ``γ`` tier-1 tokens, a confident slim bonus token.
4. **Escalate** (tier 3): one forward of the full model ``q`` over everything it has not cached
   plus ``y_i..y_γ``, standard SD verification (correction or bonus token), the round ends. With
   ``slim.share_prefix`` the full model resumes from the slim pass's hidden states at the mask's
   first skipped sub-layer (:class:`~viasd.engine.stream.SharedPrefix`).
5. **Commit**; each cache rolls back to its own valid length (the
   :class:`~viasd.engine.stream.Stream` helper); the full model may lag behind.

**A hierarchy** (``verifiers``, ``docs/method.md §5c``): an ordered list of routed verifiers, cheapest first,
each with its own mask and bands; a position climbs it until a verifier accepts or rewrites it, else the target
decides (:class:`VerifierConfig`; the ``verifier{j}/*`` counters). Without a list, ``slim`` is the one verifier.

**A drafter reading the target's hidden states** (``drafter=eagle``; ``needs_hidden``): the target runs its own
forward (no shared prefix) and hands the drafter its last-layer hidden states of committed positions, once and in
order (:class:`~viasd.engine.world.LiveWorld`): tier-1/2 tokens reach the target only at the next escalation, whose
forward returns their states too; until then the drafter drafts past them on its own predicted features
(``docs/eagle.md`` "Decoding"). Live decoding only: replay has no hidden states.

**Other gates** (``gate``, ``docs/method.md §3b``): ``learned`` replaces the bands by a trained model's
probability that the slim verifier's token is the target's (:mod:`viasd.core.gate`, a file of
``experiments.train_gate`` at ``gate_path``: trust it at ``≥ gate_threshold``, else escalate);
``oracle`` (the bound that reads the target's tokens) is replay-only and refused here.

**Why the gate reads raw distributions.** Emitted tokens follow the *processed* distributions
(temperature / top-k / top-p; greedy: argmax), but in greedy mode those are one-hot, so an
agreement computed on them is 0 or 1 and every ``τ_accept ∈ (0, 1]`` — and every
``τ_slim ≤ 1`` — would route identically: the thresholds would measure nothing. The gate
instead measures how much the two models agree and how sure the slim verifier is, which is a
property of their logits, not of the decoding temperature; ``gate_temperature`` rescales it.

**Limits.** ``τ_accept > 1`` and ``τ_slim > 1`` switch tiers 1 and 2 off: no slim pass runs,
every round escalates at its first token and the method reduces exactly to ``sd`` (greedy:
the target's own output; sampling: the same tokens as ``sd`` for the same seed).
``τ_escalate = 0`` has no low band (every non-accepted token may be rewritten by a confident
slim verifier). Counters: ``tier1_accepted``, ``tier2_regenerated`` (tier 2 emitted another
token and ended the round), ``tier2_kept`` (tier 2 emitted the draft's own token and routing
went on), ``slim_bonus``, ``escalations``,
``tier3_accepted``/``tier3_rejected``; ``accepted`` = drafted tokens emitted as drafted.

**Free audit** (``audit``, on by default): an escalation feeds the full model every committed
token it never verified anyway; its forward then also returns their logits rows, and
:class:`~viasd.engine.rounds.Audit` counts per tier how many the target's greedy token
contradicts (``audit/*``). It costs head rows (``audit/rows``), never extra tokens.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from viasd.core.gate import dense_gate_features, learned_gate_values, next_run
from viasd.core.rules import verify_block, verify_greedy
from viasd.core.sampling import probs_from_logits
from viasd.core.tiers import (
    ESCALATE,
    Band,
    Level,
    escalate_at_once,
    escalates_at_start,
    gate_distribution,
    read_level,
    route_levels,
)
from viasd.dimr.masks import SPACES, slim_stream, verifier_streams
from viasd.engine.drafters import DrafterConfig, make_drafter
from viasd.engine.gate_file import load_gate
from viasd.engine.result import Counters, DecodeResult, RoundRecord
from viasd.engine.rounds import Audit, count_round, round_tokens, token_tiers
from viasd.engine.stream import Stream
from viasd.engine.syncs import to_host
from viasd.engine.world import LiveWorld
from viasd.errors import ConfigError
from viasd.methods.registry import register_method
from viasd.methods.via_sd_verifiers import SlimConfig, VerifierConfig, check_hierarchy

AGREEMENTS = ("ratio", "tv", "slim_rel")
GATES = ("thresholds", "learned", "oracle")


@dataclass
class VIASDConfig:
    """Every VIA-SD knob (bands of :func:`~viasd.core.tiers.route_levels`)."""

    gamma: int = 4
    tau_accept: float = 0.8  # tier 1 when s_i >= tau_accept (> 1: off)
    tau_slim: float = 0.6  # tier 2 needs max q̂' >= tau_slim (> 1: off)
    tau_escalate: float = 0.0  # s_i < tau_escalate goes straight to tier 3 (0: no low band)
    gate_temperature: float = 1.0  # the gate reads softmax(raw logits / gate_temperature)
    agreement: str = "ratio"  # ratio | tv | slim_rel (q'(y) / max q', the public reproduction's reading)
    gate: str = "thresholds"  # thresholds (the bands above) | learned (method.gate_path) | oracle (replay only)
    gate_path: str | None = None  # gate=learned: a gate file of experiments.train_gate (its hash enters the run id)
    gate_threshold: float = 0.5  # gate=learned: trust the slim verifier when the gate's probability >= this
    max_unverified: int | None = None
    reverify_on_escalation: bool = False
    slim_bonus: bool = True
    # Gate variants (off by default: the paper's gate), see viasd.core.tiers.route_positions.
    tier1_needs_slim_argmax: bool = False
    tier1_min_draft_confidence: float = 0.0
    audit: bool = True  # escalations also check the tokens the full model never verified (audit/* counters)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    slim: SlimConfig = field(default_factory=SlimConfig)
    # A hierarchy of routed verifiers, cheapest first (empty: the one verifier method.slim), e.g.
    # method.verifiers=[{mask: every_other, tau_slim: 0.3}, {mask: first_k@0.75, tau_slim: 0.05}]
    verifiers: list[VerifierConfig] = field(default_factory=list)

    @property
    def depth(self) -> int:
        """How many routed verifiers sit below the target (1: ``method.slim``)."""
        return max(1, len(self.verifiers))

    def slims(self) -> list[SlimConfig]:
        """The routed verifiers, cheapest first, as :class:`SlimConfig` s (``[method.slim]`` without a list)."""
        if not self.verifiers:
            return [self.slim]
        return [v.slim(float(self.slim.keep_ratio)) for v in self.verifiers]

    def bands(self) -> list[Band]:
        """Each verifier's :class:`~viasd.core.tiers.Band` (a learned or oracle gate: its own bands, depth 1)."""
        knobs = self.gate_knobs()
        if not self.verifiers or self.gate != "thresholds":  # the oracle's bands at every depth
            return [Band(knobs["tau_accept"], knobs["tau_slim"], knobs["tau_escalate"])] * self.depth
        pick = lambda v, k: float(getattr(self, k) if getattr(v, k) is None else getattr(v, k))  # noqa: E731
        return [Band(pick(v, "tau_accept"), pick(v, "tau_slim"), pick(v, "tau_escalate")) for v in self.verifiers]

    def route_knobs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~viasd.core.tiers.route_levels` (bands and ``unverified`` aside)."""
        return {k: v for k, v in self.gate_knobs().items() if not k.startswith("tau_")}

    def validate(self) -> None:
        if int(self.gamma) < 1:
            raise ConfigError(f"gamma must be >= 1 (got {self.gamma}); set method.gamma")
        for k in ("tau_accept", "tau_slim", "tau_escalate", "gate_temperature"):
            if math.isnan(getattr(self, k)):
                raise ConfigError(f"{k} must be a number, not NaN; set method.{k}")
        for k in ("tau_accept", "tau_slim", "tau_escalate"):
            if getattr(self, k) < 0:
                raise ConfigError(f"{k} must be >= 0 (got {getattr(self, k)}); a value > 1 switches that tier off")
        if self.tau_escalate > self.tau_accept:
            raise ConfigError(f"need 0 <= tau_escalate <= tau_accept (got tau_escalate={self.tau_escalate} > "
                              f"tau_accept={self.tau_accept}); lower method.tau_escalate")
        if not self.gate_temperature > 0:
            raise ConfigError(f"gate_temperature must be > 0 (got {self.gate_temperature}); 1.0 reads the raw softmax")
        if self.agreement not in AGREEMENTS:
            raise ConfigError(f"agreement must be one of {AGREEMENTS} (got {self.agreement!r}); set method.agreement")
        if self.gate not in GATES:
            raise ConfigError(f"gate must be one of {GATES} (got {self.gate!r}); set method.gate")
        if self.gate == "learned" and not self.gate_path:
            raise ConfigError("method.gate=learned needs method.gate_path=<gate file>; train one with "
                              "`python -m experiments.train_gate run=<ar run id> mask=<mask> out=gate.pt`")
        if self.gate == "learned" and self.drafter.name not in ("model", "self"):
            raise ConfigError(f"method.gate=learned reads the drafter's logits; use method.drafter.name=model or self "
                              f"(got {self.drafter.name!r})")
        if not 0 <= self.gate_threshold <= 1:
            raise ConfigError(f"gate_threshold must be in [0, 1] (got {self.gate_threshold}); set method.gate_threshold")
        if not 0 <= self.tier1_min_draft_confidence <= 1:
            raise ConfigError(f"tier1_min_draft_confidence must be in [0, 1] (got {self.tier1_min_draft_confidence}); "
                              "0 switches the variant off")
        if self.max_unverified is not None and int(self.max_unverified) < 0:
            raise ConfigError(f"max_unverified must be >= 0 or null (got {self.max_unverified})")
        if not 0 < float(self.slim.keep_ratio) <= 1:
            raise ConfigError(f"slim.keep_ratio must be in (0, 1] (got {self.slim.keep_ratio})")
        if self.slim.space not in SPACES:
            raise ConfigError(f"slim.space must be one of {SPACES} (got {self.slim.space!r}); set method.slim.space")
        if self.verifiers:
            check_hierarchy(self)

    def gate_knobs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~viasd.core.tiers.route_positions` for this gate (``unverified`` aside):
        a learned or oracle gate sets its own bands (see :mod:`viasd.core.gate`) and no variant."""
        common = dict(max_unverified=self.max_unverified, reverify_on_escalation=self.reverify_on_escalation,
                      slim_bonus=self.slim_bonus)
        if self.gate != "thresholds":
            theta = self.gate_threshold if self.gate == "learned" else 0.5
            return dict(tau_accept=theta, tau_slim=theta, tau_escalate=0.0, **common)
        return dict(tau_accept=self.tau_accept, tau_slim=self.tau_slim, tau_escalate=self.tau_escalate,
                    tier1_needs_slim_argmax=self.tier1_needs_slim_argmax,
                    tier1_min_draft_confidence=self.tier1_min_draft_confidence, **common)

    @property
    def tiers_on(self) -> bool:
        """Whether tier 1 or tier 2 can ever fire (otherwise no slim pass is needed)."""
        if self.gate != "thresholds":
            return True
        return any(b.tau_accept <= 1 or (b.tau_slim <= 1 and b.tau_escalate <= 1) for b in self.bands())

    def slim_needed(self, k: int, unverified: int) -> bool:
        """Whether a round of ``k`` drafted tokens after ``unverified`` unseen ones can depend on the
        slim pass: not when the tiers are off or the round escalates at its first position anyway."""
        return self.tiers_on and not escalates_at_start(k, unverified, self.max_unverified)


def escalate(full, block: torch.Tensor, y: torch.Tensor, p: torch.Tensor, route, y_host: list[int] | None,
             committed: list[int], audit: Audit | None, c: Counters, gen, rng) -> tuple[int, int, list[int] | None]:
    """Tier 3: the full model verifies ``y[route.verify_from:]`` of ``block`` ``[1, L]`` as in ``sd`` (and
    audits the unverified tokens' rows when ``audit`` is given); ``committed``: the committed tokens on
    the host; ``full``: scores ``(block, last, host) → [1, last, V]`` (the live world's
    :meth:`~viasd.engine.world.LiveWorld.score`: the target's stream, keeping its hidden states for a drafter
    that reads them). Returns ``(accepted, token, y on the host if read)``. Greedy: one host read."""
    k, start = y.shape[0], route.verify_from
    audited = audit.rows(start) if audit is not None else 0  # the free audit: rows of the unverified tokens too
    known = committed + y_host if y_host is not None else committed
    logits = full(block, k - start + 1 + audited, known)[0]
    q = probs_from_logits(logits[audited:], gen)
    if gen.temperature == 0:
        parts = [logits[:audited].argmax(-1), verify_greedy(y[start:], q)] + ([y] if y_host is None else [])
        read = to_host(torch.cat(parts))
        best, (n, token) = read[:audited], read[audited:audited + 2]
        y_host = read[audited + 2:] if y_host is None else y_host
    else:
        best = logits[:audited].argmax(-1).tolist() if audited else []
        n, token = verify_block(y[start:], p[start:], q, rng)
    if audited:
        y_host = y_host if y_host is not None else to_host(y)
        audit.check(c, best, y_host[:start], token_tiers(route, start))
    return n, token, y_host


def via_rounds(world, drafter, cfg: VIASDConfig) -> None:
    """VIA-SD's rounds until ``world`` is done: the algorithm once, for live models and for a trace.

    ``world`` is a :class:`~viasd.engine.world.World` with two more steps: ``route(proposal, unverified,
    run)`` (the verifiers' passes and :func:`~viasd.core.tiers.route_levels`' decision: live, :class:`LiveVerifiers`;
    a trace, :class:`viasd.analysis.replay.VerifiersTrace`) and ``escalate(proposal, route, y_host, audit)``
    (tier 3: the full model verifies the rest as in ``sd``), plus ``host(proposal)`` (the drafted tokens on
    the host) and ``tail(n)`` (the last ``n`` committed tokens).
    """
    policy = cfg.drafter.length_policy_for(cfg.gamma)
    c, unverified, audit, run = world.counters, 0, Audit(), 0
    while not world.done:  # live host syncs: one per round (the route), one more per escalation (its verdict)
        # 1. draft
        proposal = world.propose(drafter, policy.next(world.remaining), policy.min_confidence)
        k, y_host = len(proposal), proposal.host
        # 2. slim pass  3. route (no slim pass when no outcome of the round depends on it)
        route = escalate_at_once()
        if cfg.slim_needed(k, unverified):
            route = world.route(proposal, unverified, run)
            y_host = route.draft if route.draft is not None else y_host
        # 4. escalate: the full model verifies y[start:] as in sd  5. commit
        n, token = 0, None
        if route.action == ESCALATE:
            n, token, y_host = world.escalate(proposal, route, y_host, audit if cfg.audit else None)
        if y_host is None:
            y_host = world.host(proposal)
        tokens = round_tokens(route, y_host, n, token)
        tiers = token_tiers(route, len(tokens))
        emitted = world.commit(tokens, tiers)
        audit.commit(world.tail(emitted), tiers[:emitted], route.action == ESCALATE)
        kept = count_round(c, route, y_host, tokens, n, cfg.depth)
        unverified = 0 if route.action == ESCALATE else unverified + emitted
        policy.update(k, kept)
        run = next_run(run, k, kept)
        world.record(RoundRecord(drafted=k, accepted=kept, emitted=emitted,
                                 extra={"tier": route.steps[-1].tier, "action": route.action,
                                        **({"level": route.level} if cfg.depth > 1 else {})}))
    if cfg.audit:
        audit.finish(c)


class LiveVerifiers(LiveWorld):
    """VIA-SD's live world: the full target (``full``) and the routed verifiers' streams (``slims``, cheapest
    first; one verifier shares the sub-layers before its mask's first skipped one with the target);
    ``gate``: a learned gate (``None``: the bands)."""

    def __init__(self, pair, prompt_ids, gen, rng, full, slims: list, cfg: VIASDConfig, gate=None, drafter=None):
        super().__init__(pair, prompt_ids, gen, rng, drafter, target=full)
        self.slims, self.cfg, self.gate = slims, cfg, gate
        self.knobs, self.bands = cfg.route_knobs(), cfg.bands()

    def _block(self, proposal) -> torch.Tensor:
        return torch.cat([self.out.seq, proposal.tokens.view(1, -1)], 1)

    def route(self, proposal, unverified: int, run: int):
        """The cheapest verifier's pass over the block (raw logits ``[k+1, V]``), the deeper ones' when a
        position climbs to them, and the routing decision (:func:`~viasd.core.tiers.route_levels`)."""
        y, p, k, cfg, out = proposal.tokens, proposal.probs, len(proposal), self.cfg, self.out
        block = self._block(proposal)
        p_gate = gate_distribution(proposal.logits, cfg.gate_temperature, fallback=p)
        first: dict = {}

        def level(j: int) -> Level:
            raw = self.slims[j].logits(block, last=k + 1, host=out.ids)[0]  # [k+1, V]
            q_gate = gate_distribution(raw, cfg.gate_temperature)
            values = None
            if self.gate is not None:  # the learned gate's (s, conf); the bonus position keeps the slim confidence
                prob = self.gate.probability(dense_gate_features(y, p_gate, q_gate, self.gate.topk, len(out.new), run))
                s, conf = learned_gate_values(prob, q_gate[:k].argmax(-1).tolist(), y.tolist())
                values = (s, conf + [float(q_gate[k].max())])
            lv, read = read_level(y, p, probs_from_logits(raw, self.gen), p_gate, q_gate, self.rng,
                                  agreement=cfg.agreement, values=values, greedy=self.gen.temperature == 0,
                                  slim_top=bool(self.knobs.get("tier1_needs_slim_argmax")),
                                  draft_conf=j == 0 and bool(self.knobs.get("tier1_min_draft_confidence")),
                                  with_draft=j == 0)
            first.update(read if j == 0 else {})
            return lv

        cheapest = level(0)  # always runs (it reads the drafted tokens too: one host read)
        route = route_levels(lambda j: cheapest if j == 0 else level(j), first["draft"], self.bands,
                             unverified=unverified, draft_conf=first.get("draft_conf"), **self.knobs)
        route.scores, route.confidence, route.draft = first["scores"], first["confidence"], first["draft"]
        return route

    def escalate(self, proposal, route, y_host: list[int] | None, audit: Audit | None):
        return escalate(self.score, self._block(proposal), proposal.tokens, proposal.probs, route, y_host,
                        self.out.ids, audit, self.counters, self.gen, self.rng)

    def host(self, proposal) -> list[int]:
        return to_host(proposal.tokens)

    def tail(self, n: int) -> list[int]:
        return self.out.new[len(self.out.new) - n:]


@register_method("via_sd", VIASDConfig, lossless=False, description="VIA-SD three-tier verification",
                 replayable=True)
def via_sd(pair, prompt_ids, cfg: VIASDConfig, gen, rng) -> DecodeResult:
    """VIA-SD decoding of one prompt ``[1, P]``; returns a :class:`DecodeResult` with tier counters."""
    t0 = time.perf_counter()
    drafter = make_drafter(pair, prompt_ids, cfg.drafter)
    full, slims = verifiers(pair, prompt_ids, cfg, own_forward=drafter.needs_hidden)
    if cfg.gate == "oracle":
        raise ConfigError("method.gate=oracle is replay-only (it reads the target's tokens from a trace): "
                          "`python -m experiments.replay run=<ar run id> method=via_sd method.gate=oracle`")
    gate = load_gate(cfg.gate_path) if cfg.gate == "learned" else None
    if gate is not None:
        gate.check(pair.name, slims[0].plan.layers if slims[0].plan is not None else None)
    world = LiveVerifiers(pair, prompt_ids, gen, rng, full, slims, cfg, gate, drafter)
    via_rounds(world, drafter, cfg)
    return world.result("via_sd", {**drafter.stats(), **{slim_name(j): s.stats for j, s in enumerate(slims)}}, t0)


def slim_name(j: int) -> str:
    """The stream name of routed verifier ``j`` (0 = the cheapest): ``slim``, ``slim2``, ``slim3``, … (its
    ``*_calls``/``*_tokens`` counters)."""
    return "slim" if j == 0 else f"slim{j + 1}"


def verifiers(pair, prompt_ids: torch.Tensor, cfg: VIASDConfig, own_forward: bool = False) -> tuple[Stream, list[Stream]]:
    """The target's stream and the routed verifiers' (cheapest first) for one prompt ``[1, P]``: one verifier
    as :func:`~viasd.dimr.masks.verifier_streams` builds it (a shared prefix); a hierarchy's each with its
    own cache. ``own_forward``: the target runs its own forward (no shared prefix), which a drafter reading its
    hidden states needs."""
    if not cfg.verifiers:
        slim = dataclasses.replace(cfg.slim, share_prefix=False) if own_forward else cfg.slim
        full, slim = verifier_streams(pair, prompt_ids, slim)
        return full, [slim]
    return (Stream(pair.target, prompt_ids, "target"),
            [slim_stream(pair, prompt_ids, s) for s in cfg.slims()])
