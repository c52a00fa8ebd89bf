"""VIA-SD's trace world: the routed verifiers' gate values, priced passes and tier 3, read from a run's traces.

:class:`VerifiersTrace` is the trace side of :func:`~viasd.methods.via_sd.via_rounds` (the live side:
:class:`~viasd.methods.via_sd.LiveVerifiers`): the gate values :func:`~viasd.core.tiers.route_levels`
reads come from the traces (:func:`_gate`, each verifier's from its own trace file), the slim and full passes are priced by the cost model, and the
full model's verdict is its traced greedy tokens.
"""

from __future__ import annotations

import math
from typing import Any

from viasd.analysis.gates import check_gate, learned_values, oracle_values
from viasd.analysis.sim import Model, greedy_verify
from viasd.analysis.trace import layers_key, slim_key
from viasd.analysis.traces import Episode, OnEpisode
from viasd.core.tiers import END, ESCALATE, Level, escalate_at_once, route_levels
from viasd.engine.drafters import Proposal
from viasd.engine.gate_file import load_gate
from viasd.engine.rounds import Audit, token_tiers
from viasd.methods.via_sd import slim_name


def _gate(ep: Episode, slim: Model, slim_spec: str, t: int, y: list[int], sources, cfg,
          tau_accept: float | None = None) -> dict[str, Any]:
    """The gate values :func:`route_positions` reads, from the traces (see the module docstring);
    ``tau_accept``: this verifier's (default: the method's), for the undetermined count."""
    tau_accept = cfg.tau_accept if tau_accept is None else tau_accept
    temp, tr = float(cfg.gate_temperature), ep.traces
    rows = ep.traj.rows(t, y)
    conf_row = slim.rows.max_prob(temp)
    conf = [float(conf_row[r]) if r is not None else math.nan for r in rows]
    s, draft_conf, undetermined = [], [], 0
    for j, (src, r) in enumerate(zip(sources, rows)):
        if r is None:  # after an off-trajectory token: unknown (escalates)
            s.append(math.nan)
            draft_conf.append(math.nan)
            continue
        if src is None:  # a one-hot lookup token: p̂(y) = 1
            value, exact = tr.lookup_ratio(ep.i, slim_spec, temp, r, y[j])
            p = 1.0
        else:
            p_all, _, exact_all, s_all = tr.ratio(ep.i, _spec(src[0], cfg), slim_spec, temp)
            value, exact, p = float(s_all[r]), bool(exact_all[r]), float(p_all[r])
            if cfg.agreement == "tv":  # from the two top-k sets: a lower bound unless the rows are full
                value, exact = float(tr.tv(ep.i, _spec(src[0], cfg), slim_spec, temp)[r]), True
        if cfg.agreement == "slim_rel":  # q̂'(y) / max q̂' (q̂'(y) is min(1, q̂'(y)/1) for a lookup token)
            value = (value if src is None else float(tr.ratio(ep.i, _spec(src[0], cfg), slim_spec, temp)[1][r])) / conf[j]
        if not exact:  # a token outside the slim verifier's top-k: agreement 0 (its upper bound was `value`)
            undetermined += value >= tau_accept
            value = 0.0
        s.append(value)
        draft_conf.append(p)
    ep.c.bump("replay/gate_undetermined", int(undetermined) if cfg.gate == "thresholds" else 0)
    return {"s": s, "conf": conf, "draft_conf": draft_conf, "rows": rows}


def _spec(stream: str, cfg) -> str:
    if stream == "draft":
        return "draft"
    return layers_key(cfg.drafter.layers) if cfg.drafter.layers is not None else "self:default"


def _resume_price(ep: Episode, cfg, meta: dict[str, Any]):
    """The price of a full pass that resumes from the slim pass's shared prefix (``slim.share_prefix``,
    a routed slim verifier): a routed forward through the target's layers from the first one the mask
    skips; None (the full forward) otherwise or without a cost model. Approximate where a round
    without a slim pass leaves the prefix of some tokens to the full pass (priced as shared)."""
    if ep.cost is None or not getattr(cfg.slim, "share_prefix", True) or meta.get("role") in ("intermediate", "draft"):
        return None
    n, kept = ep.cost.entry("target").n_layers, meta.get("layers")
    if n is None or not kept:
        return None
    first = min(set(range(n)) - {int(i) for i in kept}, default=n)
    if first >= n or first == 0:
        return None
    return ep.cost.pricer("target", n - int(first))


