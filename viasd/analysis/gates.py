"""The learned and oracle VIA-SD gates over traces: their gate values in replay, and the learned
gate's labelled training rows.

Both read a run's traces (:class:`~viasd.analysis.replay.TraceSet`) by duck typing (``rows``,
``ratio``, ``trajectory``, ``_memo``), so :mod:`viasd.analysis.replay` can call them:

* :func:`learned_values` — the features of :func:`viasd.core.gate.gate_features` of one drafted
  block from the trace's top-k rows (the decode computes the same from its full rows) and the
  gate's ``(s, conf)``;
* :func:`oracle_values` — the oracle's ``(s, conf)``: the target's greedy tokens are known;
* :func:`training_rows` — labelled rows for ``experiments.train_gate``: greedy ``sd`` with the
  draft replayed along the trajectory (so positions, block positions and runs of accepts are
  distributed as in a decode), one row per drafted position the trace covers, labelled 1 when the
  slim verifier's greedy token is the target's (trusting it commits the target's token).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from viasd.core.gate import gate_features, learned_gate_values, next_run, oracle_gate_values
from viasd.errors import ConfigError


def _topk(traces, spec: str, i: int, temperature: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``([N, k] ids, [N, k] probabilities)`` of a model's top-k rows of example ``i`` (memoized)."""
    key = ("gate_topk", spec, i, float(temperature), k)
    if key not in traces._memo:
        rows = traces.rows(spec, i)
        if rows.a["topk_ids"].shape[1] < k:
            raise ConfigError(f"the gate reads the top-{k} of {spec!r} but the trace kept {rows.a['topk_ids'].shape[1]}; "
                              f"re-trace with topk={k} or more")
        ids, probs = rows.topk_probs(temperature)
        traces._memo[key] = (ids[:, :k], probs[:, :k])
    return traces._memo[key]


def trace_features(traces, i: int, p_spec: str, q_spec: str, rows: list[int], block_pos: list[int],
                   runs: list[int], topk: int, temperature: float) -> torch.Tensor:
    """Gate features ``[n, F]`` at trace rows ``rows`` of example ``i`` (row ``r``: after ``r`` generated
    tokens) where the drafted token is the greedy token of ``p_spec``; ``block_pos``: its position in
    the block, ``runs``: the accepts in a row before its block."""
    p, q, _, _ = traces.ratio(i, p_spec, q_spec, temperature)
    pi, pp = _topk(traces, p_spec, i, temperature, topk)
    qi, qp = _topk(traces, q_spec, i, temperature, topk)
    r = np.asarray(rows, dtype=np.int64)
    draft = traces.rows(p_spec, i).argmax[r]
    seq = r
    pos = np.asarray(block_pos)
    t = torch.from_numpy
    return gate_features(t(draft.astype(np.int64)), t(p[r]), t(q[r]), t(pi[r].astype(np.int64)), t(pp[r]),
                         t(qi[r].astype(np.int64)), t(qp[r]), t(pos), t(seq.astype(np.float64)),
                         t((np.asarray(runs) + pos).astype(np.float64)))


def learned_values(ep, gate, slim, p_spec: str, q_spec: str, y: list[int], g: dict[str, Any], run: int,
                   temperature: float) -> tuple[list[float], list[float]]:
    """The learned gate's ``(s, conf)`` of one replayed block (``g``: the thresholds gate's values, for its
    ``rows`` and the bonus position's slim confidence): NaN (escalate) at rows off the trajectory."""
    rows, k = g["rows"], len(y)
    known = [j for j in range(k) if rows[j] is not None]
    prob = torch.full((k,), float("nan"), dtype=torch.float64)
    if known:
        feats = trace_features(ep.traces, ep.i, p_spec, q_spec, [rows[j] for j in known], known, [run] * len(known),
                               gate.topk, temperature)
        prob[known] = gate.probability(feats)
    top = slim.argmaxes(rows)
    s, conf = learned_gate_values(prob, top[:k], y)
    return s, conf + [g["conf"][k]]


def oracle_values(ep, slim, y: list[int], rows: list[int | None]) -> tuple[list[float], list[float]]:
    """The oracle gate's ``(s, conf)`` of one replayed block (``rows``: ``k + 1`` trace rows)."""
    target = [int(ep.target.rows.argmax[r]) if r is not None else None for r in rows]
    return oracle_gate_values(y + [-1], slim.argmaxes(rows), target)


def check_gate(gate, traces, q_spec: str) -> None:
    """One error line unless ``gate`` was trained for this trace's pair and the slim mask ``q_spec`` serves."""
    f = traces.file(q_spec)
    gate.check(str(f.meta.get("pair", traces.meta.get("pair"))), f.meta.get("layers"))


def training_rows(traces, i: int, p_spec: str, q_spec: str, gamma: int, topk: int,
                  temperature: float = 1.0) -> tuple[torch.Tensor, np.ndarray]:
    """Labelled rows of example ``i``: ``([n, F] features, [n] labels)`` (see the module docstring)."""
    traj = traces.trajectory(i)
    target, slim = traces.rows("target", i).argmax, traces.rows(q_spec, i).argmax
    draft = traces.rows(p_spec, i).argmax
    n_tok, t, run = traj.n, 0, 0
    rows, pos, runs = [], [], []
    while t < n_tok:
        k = min(gamma, n_tok - t)
        n = 0
        while n < k:
            rows.append(t + n)
            pos.append(n)
            runs.append(run)
            if int(draft[t + n]) != int(traj.tokens[t + n]):
                break
            n += 1
        run = next_run(run, k, n)
        t += n + 1
    if not rows:
        return torch.zeros((0, 0), dtype=torch.float64), np.zeros(0, dtype=bool)
    feats = trace_features(traces, i, p_spec, q_spec, rows, pos, runs, topk, temperature)
    labels = slim[rows] == target[rows]
    return feats, labels

