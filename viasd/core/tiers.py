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
    ``draft``, ``slim``, ``full`` (decided after escalation) or ``none``.
    """

    position: int
    tier: int
    action: str
    source: str


@dataclass
class Route:
    """The routing of one round.

    ``steps``: one :class:`Step` per routed position (the tier-1 and ``slim_keep`` positions, then
    the position that ended the round); positions after it are not routed. ``accepted``: leading
    draft tokens emitted as drafted (tier 1 or ``slim_keep``). ``token``: the slim verifier's token (rewrite or bonus), else
    ``None``. ``verify_from``: for ``escalate``, the first draft position the full model
    verifies (``0`` with ``reverify_on_escalation``, else the escalating position).
    ``scores`` ``[k]`` and ``confidence`` ``[k + 1]``: the gate's ``s_i`` and ``max q̂'_i``, ``draft``
    the drafted tokens on the host (set by :func:`route_round`; None when no slim pass ran).
    """

    steps: list[Step]
    accepted: int
    token: int | None = None
    verify_from: int | None = None
    scores: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    draft: list[int] | None = None

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
    k = draft.shape[0]
    s = agreement_scores(p_gate, q_gate[:k], draft, agreement)
    conf = q_gate.max(-1).values
    if values is not None:
        s, conf = torch.tensor(values[0]), torch.tensor(values[1])
    parts = {"s": s, "conf": conf, "draft": draft}  # float32 holds token ids exactly (< 2^24)
    if knobs.get("tier1_needs_slim_argmax"):
        parts["slim_top"] = q_gate[:k].argmax(-1)
    if knobs.get("tier1_min_draft_confidence"):
        parts["draft_conf"] = p_gate.max(-1).values
    if greedy:
        parts["slim_tokens"] = q_slim.argmax(-1)  # one-hot: the rewrite at i and the bonus are q_slim's argmax
    flat = torch.cat([v.reshape(-1).float().to(draft.device) for v in parts.values()]).tolist()  # the one host read
    read, at = {}, 0
    for name, v in parts.items():
        read[name], at = flat[at:at + v.numel()], at + v.numel()
    ints = {name: [int(x) for x in read[name]] for name in ("draft", "slim_top", "slim_tokens") if name in read}
    knobs.update({name: ints.get(name, read[name]) for name in ("slim_top", "draft_conf") if name in read})
    if greedy:
        tokens = ints["slim_tokens"]
        rewrite, bonus = tokens.__getitem__, lambda: tokens[k]
    else:
        def rewrite(i: int) -> int:
            return int(sample(sd_residual(p[i], q_slim[i]), rng))

        def bonus() -> int:
            return int(sample(q_slim[k], rng))
    route = route_positions(read["s"], read["conf"], ints["draft"], rewrite, bonus, **knobs)
    route.scores, route.confidence, route.draft = s, conf, ints["draft"]
    return route


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
    k = len(draft)
    steps: list[Step] = []

    def done(step: Step, token: int | None = None, verify_from: int | None = None) -> Route:
        return Route(steps + [step], step.position, token, verify_from)

    for i in range(k + 1):
        forced = max_unverified is not None and unverified + i >= int(max_unverified)
        if forced or (i == k and k == 0):  # forced full verification, or nothing drafted to route
            return done(Step(i, 3, ESCALATE, "full"), verify_from=0 if reverify_on_escalation else i)
        if i == k:  # bonus position: every drafted token passed tier 1
            if slim_bonus and conf[k] >= tau_slim:
                return done(Step(k, 0, BONUS, "slim"), bonus())
            return done(Step(k, 0, END, "none"))
        if (s[i] >= tau_accept and (not tier1_needs_slim_argmax or slim_top[i] == draft[i])
                and draft_conf_ok(draft_conf, i, tier1_min_draft_confidence)):
            steps.append(Step(i, 1, CONTINUE, "draft"))
            continue
        if s[i] >= tau_escalate and conf[i] >= tau_slim:
            token = rewrite(i)
            if token == draft[i]:  # the slim verifier emits the draft's own token: the block stays valid
                steps.append(Step(i, 2, KEEP, "slim"))
                continue
            return done(Step(i, 2, REWRITE, "slim"), token)
        return done(Step(i, 3, ESCALATE, "full"), verify_from=0 if reverify_on_escalation else i)
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
    return Route([Step(0, 3, ESCALATE, "full")], 0, None, 0)
