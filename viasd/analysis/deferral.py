"""``faster_cascades`` in replay: its deferral rules read from a trace, decided by the method's own functions.

This module owns the trace world of :func:`viasd.methods.faster_cascades.deferral_rounds` (the method's
loop, run as it is) for greedy runs. Per round the replay drafter (:mod:`viasd.analysis.sim`) proposes, and for
each drafted position builds *reduced* rows over the tokens involved (the draft token ``y`` and the
target's greedy token ``z``) that hold exactly what a rule reads in greedy mode, then calls
:func:`~viasd.core.cascade_rules.target_distribution` (the same rule functions as the decode); the loop
takes :func:`~viasd.methods.faster_cascades.first_rejection` and :func:`~viasd.core.rules.sd_residual` on them.

Greedy mode: ``p`` and ``q`` are one-hot on ``y`` and ``z``, so ``π`` is ``p`` or ``q`` and every
rule's decision depends only on

* ``max p1`` — the drafter's temperature-1 maximum probability (``chow``, ``diff``, ``opt``,
  ``token_v1``; ``p1(y) = max p1`` for a model drafter's greedy token, 1 for a lookup token):
  exact from any trace (top-1 logit and ``lse`` at T = 1);
* ``max q1`` — the target's (``diff``, ``opt``, ``token_v*``): exact;
* ``TV(p, q)`` (``opt``) — 0 or 1 from whether ``y = z``: exact;
* ``q1(y)`` — the target's temperature-1 probability of the draft token (``token_v2``,
  ``token_v3``): exact when the target's file kept ``y`` (its top-k or the trajectory token), else
  only bounded by the k-th largest probability. The decision is taken at both ends of ``[0, bound]``;
  where they differ it is undetermined, taken at 0 (``π = q``) and counted in
  ``replay/gate_undetermined``.

The reduced decision rows are not normalized (the rest of the mass sits on tokens ``p`` gives 0,
which no rule reads in greedy mode). Sampled runs are refused (``replay``): there the rules need
full rows of ``p`` and ``q``.
"""

from __future__ import annotations

import torch

from viasd.analysis.sim import _RNG, HybridSim, ModelSim, build_drafter
from viasd.analysis.traces import OnEpisode
from viasd.core.cascade_rules import target_distribution
from viasd.core.rules import sd_residual
from viasd.engine.drafters import Proposal
from viasd.errors import ConfigError
from viasd.methods.faster_cascades import Deferral, deferral_rounds

DRAFTERS = ("model", "ngram", "hybrid", "self")


def _draft_rows(drafter):
    """The traced rows behind a replay drafter's model tokens (None: a lookup drafter, one-hot)."""
    if isinstance(drafter, HybridSim):
        drafter = drafter.model
    return drafter.model.rows if isinstance(drafter, ModelSim) else None


