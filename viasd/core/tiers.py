"""VIA-SD's tier routing as pure functions over probability tensors (no model, no cache).

This module owns the *gate* of VIA-SD — which tier handles each drafted position — and
nothing else: the method loop (:mod:`viasd.methods.via_sd`) drafts, runs the slim
verifier, calls :func:`route_round`, escalates to the full model when told to, and commits.

Two kinds of distributions enter a round, all ``[..., V]``:

* **processed** ``p``, ``q'`` — after temperature / top-k / top-p (one-hot in greedy mode):
  what tokens are *emitted* from (the slim rewrite samples ``norm(max(0, q' − p))``, the slim
  bonus samples ``q'``; greedy: their argmax).
* **gate** ``p̂``, ``q̂'`` — ``softmax(raw logits / T_g)`` with the gate temperature ``T_g``,
  whatever the decoding temperature. The agreement ``s_i`` and the slim confidence
  ``max_v q̂'_i(v)`` are read from these. Reading them from the processed distributions would
  make the gate inert in greedy mode: one-hot ``p``, ``q'`` give ``s_i ∈ {0, 1}``, so every
  ``τ_accept ∈ (0, 1]`` routes identically. A drafter without logits (prompt lookup) counts
  as its one-hot proposal (fully confident).

Bands of the agreement ``s_i`` (position ``i`` of the block, in order):

* ``s_i ≥ τ_accept`` → **tier 1**: accept ``y_i``, go on to ``i + 1``;
* ``τ_escalate ≤ s_i < τ_accept`` → **tier 2** if the slim verifier is confident
  (``max q̂'_i ≥ τ_slim``): emit its correction and end the round — unless the correction *is*
  the draft token, in which case the rest of the block is still conditioned on what was
  emitted and routing goes on to ``i + 1`` (``slim_keep``); else tier 3;
* ``s_i < τ_escalate`` → **tier 3**: escalate — the full model verifies ``y_i..y_γ`` (or the
  whole block with ``reverify_on_escalation``) as in standard SD, and ends the round.

After ``γ`` tier-1 positions the bonus position ``γ + 1`` emits a sample of ``q'_{γ+1}`` when
``max q̂'_{γ+1} ≥ τ_slim`` (``slim_bonus``), else the round ends with the drafts alone; an empty
block escalates (the full model then supplies the token). ``max_unverified = N`` escalates at
the first position where ``N`` committed tokens would be unseen by the full model.
``τ_escalate = 0`` has no low band; a threshold > 1 switches its tier off (``s, max q̂' ≤ 1``).

**Any depth** (``method.verifiers``): the slim verifier is a list of routed verifiers, cheapest first, each
with its own bands (:class:`Band`); the full target is always last. A position *climbs* the list: at
verifier ``j`` it is accepted (tier 1) or emitted by ``j`` (tier 2) by ``j``'s bands over ``j``'s own
agreement and confidence; otherwise it goes on to ``j + 1``, and past the last one the target decides
(tier 3). A verifier's values are read only when a position reaches it (:func:`route_levels` calls
``level(j)`` lazily), so a deeper verifier's pass runs only in the rounds that need it. The bonus position
asks the verifiers that already ran this round, cheapest first. Tiers keep their meaning at every depth
(1: the draft's token, 2: a verifier's token, 3: the target's); :attr:`Step.level` says which verifier
decided. With one verifier this is exactly the three-tier gate above.

The bands themselves are :func:`route_positions`, a pure function of the per-position gate
values; :func:`route_round` reads those values from the tensors. Gate variants from the
literature are one knob each, off by default (the paper's gate): ``tier1_needs_slim_argmax``
(tier 1 also needs the draft token to be the slim verifier's argmax) and
``tier1_min_draft_confidence`` (tier 1 also needs the drafter's own confidence). Trace replay
(:mod:`viasd.analysis.replay`) explores them without decoding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from viasd.core.rules import acceptance_rate, sd_accept_prob, sd_residual
from viasd.core.sampling import sample

#: Actions of :class:`Step`.
CONTINUE, KEEP, REWRITE, ESCALATE, BONUS, END = (
    "continue", "slim_keep", "slim_rewrite", "escalate", "slim_bonus", "end")


@dataclass(frozen=True)
class Step:
    """The decision at one routed position.

    ``tier``: 1, 2 or 3 (0 at the bonus position when it does not escalate); ``action``: one of
    ``continue`` (tier 1 accepts the draft token), ``slim_keep`` (tier 2 emits the draft token
    itself; routing goes on), ``slim_rewrite`` (tier 2 emits another token), ``escalate``
    (tier 3), ``slim_bonus``, ``end``; ``source``: who supplies the token at this position —
    ``draft``, ``slim``, ``full`` (decided after escalation) or ``none``; ``level``: the verifier that decided
    (1 = the cheapest; for ``escalate`` and ``end``: the last one consulted).
    """

    position: int
    tier: int
    action: str
    source: str
    level: int = 1


@dataclass(frozen=True)
class Band:
    """One routed verifier's thresholds (see the module docstring): tier 1 at ``s ≥ tau_accept``; tier 2 at
    ``tau_escalate ≤ s`` and ``max q̂' ≥ tau_slim``; otherwise the position climbs to the next verifier."""

    tau_accept: float
    tau_slim: float
    tau_escalate: float = 0.0


