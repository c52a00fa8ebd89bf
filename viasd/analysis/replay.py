"""Replay a decoding policy over a finished run's trace, with the methods' own functions.

A policy is a registered method that says it replays (``MethodSpec.replayable``: ``ar``, ``sd`` with any drafter,
``cascade_sd``, ``via_sd``, ``faster_cascades``: :mod:`viasd.analysis.deferral`) and its typed config; :data:`REPLAYS`
says how each runs over a trace — by **the method's own round loop**
over an :class:`~viasd.analysis.traces.Episode` (``via_sd``: :class:`~viasd.analysis.verifiers.VerifiersTrace`;
``faster_cascades``: :class:`~viasd.analysis.deferral.DeferralTrace`), the trace side of :mod:`viasd.engine.world`.
:func:`replay` runs it over every example of a :class:`TraceSet`: the
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from viasd.analysis.cost import CostModel
from viasd.analysis.deferral import replay_faster_cascades
from viasd.analysis.expect import expected_summary
from viasd.analysis.sim import build_drafter
from viasd.analysis.stats import wilson
from viasd.analysis.traces import Episode, TraceSet
from viasd.analysis.verifiers import VerifiersTrace
from viasd.engine.result import DecodeResult, aggregate
from viasd.errors import ConfigError
from viasd.methods.ar import ar_steps
from viasd.methods.cascade_sd import cascade_rounds
from viasd.methods.registry import METHODS
from viasd.methods.sd import sd_rounds
from viasd.methods.via_sd import via_rounds
from viasd.registry import Registry
from viasd.tracking.baseline import tier_shares

__all__ = ["REPLAYS", "Episode", "Policy", "TraceSet", "VerifiersTrace", "replay", "replay_example", "replayed"]


@dataclass
class Policy:
    """A method and its typed config (``label``: how tables name it)."""

    method: str
    cfg: Any
    label: str = ""
    overrides: list[str] = field(default_factory=list)


#: ``method -> fn(episode, cfg)``: how each replayable method (``MethodSpec.replayable``) runs over a trace.
REPLAYS: Registry[Callable[[Episode, Any], None]] = Registry("replayed method")


@REPLAYS.register("ar")
def _ar(ep: Episode, cfg) -> None:
    ar_steps(ep)  # the method's own loop


@REPLAYS.register("sd")
def _sd(ep: Episode, cfg) -> None:
    drafter = build_drafter(ep, cfg.drafter)
    ep.stream("target")  # created after the drafter's streams, as the method does
    sd_rounds(ep, drafter, cfg.drafter.length_policy_for(cfg.gamma))  # the method's own loop


@REPLAYS.register("cascade_sd")
def _cascade_sd(ep: Episode, cfg) -> None:
    drafter = build_drafter(ep, cfg.drafter, cfg.levels, cfg.bigram_fallback)
    ep.stream("target")
    cascade_rounds(ep, drafter, cfg)  # the method's own loop


@REPLAYS.register("via_sd")
def _via_sd(ep: Episode, cfg) -> None:
    world = VerifiersTrace(ep, cfg)  # its streams first, then the drafter's
    via_rounds(world, build_drafter(ep, cfg.drafter, None), cfg)  # the method's own loop


@REPLAYS.register("faster_cascades")
def _faster_cascades(ep: Episode, cfg) -> None:  # viasd.analysis.deferral
    replay_faster_cascades(ep, cfg)  # the method's own loop over its trace world


def replay_example(traces: TraceSet, i: int, policy: Policy, cost: CostModel | None = None) -> DecodeResult:
    """One policy over example ``i`` of ``traces`` → a :class:`DecodeResult` whose counters are the
    policy's (``wall_s``: predicted seconds, 0 without a cost model)."""
    ep, cfg = Episode(traces, i, cost), policy.cfg
    replayed(policy.method)(ep, cfg)
    return ep.result(policy.method)


def replayed(method: str) -> Callable[[Episode, Any], None]:
    """How ``method`` runs over a trace; one error line for a method the registry marks not replayable."""
    spec = METHODS.get(method)
    if not spec.replayable or spec.name not in REPLAYS:
        able = [n for n in METHODS.names() if METHODS.get(n).replayable]
        raise ConfigError(f"replay supports {', '.join(able)} (sd_ngram and sd_hybrid are sd with a "
                          f"drafter); got method={method!r}")
    return REPLAYS.get(spec.name)


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
