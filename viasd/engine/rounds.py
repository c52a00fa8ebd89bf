"""Per-round bookkeeping shared by the method loops and trace replay.

The decoding loops (:mod:`viasd.methods`) and the replay of their policies over a trace
(:mod:`viasd.analysis.replay`) count a round with the same functions, so a replay's counters
mean what a run's mean:

* :func:`round_tokens` / :func:`count_round` — what a VIA-SD round emits and how it is counted;
* :func:`token_tiers` — which tier emitted each token of a round;
* :func:`count_levels` — Cascade SD's per-level verdicts;
* :class:`Audit` — VIA-SD's free audit: when the full model escalates, it runs over every
  committed token it has not checked anyway (they are in its uncached suffix); asking for their
  logits rows too says, per token, whether the target's greedy token agreed and which tier had
  emitted it (``docs/replay.md``).
"""

from __future__ import annotations

from viasd.core.tiers import BONUS, ESCALATE, KEEP, REWRITE, Route
from viasd.engine.result import Counters, emitted_as_drafted


def round_tokens(route: Route, draft: list[int], full_accepted: int = 0, full_token: int | None = None) -> list[int]:
    """Tokens a VIA-SD round emits (before stop rules): after an escalation the draft tokens up to
    ``verify_from`` plus those the full model accepted and its own ``full_token``; otherwise the
    tokens the gate kept and the slim verifier's token (rewrite or bonus), if any."""
    if route.action == ESCALATE:
        return draft[:route.verify_from + full_accepted] + [full_token]
    return draft[:route.accepted] + ([] if route.token is None else [route.token])


def token_tiers(route: Route, n_tokens: int) -> list[int]:
    """The tier (1: draft accepted by the gate, 2: the slim verifier, 3: the full model) of each of
    the ``n_tokens`` tokens :func:`round_tokens` returned for ``route``."""
    routed_to = route.verify_from if route.action == ESCALATE else route.accepted
    tiers = [st.tier for st in route.steps if st.position < routed_to]
    rest = 3 if route.action == ESCALATE else 2
    return (tiers + [rest] * n_tokens)[:n_tokens]


def count_round(c: Counters, route: Route, drafted: list[int], tokens: list[int], full_accepted: int,
                depth: int = 1) -> int:
    """Add one VIA-SD round to the counters; returns the drafted tokens emitted as drafted.

    ``drafted``: the block ``y``; ``tokens``: what the round emits; ``full_accepted``: draft
    tokens the full model accepted after an escalation (0 otherwise). ``depth`` > 1 (a hierarchy of
    routed verifiers): the ``tier*`` counters count every verifier together, and
    ``verifier{j}/accepted|kept|regenerated|bonus|passes`` count verifier ``j``'s own decisions and passes.
    """
    k, kept = len(drafted), emitted_as_drafted(drafted, tokens)
    routed_to = route.verify_from if route.action == ESCALATE else route.accepted  # positions the round's gate kept
    slim_kept = sum(st.action == KEEP and st.position < routed_to for st in route.steps)
    if route.action == ESCALATE:
        verified = k - route.verify_from
        c.bump("escalations")
        c.bump("tier3_accepted", full_accepted)
        c.bump("tier3_rejected", verified - full_accepted)
        c.bonus += full_accepted == verified
        c.corrected += full_accepted < verified
    elif route.action == REWRITE:
        c.bump("tier2_regenerated")
    elif route.action == BONUS:
        c.bump("slim_bonus")
    c.bump("tier2_kept", slim_kept)
    c.bump("tier1_accepted", routed_to - slim_kept)
    if depth > 1:
        count_verifiers(c, route, routed_to)
    c.rounds += 1
    c.drafted += k
    c.accepted += kept
    c.rejected += k - kept
    return kept


def count_verifiers(c: Counters, route: Route, routed_to: int) -> None:
    """A hierarchy's per-verifier counters of one round (see :func:`count_round`)."""
    for st in route.steps:
        if st.position < routed_to:
            c.bump(f"verifier{st.level}/{'accepted' if st.tier == 1 else 'kept'}")
    if route.action == REWRITE:
        c.bump(f"verifier{route.level}/regenerated")
    elif route.action == BONUS:
        c.bump(f"verifier{route.level}/bonus")
    for j in range(route.levels_run):
        c.bump(f"verifier{j + 1}/passes")


def count_levels(c: Counters, levels: list[int], accepted: int) -> dict:
    """Cascade SD: ``level{i}_drafted|accepted|rejected`` for the block positions level ``i``
    drafted (``levels[j]``: the level of position ``j``), the target having accepted ``accepted``;
    returns the round's ``extra`` record."""
    for j, level in enumerate(levels):
        c.bump(f"level{level}_drafted")
        c.bump(f"level{level}_accepted" if j < accepted else f"level{level}_rejected")
    return {"levels": list(levels)}


class Audit:
    """VIA-SD's free audit of the tokens the full model never verified.

    Tokens emitted by tier 1 or 2 wait in :attr:`pending` until the next escalation. That
    escalation feeds them to the full model anyway (they are in its uncached suffix), so asking
    its forward for :meth:`rows` more logits rows costs head rows only, never more tokens.
    :meth:`check` then counts, per tier, the tokens checked and those where the target's greedy
    token differs (``audit/tier1_checked``, ``audit/tier1_wrong``, ``audit/tier2_…``), the extra
    rows (``audit/rows``) and ``audit/tokens_to_first_wrong`` (tokens emitted before the first
    wrong one; all of them when none is found); :meth:`finish` counts the tokens still pending at
    the end (``audit/unaudited``).
    """

    def __init__(self) -> None:
        self.pending: list[tuple[int, int]] = []  # (token, tier) committed, unseen by the full model
        self.emitted = 0  # tokens committed so far
        self.first_wrong: int | None = None

    def rows(self, verify_from: int) -> int:
        """Logits rows to add before the verification rows: the pending tokens and the
        ``verify_from`` tokens of this round the gate kept before escalating."""
        return len(self.pending) + verify_from

    def check(self, c: Counters, greedy: list[int], kept: list[int], tiers: list[int]) -> None:
        """Compare the pending tokens and this round's ``kept`` tokens (their ``tiers``) with the
        target's greedy tokens ``greedy`` at the same positions (``len = rows(len(kept))``)."""
        tokens = self.pending + list(zip(kept, tiers))
        c.bump("audit/rows", len(tokens))
        for j, ((token, tier), best) in enumerate(zip(tokens, greedy)):
            c.bump(f"audit/tier{tier}_checked")
            if token != best:
                c.bump(f"audit/tier{tier}_wrong")
                if self.first_wrong is None:
                    self.first_wrong = self.emitted - len(self.pending) + j
        self.pending = []

    def commit(self, tokens: list[int], tiers: list[int], escalated: bool) -> None:
        """Record a round's committed ``tokens``; after an escalation nothing stays pending."""
        if not escalated:
            self.pending += [(t, tier) for t, tier in zip(tokens, tiers)]
        self.emitted += len(tokens)

    def finish(self, c: Counters) -> None:
        """Count the tokens never audited and the position of the first wrong one."""
        c.bump("audit/unaudited", len(self.pending))
        c.bump("audit/tokens_to_first_wrong", self.emitted if self.first_wrong is None else self.first_wrong)