@dataclass
class Level:
    """One verifier's gate values over ``k`` drafted tokens: ``s`` [k], ``conf`` [k + 1], its tokens ``rewrite(i)`` /
    ``bonus()``, its ``k`` argmax tokens ``slim_top`` (the ``tier1_needs_slim_argmax`` variant; else None)."""

    s: list[float]
    conf: list[float]
    rewrite: Callable[[int], int]
    bonus: Callable[[], int]
    slim_top: list[int] | None = None


@dataclass
class Route:
    """The routing of one round.

    ``steps``: one :class:`Step` per routed position (the tier-1 and ``slim_keep`` positions, then
    the position that ended the round); positions after it are not routed. ``accepted``: leading
    draft tokens emitted as drafted (tier 1 or ``slim_keep``). ``token``: the slim verifier's token (rewrite or bonus), else
    ``None``. ``verify_from``: for ``escalate``, the first draft position the full model
    verifies (``0`` with ``reverify_on_escalation``, else the escalating position).
    ``scores`` ``[k]`` and ``confidence`` ``[k + 1]``: the gate's ``s_i`` and ``max q̂'_i``, ``draft``
    the drafted tokens on the host (set by :func:`route_round`; None when no slim pass ran);
    ``levels_run``: how many verifiers' values the round read (their passes ran; 0 without a slim pass).
    """

    steps: list[Step]
    accepted: int
    token: int | None = None
    verify_from: int | None = None
    scores: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    draft: list[int] | None = None
    levels_run: int = 1

    @property
    def level(self) -> int:
        """The verifier (1 = cheapest) that decided the step ending the round."""
        return self.steps[-1].level

    @property
    def action(self) -> str:
        """The action that ended the round."""
        return self.steps[-1].action


