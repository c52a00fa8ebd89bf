"""Sampling replay: expected counters of ``sd`` along a sampled run's trajectory.

A sampled run's trajectory is one draw; its tokens cannot say which drafts another policy would
have drawn. What the trace does give is each position's acceptance probability of speculative
sampling (Leviathan et al. 2023): for a draft model ``α_r = Σ_v min(p_r(v), q_r(v))``
(:func:`~viasd.core.rules.acceptance_rate` of the two processed distributions at the run's
temperature, from their top-k: a lower bound, ``docs/replay.md``), for a deterministic lookup
token ``y`` ``α_r = q_r(y)``. Treating the acceptances of a block as independent with these
probabilities along the trajectory, the round starting at ``t`` accepts ``j`` tokens with
probability ``α_t … α_{t+j−1} (1 − α_{t+j})`` and the next round starts at ``t + j + 1``;
:func:`expected_sd` propagates the distribution of round starts and returns *expected* counters
(floats), never the run's own (which were one draw). Only ``sd`` with the ``model``, ``ngram`` or
``hybrid`` drafter and a constant block length is replayed this way; the result says so
(``expected: true``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from viasd.errors import ConfigError


def expected_sd(traces, i: int, cfg, temperature: float) -> dict[str, float]:
    """Expected ``target_calls``, ``rounds``, ``drafted``, ``accepted``, ``draft_calls`` and ``new_tokens``
    of ``sd`` (config ``cfg``) over example ``i`` of ``traces`` (a :class:`~viasd.analysis.replay.TraceSet`)."""
    d = cfg.drafter
    if d.name not in ("model", "ngram", "hybrid") or d.length_policy != "constant":
        raise ConfigError(f"sampling replay covers sd with the model, ngram or hybrid drafter and a constant block "
                          f"length (got drafter {d.name!r}, length policy {d.length_policy!r}); replay a greedy run")
    traj = traces.trajectory(i)
    n, q = traj.n, traces.rows("target", i)
    alpha_model = traces.tv(i, "draft", "target", temperature) if d.name in ("model", "hybrid") else None
    lookup = traces.lookup(i, d.ngram_max, d.ngram_min if d.name == "ngram" else d.lookup_min) \
        if d.name != "model" else None
    start = np.zeros(n + 1)
    start[0] = 1.0
    e = dict.fromkeys(("target_calls", "rounds", "drafted", "accepted", "draft_calls"), 0.0)
    max_new = int(traces.meta["max_new_tokens"])
    for t in range(n):
        w = start[t]
        if w == 0:
            continue
        k = max(0, min(int(cfg.gamma), max_new - t - 1))
        found = lookup.found(t)[:k] if lookup is not None and k else []
        if found:
            alphas = [q.prob(t + j, y, temperature)[0] if t + j < n else 0.0 for j, y in enumerate(found)]
        elif alpha_model is not None:
            alphas = [float(alpha_model[t + j]) if t + j < n else 0.0 for j in range(k)]
            e["draft_calls"] += w * k
        else:
            alphas = []
        survive = 1.0
        for j in range(len(alphas) + 1):
            p_j = survive * (1.0 - alphas[j]) if j < len(alphas) else survive
            start[min(n, t + j + 1)] += w * p_j
            e["accepted"] += w * p_j * j
            if j < len(alphas):
                survive *= alphas[j]
        e["target_calls"] += w
        e["rounds"] += w
        e["drafted"] += w * len(alphas)
    return {**e, "new_tokens": float(n)}


def expected_summary(traces, idx: list[int], policy, temperature: float) -> dict[str, Any]:
    """:func:`expected_sd` summed over examples, with the derived ratios a run's summary has."""
    if policy.method != "sd":
        raise ConfigError(f"sampling replay covers sd only (got {policy.method}); replay a greedy run of it")
    tot: dict[str, float] = {}
    for i in idx:
        for k, v in expected_sd(traces, i, policy.cfg, temperature).items():
            tot[k] = tot.get(k, 0.0) + v
    new, drafted = tot["new_tokens"], tot["drafted"]
    tot.update({"rejection_rate": 1 - tot["accepted"] / drafted if drafted else float("nan"),
                "target_calls_per_token": tot["target_calls"] / new if new else float("nan"),
                "mean_accepted": new / tot["rounds"] if tot["rounds"] else float("nan")})
    return tot
