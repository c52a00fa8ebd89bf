"""``faster_cascades`` in replay: its deferral rules read from a trace, decided by the method's own functions.

This module owns the replay twin of :func:`viasd.methods.faster_cascades.faster_cascades` for greedy
runs. Per round it proposes a block with the replay drafter (:mod:`viasd.analysis.sim`), and for
each drafted position builds *reduced* rows over the tokens involved (the draft token ``y`` and the
target's greedy token ``z``) that hold exactly what a rule reads in greedy mode, then calls
:func:`~viasd.core.cascade_rules.target_distribution` (the same rule functions as the decode),
:func:`~viasd.methods.faster_cascades.first_rejection` and :func:`~viasd.core.rules.sd_residual`.

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
from viasd.core.cascade_rules import target_distribution
from viasd.core.rules import sd_residual
from viasd.errors import ConfigError
from viasd.methods.faster_cascades import first_rejection

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


def replay_faster_cascades(ep, cfg, length_policy) -> None:
    """Run ``faster_cascades`` (``cfg``: its :class:`~viasd.methods.faster_cascades.FasterCascadesConfig`)
    over episode ``ep`` (:class:`~viasd.analysis.replay.Episode`) with ``length_policy`` (a
    :class:`~viasd.engine.drafters.LengthPolicy`), committing along the trajectory.

    Counters as the method's (``rounds``, ``drafted``, ``accepted``, ``deferred``, calls per model); tokens
    the rule kept from the drafter (``π = p``) count as tier 1, the others (from ``q``) as tier 3.
    Positions after a context that left the trajectory have no rows: their decisions are not taken
    (``replay/deferral_unknown`` counts them; ``deferred`` is then an estimate).
    """
    if cfg.drafter.name not in DRAFTERS:
        raise ConfigError(f"faster_cascades replay supports drafters {', '.join(DRAFTERS)}; "
                          f"got method.drafter.name={cfg.drafter.name}")
    target = ep.stream("target")  # created before the drafter's streams, as the method does
    drafter = build_drafter(ep, cfg.drafter, None)
    rows, q_rows = _draft_rows(drafter), ep.target.rows
    q_max = q_rows.max_prob(1.0)
    p_max = rows.max_prob(1.0) if rows is not None else None

    def decide(y: list[int], sources, at: list[int]):
        """:func:`greedy_targets` of the draft tokens ``y`` at the known trace rows ``at``."""
        z = [int(q_rows.argmax[r]) for r in at]
        p1 = [float(p_max[src[1]]) if src is not None else 1.0 for src in sources]
        q1_y = [q_rows.prob(r, tok, 1.0) for r, tok in zip(at, y)]  # (probability or its bound, exact)
        qm = [float(q_max[r]) for r in at]
        out = greedy_targets(cfg.rule, cfg.alpha, y, z, p1, qm, [v if ok else 0.0 for v, ok in q1_y])
        if not all(ok for _, ok in q1_y):  # a draft token the target's file did not keep: both ends of its bound
            pi_hi = greedy_targets(cfg.rule, cfg.alpha, y, z, p1, qm, [v for v, _ in q1_y])[1]
            ep.c.bump("replay/gate_undetermined", int((pi_hi != out[1]).any(-1).sum()))
        ep.c.bump("deferred", int(out[2].sum()))
        return out

    while ep.t < ep.traj.n:
        t = ep.t
        y, sources = drafter.propose(t, [], length_policy.next(ep.max_new - t), length_policy.min_confidence)
        k = len(y)
        target.call(t, y, last=k + 1)
        at = ep.traj.rows(t, y)
        m = next((j for j in range(k) if at[j] is None), k)  # positions with rows (the rest left the trajectory)
        ep.c.bump("replay/deferral_unknown", k - m)
        n, tiers = 0, []
        if m:
            p, pi, _, vocab = decide(y[:m], sources[:m], at[:m])
            n = first_rejection(torch.tensor([vocab.index(x) for x in y[:m]], dtype=torch.long), p, pi, _RNG)
            tiers = [1 if bool((pi[j] == p[j]).all()) else 3 for j in range(n)]
        if n < m:  # the correction from the residual of π against p (one-hot on the target's greedy token)
            token, tier = vocab[int(sd_residual(p[n], pi[n]).argmax())], 3
        elif m < k or at[k] is None:  # a context off the trajectory (after a divergence): unknown
            token, tier = ep.traj.unknown(), 3
        else:  # the bonus from π_{k+1}: one more proposal of the drafter (π = q when it has none)
            x, src = drafter.propose(t, y, 1)
            token, tier = int(q_rows.argmax[at[k]]), 3
            if x:
                p_b, pi_b, _, vocab_b = decide(x, src, [at[k]])
                token = vocab_b[int(pi_b[0].argmax())]
                tier = 1 if bool((pi_b[0] == p_b[0]).all()) else 3
        emitted = ep.commit(y[:n] + [token], tiers + [tier])
        length_policy.update(k, n)
        ep.c.record_round(k, n, emitted)
