"""The learned VIA-SD gate's features and its model, as pure functions (decode and replay share them).

A learned gate (``method.gate=learned``) decides per drafted position whether to trust the slim
verifier's decision (tier 1 when its greedy token is the draft's, else a tier-2 rewrite) or to
escalate to the full model. It sees only what is known at decision time, never the target:
:func:`gate_features` builds one row per position from the draft's and the slim verifier's
*top-k* gate probabilities (``softmax(raw / T_g)``, the ``k`` largest) and the probabilities of
the drafted token — exactly what a trace stores (top-k logits + ``lse``), so a decode (which has
full rows and takes their top-k) and a replay compute the same numbers. Approximations, all
from the top-k sets (exact when ``k ≥ V``):

* ``tv`` = ``1 − Σ_{v ∈ top-k(p̂)} min(p̂(v), q̂'(v))`` (``q̂'(v) = 0`` outside the slim top-k):
  an upper bound of ``TV(p̂, q̂')``;
* ``kl`` = ``Σ_{v ∈ top-k(p̂)} p̂(v) (log p̂(v) − log q̃(v))`` with ``q̃(v)`` the slim probability,
  or its ``k``-th largest one outside its top-k: ``KL(p̂ ‖ q̂')`` restricted to the draft's top-k;
* entropies ``−Σ_{top-k} p log p`` (the mass outside the top-k left out).

:func:`gate_probability` is the model: a standardized logistic regression (trained by
scikit-learn's ``LogisticRegression`` in ``experiments.train_gate``; its coefficients are all a
gate file stores, so the decode needs no scikit-learn). :func:`next_run` keeps the run of
accepted draft tokens the same way in both loops.
"""

from __future__ import annotations

import torch

#: The feature columns of :func:`gate_features`, in order.
FEATURES = ("p_tok", "q_tok", "ratio", "slim_rel", "p_max", "q_max", "top1_agree", "tv", "kl",
            "entropy_p", "entropy_q", "block_pos", "log_seq_pos", "run")
_TINY = 1e-12


def gate_features(draft: torch.Tensor, p_tok: torch.Tensor, q_tok: torch.Tensor, p_ids: torch.Tensor,
                  p_top: torch.Tensor, q_ids: torch.Tensor, q_top: torch.Tensor, block_pos: torch.Tensor,
                  seq_pos: torch.Tensor, run: torch.Tensor) -> torch.Tensor:
    """Decision-time features of ``n`` drafted positions → ``[n, len(FEATURES)]`` float64.

    ``draft`` ``[n]``: the drafted tokens; ``p_tok``, ``q_tok`` ``[n]``: their draft / slim gate
    probabilities; ``p_ids``, ``p_top`` / ``q_ids``, ``q_top`` ``[n, K]``: the top-k ids and gate
    probabilities of the draft / the slim verifier, sorted descending; ``block_pos`` (position in
    the block), ``seq_pos`` (tokens generated before it), ``run`` (accepted draft tokens in a row
    before it) ``[n]``.
    """
    p_top, q_top = p_top.double(), q_top.double()
    p_tok, q_tok = p_tok.double(), q_tok.double()
    match = p_ids[:, :, None] == q_ids[:, None, :]  # [n, K, K]
    q_at_p = (match * q_top[:, None, :]).sum(-1)  # [n, K]; 0 outside the slim top-k
    found = match.any(-1)
    q_floor = torch.where(found, q_at_p, q_top[:, -1:].expand_as(q_at_p))
    kl = (p_top * (p_top.clamp_min(_TINY).log() - q_floor.clamp_min(_TINY).log())).sum(-1)
    tv = 1 - torch.minimum(p_top, q_at_p).sum(-1)
    cols = [p_tok, q_tok, torch.clamp(q_tok / p_tok.clamp_min(_TINY), max=1.0), q_tok / q_top[:, 0].clamp_min(_TINY),
            p_top[:, 0], q_top[:, 0], (q_ids[:, 0] == draft).double(), tv, kl,
            -(p_top * p_top.clamp_min(_TINY).log()).sum(-1), -(q_top * q_top.clamp_min(_TINY).log()).sum(-1),
            block_pos.double(), torch.log1p(seq_pos.double()), run.double()]
    return torch.stack(cols, -1)


def gate_probability(features: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor, coef: torch.Tensor,
                     intercept: float) -> torch.Tensor:
    """``P(the slim verifier's decision is the target's)`` per row: ``σ(((x − mean)/scale)·coef + b)``.

    ``features`` ``[n, F]``; ``mean``, ``scale``, ``coef`` ``[F]`` (a standardized logistic
    regression) → ``[n]`` float64.
    """
    z = ((features.double() - mean.double()) / scale.double()) @ coef.double() + float(intercept)
    return torch.sigmoid(z)


def learned_gate_values(prob: torch.Tensor, slim_top: list[int], draft: list[int]) -> tuple[list[float], list[float]]:
    """``(s, conf)`` for :func:`~viasd.core.tiers.route_positions` from the gate's probabilities ``prob`` ``[k]``:
    with ``τ_accept = τ_slim = θ`` a position whose probability reaches ``θ`` trusts the slim verifier
    (tier 1 when its greedy token ``slim_top[i]`` is the draft's, else a tier-2 rewrite); below
    ``θ`` it escalates."""
    s = [float(g) if a == b else 0.0 for g, a, b in zip(prob.tolist(), slim_top, draft)]
    return s, [float(g) for g in prob.tolist()]


def oracle_gate_values(draft: list[int], slim_top: list[int], target: list[int | None]) -> tuple[list[float], list[float]]:
    """``(s, conf)`` of the oracle gate over ``k + 1`` positions (``target[i]``: the target's greedy token,
    ``None`` where unknown): with ``τ_accept = τ_slim = 0.5`` it accepts a draft token equal to the
    target's, lets the slim verifier rewrite (or add its bonus) when its token is the target's, and
    escalates otherwise — the cheapest tier whose committed token is the target's."""
    s = [1.0 if t is not None and y == t else 0.0 for y, t in zip(draft, target)]
    conf = [1.0 if t is not None and q == t else 0.0 for q, t in zip(slim_top, target)]
    return s, conf


def next_run(run: int, drafted: int, kept: int) -> int:
    """The run of accepted draft tokens after a round that kept ``kept`` of ``drafted``: it grows while
    whole blocks are kept and restarts at 0 after a rejected or rewritten token."""
    return run + kept if kept == drafted else 0


def dense_gate_features(draft: torch.Tensor, p_gate: torch.Tensor, q_gate: torch.Tensor, topk: int, seq_pos: int,
                        run: int) -> torch.Tensor:
    """:func:`gate_features` of one drafted block from full gate distributions (the decode's side):
    ``draft`` ``[k]``, ``p_gate`` ``[k, V]``, ``q_gate`` ``[≥ k, V]`` reduced to their top-``topk``
    as a trace keeps them; ``seq_pos``: tokens generated before the block → ``[k, F]``."""
    k = draft.shape[0]
    idx = torch.arange(k, device=draft.device)
    pv, pi = p_gate.float().topk(min(topk, p_gate.shape[-1]), -1)
    qv, qi = q_gate[:k].float().topk(min(topk, q_gate.shape[-1]), -1)
    pos = torch.arange(k, dtype=torch.float64)
    return gate_features(draft.cpu(), p_gate[idx, draft].cpu(), q_gate[idx, draft].cpu(), pi.cpu(), pv.cpu(),
                         qi.cpu(), qv.cpu(), pos, pos + seq_pos, pos + run)
