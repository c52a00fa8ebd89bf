"""Replay a decoding policy over a finished run's trace, with the methods' own functions.

A policy is a registered method (``ar``, ``sd`` with any drafter, ``cascade_sd``, ``via_sd``, ``faster_cascades``:
:mod:`viasd.analysis.deferral`)
and its typed config. :func:`replay` runs it over every example of a :class:`TraceSet`: the
drafters' proposals (:mod:`viasd.analysis.sim`: prompt lookup itself, the draft's greedy
continuation from its trace, the cascades), :func:`~viasd.core.tiers.route_positions` (the
bands of ``route_round``), :func:`~viasd.core.rules.verify_block`, the length policy
(:class:`~viasd.engine.drafters.LengthPolicy`) and the round counting of
:mod:`viasd.engine.rounds` — the methods' code, not a copy. Only the forward passes are read
from the trace instead of run.

**Exactness** (greedy runs): along the run's own trajectory every decision is the run's, so
the counters are its counters (up to float ties; ``docs/replay.md``). Along another
trajectory (e.g. an ``ar`` run) a policy is exact up to its first *divergence* — a token it
would emit that differs from the trajectory; the replay then commits the trajectory token in its
place (counted in ``replay/divergences``) and goes on, so later counters are estimates. Draft-side
counters of cascades and of the confidence length policy are estimates (the draft's outputs after
a rejected token are not in the trace), as are gates that read a token outside the trace's top-k
(``replay/gate_undetermined``: such a token gets agreement 0). Sampled runs give *expected*
counters of ``sd`` (:mod:`viasd.analysis.expect`), marked ``expected``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from viasd.analysis.cost import CostModel
from viasd.analysis.deferral import replay_faster_cascades
from viasd.analysis.expect import expected_summary
from viasd.analysis.gates import check_gate, learned_values, oracle_values
from viasd.analysis.sim import LookupSim, Model, SimStream, Trajectory, build_drafter, greedy_verify
from viasd.analysis.stats import wilson
from viasd.analysis.trace import Rows, TraceFile, layers_key, read_index, slim_key
from viasd.core.gate import next_run
from viasd.core.rules import acceptance_rate, sd_accept_prob
from viasd.core.tiers import END, ESCALATE, escalate_at_once, route_positions
from viasd.engine.drafters import LengthPolicy
from viasd.engine.result import Counters, DecodeResult, aggregate
from viasd.engine.rounds import Audit, count_levels, count_round, round_tokens, token_tiers
from viasd.errors import ConfigError
from viasd.methods.gate_file import load_gate
from viasd.tracking.baseline import tier_shares

SUPPORTED = ("ar", "sd", "cascade_sd", "via_sd", "faster_cascades")


@dataclass
class Policy:
    """A method and its typed config (``label``: how tables name it)."""

    method: str
    cfg: Any
    label: str = ""
    overrides: list[str] = field(default_factory=list)


class TraceSet:
    """The traces of one run (``<store>/_traces/<run_id>/``): the trajectory and rows per spec."""

    def __init__(self, folder: Path):
        self.folder, self.index = Path(folder), read_index(Path(folder))
        self._files: dict[str, TraceFile] = {}
        self._memo: dict[tuple, Any] = {}
        self.target = self.file("target")
        self.meta = self.target.meta
        self.n_examples = self.target.n_examples

    def file(self, spec: str) -> TraceFile:
        """The trace file serving ``spec`` (a ConfigError names the trace command when it is missing)."""
        name = self.index["specs"].get(spec)
        if name is None:
            have = ", ".join(sorted(self.index["specs"])) or "none"
            run = self.folder.name
            fix = {"draft": "draft=true", "intermediate": "intermediate=true"}.get(spec, f"masks=[{spec}]")
            raise ConfigError(f"run {run} has no trace of {spec!r} (traced: {have}); "
                              f"run `python -m experiments.trace run={run} {fix}`")
        if name not in self._files:
            self._files[name] = TraceFile(self.folder / name)
        return self._files[name]

    def rows(self, spec: str, i: int) -> Rows:
        key = ("rows", spec, i)
        if key not in self._memo:
            self._memo[key] = self.file(spec).rows(i)
        return self._memo[key]

    def trajectory(self, i: int) -> Trajectory:
        key = ("traj", i)
        if key not in self._memo:
            t = self.target
            self._memo[key] = Trajectory(t.sequence("start", i), t.sequence("prompt", i), t.sequence("tokens", i),
                                         bool(self.meta.get("encoder_decoder")))
        return self._memo[key]

    def lookup(self, i: int, ngram_max: int, ngram_min: int) -> LookupSim:
        key = ("lookup", i, ngram_max, ngram_min)
        if key not in self._memo:
            self._memo[key] = LookupSim(self.trajectory(i), int(self.meta["vocab"]), ngram_max, ngram_min)
        return self._memo[key]

    def ratio(self, i: int, p_spec: str, q_spec: str, temperature: float) -> tuple[np.ndarray, ...]:
        """Per row, for the greedy token of model ``p_spec``: ``(p̂, q̂', exact, s)`` with ``s`` the
        ratio agreement :func:`sd_accept_prob` and ``exact`` False where the trace lacks ``q̂'``."""
        key = ("ratio", i, p_spec, q_spec, temperature)
        if key not in self._memo:
            p_rows = self.rows(p_spec, i)
            p = p_rows.max_prob(temperature)
            q, exact = self.rows(q_spec, i).probs_of(p_rows.argmax, temperature)
            self._memo[key] = (p, q, exact, sd_accept_prob(torch.from_numpy(p), torch.from_numpy(q)).numpy())
        return self._memo[key]

    def lookup_ratio(self, i: int, q_spec: str, temperature: float, r: int, token: int) -> tuple[float, bool]:
        """``(s, exact)`` of a one-hot (lookup) token at row ``r``: :func:`sd_accept_prob` of ``(1, q̂'(y))``."""
        key = ("lookup_ratio", i, q_spec, temperature, r, token)
        if key not in self._memo:
            q, exact = self.rows(q_spec, i).prob(r, token, temperature)
            self._memo[key] = (float(sd_accept_prob(torch.tensor(1.0), torch.tensor(q))), exact)
        return self._memo[key]

    def tv(self, i: int, p_spec: str, q_spec: str, temperature: float) -> np.ndarray:
        """``[N]`` ``1 − TV(p̂, q̂')`` per row from the two top-k sets (:func:`acceptance_rate` over
        their union; exact when the trace kept full rows, else a lower bound: ``docs/replay.md``)."""
        key = ("tv", i, p_spec, q_spec, temperature)
        if key not in self._memo:
            (pi, pp), (qi, qp) = (self.rows(s, i).topk_probs(temperature) for s in (p_spec, q_spec))
            match = pi[:, :, None] == qi[:, None, :]
            q_at_p = (match * qp[:, None, :]).sum(-1)
            self._memo[key] = acceptance_rate(torch.from_numpy(pp), torch.from_numpy(q_at_p)).numpy()
        return self._memo[key]


class Episode:
    """One policy over one example: the streams it runs, its counters and commit bookkeeping."""

    def __init__(self, traces: TraceSet, i: int, cost: CostModel | None):
        self.traces, self.i, self.cost = traces, i, cost
        self.traj = traces.trajectory(i)
        self.target = Model("target", traces.rows("target", i), self.traj)
        self.c, self.streams, self.t = Counters(), {}, 0
        self.max_new = int(traces.meta["max_new_tokens"])

    def stream(self, name: str, model: str = "target", layers: int | None = None) -> SimStream:
        if name not in self.streams:
            if self.cost is not None and model == "intermediate" and model not in self.cost.models:
                model = "draft"  # the pair's intermediate is its draft (priced once by the bench)
            price = self.cost.pricer(model, layers) if self.cost is not None else None
            self.streams[name] = SimStream(self.traj, price)
        return self.streams[name]

    def model(self, spec: str, name: str) -> Model:
        return Model(name, self.traces.rows(spec, self.i), self.traj)

    def commit(self, tokens: list[int], tiers: list[int]) -> int:
        """Commit a round's tokens along the trajectory (the run's end stops it): a token that differs
        from the trajectory is a divergence — the trajectory token takes its place and the round
        ends. Counts per tier the tokens emitted and those equal to the target's greedy token."""
        kept = 0
        for tok, tier in zip(tokens, tiers):
            if self.t >= self.traj.n:
                break
            self.c.bump(f"replay/tier{tier}_emitted")
            self.c.bump(f"replay/tier{tier}_correct", int(tok == int(self.target.rows.argmax[self.t])))
            same = tok == self.traj.tokens[self.t]
            self.t += 1
            kept += 1
            if not same:
                if not self.c.tiers.get("replay/divergences"):
                    self.c.bump("replay/tokens_to_first_divergence", self.t - 1)
                self.c.bump("replay/divergences")
                break
        return kept

    def result(self, method: str) -> DecodeResult:
        if not self.c.tiers.get("replay/divergences"):
            self.c.bump("replay/tokens_to_first_divergence", self.t)
        models = {name: s.stats for name, s in self.streams.items()}
        wall = sum(s.seconds for s in models.values())
        return DecodeResult(method, len(self.traj.start), self.traj.tokens[:self.t], [], self.c, models, wall,
                            "trajectory")


# ----------------------------------------------------------------------------- policies


def _ar(ep: Episode, cfg) -> None:
    target = ep.stream("target")
    while ep.t < ep.traj.n:
        target.call(ep.t, [], last=1)
        ep.commit([ep.target.argmax(ep.t, [])], [3])
        ep.c.rounds += 1


def _speculate(ep: Episode, drafter, policy: LengthPolicy, levels: bool = False) -> None:
    target = ep.stream("target")
    while ep.t < ep.traj.n:
        t = ep.t
        y, _ = drafter.propose(t, [], policy.next(ep.max_new - t), policy.min_confidence)
        k = len(y)
        target.call(t, y, last=k + 1)
        n, token = greedy_verify(y, ep.target.argmaxes(ep.traj.rows(t, y)))
        emitted = ep.commit(y[:n] + [token], [3] * (n + 1))
        policy.update(k, n)
        ep.c.record_round(k, n, emitted)
        if levels:
            count_levels(ep.c, drafter.last_levels, n)


def _gate(ep: Episode, slim: Model, slim_spec: str, t: int, y: list[int], sources, cfg) -> dict[str, Any]:
    """The gate values :func:`route_positions` reads, from the traces (see the module docstring)."""
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
            undetermined += value >= cfg.tau_accept
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


def _via_sd(ep: Episode, cfg) -> None:
    spec = slim_key(cfg.slim)
    f = ep.traces.file(spec)
    slim_cost = ("intermediate", None) if f.meta["role"] in ("intermediate", "draft") else ("target", f.meta["n_layers"])
    target, slim_stream = ep.stream("target"), ep.stream("slim", *slim_cost)
    resume = _resume_price(ep, cfg, f.meta)  # an escalation after a slim pass: the layers past the shared prefix
    drafter = build_drafter(ep, cfg.drafter, None)
    slim = ep.model(spec, "slim")
    policy = LengthPolicy(cfg.drafter.length_policy, cfg.gamma, cfg.drafter.min_confidence, cfg.drafter.max_gamma)
    knobs = cfg.gate_knobs()
    gate = load_gate(cfg.gate_path) if cfg.gate == "learned" else None
    if gate is not None:
        check_gate(gate, ep.traces, spec)
    unverified, audit, run = 0, Audit(), 0
    while ep.t < ep.traj.n:
        t = ep.t
        y, sources = drafter.propose(t, [], policy.next(ep.max_new - t), policy.min_confidence)
        k, route = len(y), escalate_at_once()
        slim_ran = cfg.slim_needed(k, unverified)
        if slim_ran:  # as via_sd: no slim pass when no outcome depends on it
            g = _gate(ep, slim, spec, t, y, sources, cfg)
            top = slim.argmaxes(g["rows"])  # the slim verifier's greedy tokens: its rewrite at i, its bonus at k
            if gate is not None:
                p_spec = _spec("draft" if cfg.drafter.name == "model" else "self", cfg)
                g["s"], g["conf"] = learned_values(ep, gate, slim, p_spec, spec, y, g, run, float(cfg.gate_temperature))
            elif cfg.gate == "oracle":
                g["s"], g["conf"] = oracle_values(ep, slim, y, g["rows"])
            route = route_positions(g["s"], g["conf"], y, top.__getitem__, lambda top=top: top[-1],
                                    unverified=unverified, slim_top=top[:-1], draft_conf=g["draft_conf"], **knobs)
            if cfg.gate == "oracle" and route.action in (ESCALATE, END):  # the slim verifier cannot commit what the
                slim_ran, route = False, escalate_at_once()  # target would this round: sd's round, no slim pass
            if slim_ran:
                slim_stream.call(t, y, last=k + 1)
        n, token = 0, None
        if route.action == ESCALATE:
            start = route.verify_from
            audited = audit.rows(start) if cfg.audit else 0
            target.call(t, y, last=k - start + 1 + audited, price=resume if slim_ran else None)
            if audited:
                back = t - len(audit.pending)  # the pending tokens are the last committed ones
                greedy = [ep.target.argmax(back + j, []) if back + j < t else ep.target.argmax(t, y[:back + j - t])
                          for j in range(audited)]
                audit.check(ep.c, greedy, y[:start], token_tiers(route, start))
            n, token = greedy_verify(y[start:], ep.target.argmaxes(ep.traj.rows(t, y)[start:]))
        tokens = round_tokens(route, y, n, token)
        tiers = token_tiers(route, len(tokens))
        emitted = ep.commit(tokens, tiers)
        audit.commit(ep.traj.tokens[t:t + emitted], tiers[:emitted], route.action == ESCALATE)
        kept = count_round(ep.c, route, y, tokens, n)
        unverified = 0 if route.action == ESCALATE else unverified + emitted
        policy.update(k, kept)
        run = next_run(run, k, kept)
    if cfg.audit:
        audit.finish(ep.c)


def replay_example(traces: TraceSet, i: int, policy: Policy, cost: CostModel | None = None) -> DecodeResult:
    """One policy over example ``i`` of ``traces`` → a :class:`DecodeResult` whose counters are the
    policy's (``wall_s``: predicted seconds, 0 without a cost model)."""
    ep, cfg = Episode(traces, i, cost), policy.cfg
    if policy.method == "ar":
        _ar(ep, cfg)
    elif policy.method in ("sd", "cascade_sd"):
        cascade = policy.method == "cascade_sd"
        gamma = cfg.block if cascade else cfg.gamma
        drafter = build_drafter(ep, cfg.drafter, cfg.levels if cascade else None,
                                cfg.bigram_fallback if cascade else True)
        ep.stream("target")  # created after the drafter's streams, as the method does
        policy_ = LengthPolicy(cfg.drafter.length_policy, gamma, cfg.drafter.min_confidence, cfg.drafter.max_gamma)
        _speculate(ep, drafter, policy_, levels=cascade)
        if cascade:
            for key, value in drafter.counters().items():
                ep.c.bump(key, value)
    elif policy.method == "via_sd":
        _via_sd(ep, cfg)
    elif policy.method == "faster_cascades":  # viasd.analysis.deferral
        replay_faster_cascades(ep, cfg, LengthPolicy(cfg.drafter.length_policy, cfg.gamma, cfg.drafter.min_confidence,
                                                     cfg.drafter.max_gamma))
    else:
        raise ConfigError(f"replay supports {', '.join(SUPPORTED)} (sd_ngram and sd_hybrid are sd with a "
                          f"drafter); got method={policy.method!r}")
    return ep.result(policy.method)


ESTIMATES = ("draft_calls", "draft_tokens", "self_draft_calls", "self_draft_tokens", "bigram_fallback_tokens")


def replay(traces: TraceSet, policy: Policy, cost: CostModel | None = None, examples: list[int] | None = None,
           ar_seconds: float | None = None) -> dict[str, Any]:
    """Replay ``policy`` over ``examples`` (default: all) → a summary with a run's counter keys plus
    ``tier_share/*``, ``precision/tier{k}`` (share of its tokens equal to the target's greedy token,
    Wilson 95% ``_lo``/``_hi``), ``divergences_per_100``, ``tokens_to_first_divergence`` (mean per
    example), ``replayed_examples`` and ``diverged_examples`` (trajectory indices replayed, and those with a
    divergence: their quality is unknown until decoded), ``predicted_*`` (with a cost model; ``predicted_speedup`` over ``ar_seconds``) and
    ``exact``/``estimated`` (which counters are estimates)."""
    idx = list(range(traces.n_examples)) if examples is None else examples
    temperature = float(traces.meta.get("temperature", 0.0))
    if temperature > 0:  # a sampled run: expected counters of sd, not the run's draws (viasd.analysis.expect)
        if traces.meta.get("top_k") or float(traces.meta.get("top_p", 1.0)) < 1.0:
            raise ConfigError("sampling replay needs plain temperature sampling (this run set top_k/top_p)")
        out = expected_summary(traces, idx, policy, temperature)
        return {**out, "method": policy.label or policy.method, "method_impl": policy.method, "n_examples": len(idx),
                "replay_of": traces.meta.get("run_id"), "overrides": policy.overrides, "expected": True,
                "exact": False, "estimated": sorted(out)}
    results = [replay_example(traces, i, policy, cost) for i in idx]
    out = {"replay/divergences": 0, "replay/gate_undetermined": 0, **aggregate(results)}
    out.update({"method": policy.label or policy.method, "method_impl": policy.method, "n_examples": len(idx),
                "replay_of": traces.meta.get("run_id"), "overrides": policy.overrides})
    if any(out.get(f"tier{t}_accepted") for t in (1, 3)) or out.get("escalations"):
        out.update({f"tier_share/{k}": v for k, v in tier_shares(out).items()})
    for tier in (1, 2, 3):
        n, ok = int(out.get(f"replay/tier{tier}_emitted", 0)), int(out.get(f"replay/tier{tier}_correct", 0))
        lo, hi = wilson(ok, n)
        out.update({f"precision/tier{tier}": ok / n if n else math.nan, f"precision/tier{tier}_lo": lo,
                    f"precision/tier{tier}_hi": hi, f"precision/tier{tier}_n": n})
    new = out.get("new_tokens", 0)
    out["divergences_per_100"] = 100 * out.get("replay/divergences", 0) / new if new else math.nan
    out["tokens_to_first_divergence"] = out.get("replay/tokens_to_first_divergence", 0) / max(1, len(idx))
    out["replayed_examples"] = list(idx)  # which trajectory examples were replayed, and which of them left it
    out["diverged_examples"] = [i for i, r in zip(idx, results) if r.counters.tiers.get("replay/divergences")]
    cascade = policy.method == "cascade_sd" or getattr(getattr(policy.cfg, "drafter", None), "name", "") == "cascade"
    confidence = getattr(getattr(policy.cfg, "drafter", None), "length_policy", "") == "confidence"
    out["estimated"] = sorted(k for k in out if (cascade or confidence) and (k in ESTIMATES or "_for_" in k
                                                                               or "_by_" in k))
    if out.get("replay/deferral_unknown"):  # faster_cascades: rule decisions past a rejection (docs/replay.md)
        out["estimated"] = sorted({*out["estimated"], "deferred"})
    out["exact"] = not out["estimated"] and not out.get("replay/divergences") and not out.get(
        "replay/gate_undetermined")
    if cost is not None:
        out["predicted_s"] = out["wall_s"]
        out["predicted_tokens_per_s"] = out["tokens_per_s"]
        out["predicted_speedup"] = ar_seconds / out["wall_s"] if ar_seconds and out["wall_s"] else math.nan
    return out