def gate_distribution(logits: torch.Tensor | None, temperature: float = 1.0,
                      fallback: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(logits / T)``, the distribution gates and deferral decisions read.

    ``logits``: ``[k, V]`` raw logits, or ``None`` for a drafter without logits, in which case
    ``fallback`` (``[k, V]``, the processed proposal: one-hot for a lookup block) is returned,
    as it is when the row counts differ. → ``[k, V]`` float32.
    """
    if logits is None or (fallback is not None and logits.shape[0] != fallback.shape[0]):
        if fallback is None:
            raise ValueError("gate_distribution needs logits or a fallback distribution")
        return fallback
    return (logits.float() / temperature).softmax(-1)


def agreement_scores(p: torch.Tensor, q_slim: torch.Tensor, draft: torch.Tensor, kind: str) -> torch.Tensor:
    """Draft/slim agreement ``s_i`` per drafted position.

    ``ratio``: ``min(1, q'_i(y_i) / p_i(y_i))`` (the speculative-sampling acceptance
    probability, Leviathan et al. 2023, Alg. 1); ``tv``: ``1 − TV(p_i, q'_i)`` (their Def. 3.1);
    ``slim_rel``: ``q'_i(y_i) / max_v q'_i(v)`` (the slim verifier's probability of the draft token
    relative to its own top token; the reading of a public reproduction, ``docs/method.md``).
    ``p``, ``q_slim``: ``[k, V]`` gate distributions; ``draft``: ``[k]`` → ``[k]``.
    """
    if kind == "tv":
        return acceptance_rate(p, q_slim)
    idx = torch.arange(draft.shape[0], device=draft.device)
    if kind == "slim_rel":
        return q_slim[idx, draft] / q_slim.max(-1).values
    return sd_accept_prob(p[idx, draft], q_slim[idx, draft])


def route_round(
    draft: torch.Tensor,
    p: torch.Tensor,
    q_slim: torch.Tensor,
    p_gate: torch.Tensor,
    q_gate: torch.Tensor,
    rng: torch.Generator | None,
    *,
    agreement: str = "ratio",
    values: tuple[list[float], list[float]] | None = None,
    greedy: bool = False,
    **knobs,
) -> Route:
    """Route the positions of one drafted block to tiers 1–3 (see the module docstring).

    The tensor front-end of :func:`route_positions`: it reads the agreement ``s_i``, the slim
    confidence ``max q̂'_i`` (and what a gate variant needs) from the gate distributions and
    samples the slim verifier's tokens from the processed ones.

    Args:
        draft: ``LongTensor[k]`` drafted tokens ``y_1..y_k`` (``k`` may be 0).
        p: ``[k, V]`` processed draft distributions (the tokens were drawn from them).
        q_slim: ``[k + 1, V]`` processed slim distributions at the block positions plus one.
        p_gate: ``[k, V]`` gate distributions of the draft (``softmax(raw / T_g)``).
        q_gate: ``[k + 1, V]`` gate distributions of the slim verifier.
        rng: generator for the slim rewrite / bonus samples (greedy: unused).
        agreement: ``ratio`` | ``tv`` | ``slim_rel``; ``values``: ``(s, conf)`` given by another gate
            (learned: :mod:`viasd.core.gate`) instead of the agreement and slim confidence; ``knobs``: the keyword arguments of :func:`route_positions`.
        greedy: the distributions are one-hot (greedy decoding): the slim verifier's rewrite and
            bonus tokens are its argmax, read with the rest.

    One host read per round: every value the bands need (and, greedy, the slim tokens) in one
    transfer; sampling draws a rewrite or bonus token only when the round reaches one. The
    route's ``draft`` holds the drafted tokens as read.

    Returns:
        A :class:`Route`; the caller escalates when ``route.action == "escalate"``.
    """
    level, read = read_level(draft, p, q_slim, p_gate, q_gate, rng, agreement=agreement, values=values, greedy=greedy,
                             slim_top="tier1_needs_slim_argmax" in knobs and bool(knobs["tier1_needs_slim_argmax"]),
                             draft_conf=bool(knobs.get("tier1_min_draft_confidence")), with_draft=True)
    if "draft_conf" in read:
        knobs["draft_conf"] = read["draft_conf"]
    route = route_positions(level.s, level.conf, read["draft"], level.rewrite, level.bonus,
                            slim_top=level.slim_top, **knobs)
    route.scores, route.confidence, route.draft = read["scores"], read["confidence"], read["draft"]
    return route


def read_level(
    draft: torch.Tensor,
    p: torch.Tensor,
    q_slim: torch.Tensor,
    p_gate: torch.Tensor,
    q_gate: torch.Tensor,
    rng: torch.Generator | None,
    *,
    agreement: str = "ratio",
    values: tuple[list[float], list[float]] | None = None,
    greedy: bool = False,
    slim_top: bool = False,
    draft_conf: bool = False,
    with_draft: bool = False,
) -> tuple[Level, dict]:
    """One verifier's :class:`Level` from its tensors (the arguments of :func:`route_round`), in one host read.

    ``slim_top`` / ``draft_conf``: also read the verifier's argmax tokens ``[k]`` / the drafter's confidence
    ``max p̂`` ``[k]`` (gate variants); ``with_draft``: also read the drafted tokens. Returns the level and
    ``{"draft", "draft_conf", "scores", "confidence"}`` (what was read; ``scores`` ``[k]`` and ``confidence``
    ``[k + 1]`` stay tensors).
    """
    k = draft.shape[0]
    s = agreement_scores(p_gate, q_gate[:k], draft, agreement)
    conf = q_gate.max(-1).values
    if values is not None:
        s, conf = torch.tensor(values[0]), torch.tensor(values[1])
    parts = {"s": s, "conf": conf}
    if with_draft:
        parts["draft"] = draft  # float32 holds token ids exactly (< 2^24)
    if slim_top:
        parts["slim_top"] = q_gate[:k].argmax(-1)
    if draft_conf:
        parts["draft_conf"] = p_gate.max(-1).values
    if greedy:
        parts["slim_tokens"] = q_slim.argmax(-1)  # one-hot: the rewrite at i and the bonus are q_slim's argmax
    flat = torch.cat([v.reshape(-1).float().to(draft.device) for v in parts.values()]).tolist()  # the one host read
    read, at = {}, 0
    for name, v in parts.items():
        read[name], at = flat[at:at + v.numel()], at + v.numel()
    ints = {name: [int(x) for x in read[name]] for name in ("draft", "slim_top", "slim_tokens") if name in read}
    if greedy:
        tokens = ints["slim_tokens"]
        rewrite, bonus = tokens.__getitem__, lambda: tokens[k]
    else:
        def rewrite(i: int) -> int:
            return int(sample(sd_residual(p[i], q_slim[i]), rng))

        def bonus() -> int:
            return int(sample(q_slim[k], rng))
    out = {"scores": s, "confidence": conf, **({"draft": ints["draft"]} if with_draft else {}),
           **({"draft_conf": read["draft_conf"]} if draft_conf else {})}
    return Level(read["s"], read["conf"], rewrite, bonus, ints.get("slim_top")), out


def route_positions(
    s: list[float],
    conf: list[float],
    draft: list[int],
    rewrite: Callable[[int], int],
    bonus: Callable[[], int],
    *,
    tau_accept: float,
    tau_slim: float,
    tau_escalate: float = 0.0,
    unverified: int = 0,
    max_unverified: int | None = None,
    reverify_on_escalation: bool = False,
    slim_bonus: bool = True,
    tier1_needs_slim_argmax: bool = False,
    tier1_min_draft_confidence: float = 0.0,
    slim_top: list[int] | None = None,
    draft_conf: list[float] | None = None,
) -> Route:
    """The bands of one round over its gate values (pure decisions, no tensor).

    :func:`route_round` calls it for the methods, trace replay (:mod:`viasd.analysis.replay`)
    with values read from a trace; both route with this one function.

    Args:
        s: ``k`` agreement scores ``s_i``; ``conf``: ``k + 1`` slim confidences ``max q̂'_i``.
        draft: the ``k`` drafted tokens.
        rewrite: ``i -> token`` the slim verifier emits at position ``i`` (tier 2; called at most once).
        bonus: ``() -> token`` the slim bonus token after ``k`` tier-1 positions.
        tau_accept, tau_slim, tau_escalate: band thresholds.
        unverified: committed tokens the full model has not seen before this round.
        max_unverified: escalate once ``unverified + i`` reaches it (``None``: never).
        reverify_on_escalation: the full model re-verifies the tier-1 tokens of this round.
        slim_bonus: after ``k`` tier-1 positions, emit a confident slim bonus token.
        tier1_needs_slim_argmax: gate variant (off by default): tier 1 also needs the draft token to
            be the slim verifier's argmax ``slim_top[i]`` (top-1 agreement, as greedy self-speculation
            verifies; Zhang et al. 2024, Draft & Verify); otherwise the position goes on to tier 2/3.
        tier1_min_draft_confidence: gate variant (off at 0): tier 1 also needs the drafter's own gate
            confidence ``draft_conf[i] = max p̂_i`` to reach it (a Chow-style deferral on the drafter,
            Narasimhan et al. 2025); a lookup block counts as confident (one-hot).
    """
    return route_levels(lambda j: Level(s, conf, rewrite, bonus, slim_top), draft,
                        [Band(tau_accept, tau_slim, tau_escalate)], unverified=unverified,
                        max_unverified=max_unverified, reverify_on_escalation=reverify_on_escalation,
                        slim_bonus=slim_bonus, tier1_needs_slim_argmax=tier1_needs_slim_argmax,
                        tier1_min_draft_confidence=tier1_min_draft_confidence, draft_conf=draft_conf)


def route_levels(
    level: Callable[[int], Level],
    draft: list[int],
    bands: list[Band],
    *,
    unverified: int = 0,
    max_unverified: int | None = None,
    reverify_on_escalation: bool = False,
    slim_bonus: bool = True,
    tier1_needs_slim_argmax: bool = False,
    tier1_min_draft_confidence: float = 0.0,
    draft_conf: list[float] | None = None,
) -> Route:
    """The bands of one round over any number of routed verifiers (pure decisions, no tensor).

    ``level(j)``: verifier ``j``'s :class:`Level` (0 = the cheapest), called at most once per ``j`` and only
    when a position climbs to it; ``bands[j]``: its thresholds. A position is accepted (tier 1) or emitted
    (tier 2) by the first verifier whose bands say so, else the target verifies from it (tier 3); the
    other arguments are :func:`route_positions`'. With one verifier: exactly :func:`route_positions`.
    """
    k = len(draft)
    steps: list[Step] = []
    seen: dict[int, Level] = {}

    def at(j: int) -> Level:
        return seen[j] if j in seen else seen.setdefault(j, level(j))

    def done(step: Step, token: int | None = None, verify_from: int | None = None) -> Route:
        return Route(steps + [step], step.position, token, verify_from, levels_run=len(seen))

    last = len(bands)
    for i in range(k + 1):
        forced = max_unverified is not None and unverified + i >= int(max_unverified)
        if forced or (i == k and k == 0):  # forced full verification, or nothing drafted to route
            return done(Step(i, 3, ESCALATE, "full", last), verify_from=0 if reverify_on_escalation else i)
        if i == k:  # bonus position: every drafted token passed tier 1; the verifiers that ran, cheapest first
            for j in sorted(seen) if slim_bonus else ():
                if seen[j].conf[k] >= bands[j].tau_slim:
                    return done(Step(k, 0, BONUS, "slim", j + 1), seen[j].bonus())
            return done(Step(k, 0, END, "none", max(seen, default=0) + 1))
        for j, band in enumerate(bands):
            lv = at(j)
            if (lv.s[i] >= band.tau_accept and (not tier1_needs_slim_argmax or lv.slim_top[i] == draft[i])
                    and draft_conf_ok(draft_conf, i, tier1_min_draft_confidence)):
                steps.append(Step(i, 1, CONTINUE, "draft", j + 1))
                break
            if lv.s[i] >= band.tau_escalate and lv.conf[i] >= band.tau_slim:
                token = lv.rewrite(i)
                if token == draft[i]:  # the verifier emits the draft's own token: the block stays valid
                    steps.append(Step(i, 2, KEEP, "slim", j + 1))
                    break
                return done(Step(i, 2, REWRITE, "slim", j + 1), token)
        else:  # no verifier decided: the target verifies from here
            return done(Step(i, 3, ESCALATE, "full", last), verify_from=0 if reverify_on_escalation else i)
    raise AssertionError("unreachable: the bonus position always ends the round")


def draft_conf_ok(draft_conf: list[float] | None, i: int, minimum: float) -> bool:
    """Whether position ``i`` passes the drafter-confidence gate variant (always, when it is off)."""
    return not minimum or draft_conf is None or draft_conf[i] >= minimum


def escalates_at_start(k: int, unverified: int, max_unverified: int | None) -> bool:
    """Whether :func:`route_round` escalates at position 0 whatever the distributions say: an
    empty block (``k = 0``), or ``unverified`` already at ``max_unverified``. Its route is then
    :func:`escalate_at_once`'s, and no slim pass is needed to find it."""
    return k == 0 or (max_unverified is not None and unverified >= int(max_unverified))


def escalate_at_once() -> Route:
    """The route when the tiers are off (thresholds > 1): escalate at position 0, as ``sd`` verifies."""
    return Route([Step(0, 3, ESCALATE, "full")], 0, None, 0, levels_run=0)