def greedy_targets(rule: str, alpha: float, y: list[int], z: list[int], p1: list[float], q1_max: list[float],
                   q1_y: list[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """``(p, π, deferred, vocab)`` of a greedy block under ``rule`` with lenience ``alpha``, on reduced rows.

    Per position ``j`` (``m ≥ 1`` of them): the draft token ``y[j]``, the target's greedy token ``z[j]``,
    the drafter's decision probability of ``y[j]`` (``p1``), the target's maximum (``q1_max``) and its
    probability of ``y[j]`` (``q1_y``). Returns ``p`` ``[m, V']`` (one-hot), ``π`` ``[m, V']`` one-hot on
    ``argmax`` of :func:`~viasd.core.cascade_rules.target_distribution` (as the decode takes it),
    ``deferred`` bool ``[m]`` (``π ≠ p`` before the one-hot: the method's ``deferred`` counter) and
    ``vocab``: the token of each of the ``V'`` columns (the tokens of ``y`` and ``z`` in order of appearance).
    """
    vocab = list(dict.fromkeys(y + z))
    col = {tok: i for i, tok in enumerate(vocab)}
    m, idx = len(y), torch.arange(len(y))
    yi, zi = torch.tensor([col[t] for t in y], dtype=torch.long), torch.tensor([col[t] for t in z], dtype=torch.long)
    eye = torch.eye(len(vocab), dtype=torch.float64)
    p, q = eye[yi], eye[zi]
    p1r = torch.zeros(m, len(vocab), dtype=torch.float64)
    p1r[idx, yi] = torch.tensor(p1, dtype=torch.float64)
    q1r = torch.zeros(m, len(vocab), dtype=torch.float64)
    q1r[idx, yi] = torch.tensor(q1_y, dtype=torch.float64)
    q1r[idx, zi] = torch.tensor(q1_max, dtype=torch.float64)  # z = argmax q1 (written last: y = z keeps the max)
    pi = target_distribution(rule, p, q, alpha, p1r, q1r)
    deferred = (pi != p).any(-1)
    return p, torch.nn.functional.one_hot(pi.argmax(-1), len(vocab)).to(pi.dtype), deferred, vocab


class DeferralTrace(OnEpisode):
    """``faster_cascades``' trace world: the trace side of :func:`~viasd.methods.faster_cascades.deferral_rounds`
    (live: :class:`~viasd.methods.faster_cascades.LiveDeferral`) over an episode ``ep``
    (:class:`~viasd.analysis.traces.Episode`), committing along its trajectory.

    Counters as the method's (``rounds``, ``drafted``, ``accepted``, ``deferred``, calls per model); tokens
    the rule kept from the drafter (``π = p``) count as tier 1, the others (from ``q``) as tier 3.
    Positions after a context that left the trajectory have no rows: their decisions are not taken
    (``replay/deferral_unknown`` counts them; ``deferred`` is then an estimate).
    """

    rng = _RNG  # greedy verification draws nothing that matters

    def __init__(self, ep, cfg):
        if cfg.drafter.name not in DRAFTERS:
            raise ConfigError(f"faster_cascades replay supports drafters {', '.join(DRAFTERS)}; "
                              f"got method.drafter.name={cfg.drafter.name}")
        self.ep, self.cfg = ep, cfg
        self.target = ep.stream("target")  # created before the drafter's streams, as the method does
        self.q_rows = ep.target.rows
        self.q_max = self.q_rows.max_prob(1.0)
        self.p_max = None
        self.sources: list = []
        self._round: tuple = ()

    def attach(self, drafter) -> None:
        """Read the traced rows behind ``drafter``'s model tokens (none for a lookup drafter)."""
        rows = _draft_rows(drafter)
        self.p_max = rows.max_prob(1.0) if rows is not None else None

    def propose(self, drafter, k: int, min_confidence: float) -> Proposal:
        y, self.sources = drafter.propose(self.ep.t, [], k, min_confidence)
        return Proposal(y, None, None, y)

    def decide(self, y: list[int], sources, at: list[int]):
        """:func:`greedy_targets` of the draft tokens ``y`` at the known trace rows ``at``."""
        cfg, q_rows = self.cfg, self.q_rows
        z = [int(q_rows.argmax[r]) for r in at]
        p1 = [float(self.p_max[src[1]]) if src is not None else 1.0 for src in sources]
        q1_y = [q_rows.prob(r, tok, 1.0) for r, tok in zip(at, y)]  # (probability or its bound, exact)
        qm = [float(self.q_max[r]) for r in at]
        out = greedy_targets(cfg.rule, cfg.alpha, y, z, p1, qm, [v if ok else 0.0 for v, ok in q1_y])
        if not all(ok for _, ok in q1_y):  # a draft token the target's file did not keep: both ends of its bound
            pi_hi = greedy_targets(cfg.rule, cfg.alpha, y, z, p1, qm, [v for v, _ in q1_y])[1]
            self.ep.c.bump("replay/gate_undetermined", int((pi_hi != out[1]).any(-1).sum()))
        self.ep.c.bump("deferred", int(out[2].sum()))
        return out

    def defer(self, proposal: Proposal) -> Deferral:
        ep, t, y = self.ep, self.ep.t, proposal.tokens
        k = len(y)
        self.target.call(t, y, last=k + 1)
        at = ep.traj.rows(t, y)
        m = next((j for j in range(k) if at[j] is None), k)  # positions with rows (the rest left the trajectory)
        ep.c.bump("replay/deferral_unknown", k - m)
        self._round = (t, y, at, m, [])
        if not m:
            return Deferral(torch.zeros(0, dtype=torch.long), torch.zeros(0, 0), torch.zeros(0, 0), 0, [])
        p, pi, _, vocab = self.decide(y[:m], self.sources[:m], at[:m])
        self._round = (t, y, at, m, vocab)
        kept = [1 if bool((pi[j] == p[j]).all()) else 3 for j in range(m)]
        return Deferral(torch.tensor([vocab.index(x) for x in y[:m]], dtype=torch.long), p, pi, m, kept)

    def correction(self, d: Deferral, n: int) -> tuple[int, int]:
        """The residual of π against p: one-hot on the target's greedy token."""
        return self._round[4][int(sd_residual(d.p[n], d.pi[n]).argmax())], 3

    def bonus(self, drafter, proposal: Proposal, d: Deferral) -> tuple[int, int]:
        t, y, at, m, _ = self._round
        k = len(y)
        if m < k or at[k] is None:  # a context off the trajectory (after a divergence): unknown
            return self.ep.traj.unknown(), 3
        x, src = drafter.propose(t, y, 1)  # one more proposal of the drafter (π = q when it has none)
        token, tier = int(self.q_rows.argmax[at[k]]), 3
        if x:
            p_b, pi_b, _, vocab_b = self.decide(x, src, [at[k]])
            token = vocab_b[int(pi_b[0].argmax())]
            tier = 1 if bool((pi_b[0] == p_b[0]).all()) else 3
        return token, tier

    def drafted(self, proposal: Proposal, n: int) -> list[int]:
        return proposal.tokens[:n]

    def commit(self, tokens: list[int], tiers: list[int]) -> int:
        return self.ep.commit(tokens, tiers)

    def record(self, round) -> None:
        """Rounds are not kept (a replay reports counters)."""


def replay_faster_cascades(ep, cfg) -> None:
    """Run ``faster_cascades``' own loop (:func:`~viasd.methods.faster_cascades.deferral_rounds`) over episode
    ``ep`` with ``cfg`` (its :class:`~viasd.methods.faster_cascades.FasterCascadesConfig`)."""
    world = DeferralTrace(ep, cfg)
    drafter = build_drafter(ep, cfg.drafter, None)
    world.attach(drafter)
    deferral_rounds(world, drafter, cfg)
