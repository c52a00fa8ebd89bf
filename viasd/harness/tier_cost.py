"""Per-round cost of each VIA-SD tier path, in target-forward units (``experiments.bench --cost-curve``).

One round after ``context`` committed tokens drafts ``k = γ`` tokens; what it runs depends on
how it ends. Measured here with the project's streams (:func:`~viasd.dimr.masks.verifier_streams`,
the same code the method runs), each path from the steady state in which the last committed
token is not yet cached (so every pass feeds ``k + 1`` tokens):

* ``sd round`` — the target verifies the block (``k + 1`` tokens): **the unit**;
* ``tier-1-only round`` — one slim pass over the block (tier 1 accepts, the slim bonus ends it);
* ``tier-2 round`` — one slim pass over the block after a round that ended with a tier-2
  rewrite (the rest of the earlier block is rolled back);
* ``escalating round`` — slim pass, then the full model verifies the block, with separate caches
  and with the shared prefix (the full model resumes at the mask's first skipped sub-layer);
* ``escalating after 2 tier-1 rounds`` — the full model also catches up the ``2 (k + 1)`` tokens the
  two earlier rounds committed without it, with separate caches and with the shared prefix.

Each path is timed ``reps`` times interleaved with the others (minimum kept), and its decoder
work in layer-tokens is reported next to its time (``layer_units``: layer-tokens over the sd round's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from viasd.dimr.masks import verifier_streams
from viasd.engine.stream import Stream
from viasd.harness.bench import CLOCKS

PATHS = ("sd round", "tier-1-only round", "tier-2 round", "escalating round, separate caches",
         "escalating round, shared prefix", "escalating after 2 tier-1 rounds, separate caches",
         "escalating after 2 tier-1 rounds, shared prefix")


def _scenarios(pair, ctx: torch.Tensor, slim_cfg, k: int, gen: torch.Generator) -> dict[str, Callable]:
    """One callable per path: resets its streams to the steady state, then returns
    ``(streams, timed steps)``."""
    hi = max(5, min(int(pair.target.config.vocab_size), 1000))
    shared = dict(zip(("full", "slim"), verifier_streams(pair, ctx, replace(slim_cfg, share_prefix=True))))
    split = dict(zip(("full", "slim"), verifier_streams(pair, ctx, replace(slim_cfg, share_prefix=False))))
    target = Stream(pair.target, ctx, "target")
    for s in (*shared.values(), *split.values(), target):
        s.logits(ctx)  # prefill once; every scenario rolls back to the context

    def block(seq: torch.Tensor, n: int = k) -> torch.Tensor:
        return torch.cat([seq, torch.randint(4, hi, (1, n), generator=gen).to(seq.device)], 1)

    def reset(*streams: Stream) -> torch.Tensor:
        for s in streams:
            s.rollback(ctx.shape[1] - 1)
            if s.prefix is not None:
                s.prefix.crop(ctx.shape[1] - 1)
        return ctx

    def sd():
        b = block(reset(target))
        return [target], [lambda: target.logits(b, k + 1)]

    def tier1():
        b = block(reset(split["slim"]))
        return [split["slim"]], [lambda: split["slim"].logits(b, k + 1)]

    def tier2():
        seq = reset(split["slim"])
        split["slim"].logits(block(seq), k + 1)  # the earlier round: rewrite at its first position
        b = block(block(seq, 1))
        return [split["slim"]], [lambda: split["slim"].logits(b, k + 1)]

    def escalate(streams: dict[str, Stream], lag_rounds: int):
        def run():
            seq = reset(*streams.values())
            for _ in range(lag_rounds):  # tier-1 rounds the full model does not see
                seq = block(seq, k + 1)
                streams["slim"].logits(seq[:, :-1], k + 1)
            b = block(seq)
            return list(streams.values()), [lambda: streams["slim"].logits(b, k + 1),
                                            lambda: streams["full"].logits(b, k + 1)]
        return run

    return dict(zip(PATHS, (sd, tier1, tier2, escalate(split, 0), escalate(shared, 0), escalate(split, 2),
                            escalate(shared, 2))))


@torch.inference_mode()
def tier_path_costs(pair, slim_cfg, gamma: int = 4, context: int = 256, reps: int = 5, clock: str = "cpu",
                    seed: int = 0) -> list[dict[str, Any]]:
    """Rows ``{path, ms, target_forwards, layer_units}`` for the paths of :data:`PATHS`.

    ``slim_cfg``: a :class:`~viasd.methods.via_sd.SlimConfig` (its ``share_prefix`` is set per
    path); ``target_forwards``: the path's time over the ``sd round``'s.
    """
    gen = torch.Generator().manual_seed(seed)
    hi = max(5, min(int(pair.target.config.vocab_size), 1000))
    ctx = torch.randint(4, hi, (1, context), generator=gen).to(pair.target.device)
    scenarios = _scenarios(pair, ctx, slim_cfg, int(gamma), gen)
    best = dict.fromkeys(PATHS, math.inf)
    work = dict.fromkeys(PATHS, 0.0)
    for r in range(reps + 1):  # round 0 warms up
        for name, scenario in scenarios.items():
            streams, steps = scenario()
            before = sum(s.stats.layer_tokens for s in streams)
            t0 = CLOCKS[clock]()
            for step in steps:
                step()
            for s in streams:  # the timed section ends when the device is done (streams do not sync)
                s.synchronize()
            if r:
                best[name] = min(best[name], CLOCKS[clock]() - t0)
                work[name] = sum(s.stats.layer_tokens for s in streams) - before
    unit, unit_work = best[PATHS[0]], work[PATHS[0]]
    return [{"path": name, "ms": best[name] * 1e3, "target_forwards": best[name] / unit,
             "layer_units": work[name] / unit_work} for name in PATHS]


TIER_COLUMNS = [("path", "{}"), ("ms", "{:.1f}"), ("target_forwards", "{:.2f}"), ("layer_units", "{:.2f}")]