class VerifiersTrace(OnEpisode):
    """VIA-SD's replay world: an :class:`Episode` plus the routed verifiers' traces (cheapest first), priced
    streams and gate — the trace side of :func:`~viasd.methods.via_sd.via_rounds` (live:
    :class:`~viasd.methods.via_sd.LiveVerifiers`)."""

    def __init__(self, ep: Episode, cfg):
        self.ep, self.cfg = ep, cfg
        slims = cfg.slims()
        self.specs = [slim_key(s) for s in slims]
        self.spec = self.specs[0]
        self.slim_streams = []
        for j, spec in enumerate(self.specs):
            f = ep.traces.file(spec)
            slim_cost = ("intermediate", None) if f.meta["role"] in ("intermediate", "draft") else ("target",
                                                                                                  f.meta["n_layers"])
            if j == 0:
                self.target_stream = ep.stream("target")
                self.resume = _resume_price(ep, cfg, f.meta) if len(slims) == 1 else None  # a hierarchy: own caches
            self.slim_streams.append(ep.stream(slim_name(j), *slim_cost))
        self.slim_stream = self.slim_streams[0]
        self.slims = [ep.model(spec, slim_name(j)) for j, spec in enumerate(self.specs)]
        self.slim = self.slims[0]
        self.knobs, self.bands = cfg.route_knobs(), cfg.bands()
        self.gate = load_gate(cfg.gate_path) if cfg.gate == "learned" else None
        if self.gate is not None:
            check_gate(self.gate, ep.traces, self.spec)
        self.sources: list = []
        self.slim_ran = False

    def propose(self, drafter, k: int, min_confidence: float) -> Proposal:
        y, self.sources = drafter.propose(self.ep.t, [], k, min_confidence)
        self.slim_ran = False
        return Proposal(y, None, None, y)

    def route(self, proposal: Proposal, unverified: int, run: int):
        """The gate values from the traces (a deeper verifier's only when a position climbs to it), the routing
        decision, and the passes' prices of the verifiers that ran."""
        ep, cfg, t, y = self.ep, self.cfg, self.ep.t, proposal.tokens
        first: dict = {}

        def level(j: int) -> Level:
            g = _gate(ep, self.slims[j], self.specs[j], t, y, self.sources, cfg, self.bands[j].tau_accept)
            top = self.slims[j].argmaxes(g["rows"])  # the verifier's greedy tokens: its rewrite at i, its bonus at k
            if j == 0 and self.gate is not None:
                p_spec = _spec("draft" if cfg.drafter.name == "model" else "self", cfg)
                g["s"], g["conf"] = learned_values(ep, self.gate, self.slim, p_spec, self.spec, y, g, run,
                                                   float(cfg.gate_temperature))
            elif cfg.gate == "oracle":  # every verifier: the cheapest whose token is the target's commits it
                g["s"], g["conf"] = oracle_values(ep, self.slims[j], y, g["rows"])
            first.update(g if j == 0 else {})
            return Level(g["s"], g["conf"], top.__getitem__, lambda top=top: top[-1], top[:-1])

        cheapest = level(0)
        route = route_levels(lambda j: cheapest if j == 0 else level(j), y, self.bands, unverified=unverified,
                             draft_conf=first["draft_conf"], **self.knobs)
        if cfg.gate == "oracle" and route.action in (ESCALATE, END):  # the slim verifier cannot commit what the
            return escalate_at_once()  # target would this round: sd's round, no slim pass
        self.slim_ran = True
        for j in range(route.levels_run):
            self.slim_streams[j].call(t, y, last=len(y) + 1)
        return route

    def escalate(self, proposal: Proposal, route, y_host, audit: Audit | None):
        """Tier 3 on the trace: the target's (priced) pass and greedy verification, with the free audit."""
        ep, t, y = self.ep, self.ep.t, proposal.tokens
        k, start = len(y), route.verify_from
        audited = audit.rows(start) if audit is not None else 0
        self.target_stream.call(t, y, last=k - start + 1 + audited, price=self.resume if self.slim_ran else None)
        if audited:
            back = t - len(audit.pending)  # the pending tokens are the last committed ones
            greedy = [ep.target.argmax(back + j, []) if back + j < t else ep.target.argmax(t, y[:back + j - t])
                      for j in range(audited)]
            audit.check(ep.c, greedy, y[:start], token_tiers(route, start))
        n, token = greedy_verify(y[start:], ep.target.argmaxes(ep.traj.rows(t, y)[start:]))
        return n, token, y

    def host(self, proposal: Proposal) -> list[int]:
        return proposal.tokens

    def commit(self, tokens: list[int], tiers: list[int]) -> int:
        return self.ep.commit(tokens, tiers)

    def tail(self, n: int) -> list[int]:
        """The last ``n`` committed tokens (the trajectory's: a divergent token is replaced by it)."""
        return self.ep.traj.tokens[self.ep.t - n:self.ep.t]

    def record(self, round) -> None:
        """Rounds are not kept (a replay reports counters)."""
