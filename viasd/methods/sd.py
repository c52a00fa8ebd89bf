"""``sd``: vanilla speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Each round: the drafter proposes ``γ`` tokens with distributions ``p``; the target scores the
block in one forward (``q`` at ``γ + 1`` positions); :func:`~viasd.core.rules.verify_block`
accepts a prefix and adds a correction or bonus token. Lossless w.r.t. the target.

The round loop (:func:`sd_rounds`) is written once against :class:`~viasd.engine.world.World`: decoding
runs it over live models (:class:`~viasd.engine.world.LiveWorld`), trace replay over recorded rows
(:class:`~viasd.analysis.replay.Episode`); ``cascade_sd`` is the same loop with its cascade drafter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from viasd.engine.drafters import Drafter, DrafterConfig, LengthPolicy, Proposal, make_drafter
from viasd.engine.result import Counters, DecodeResult, RoundRecord
from viasd.engine.world import LiveWorld, World
from viasd.errors import ConfigError
from viasd.methods.registry import register_method


@dataclass
class SDConfig:
    """Vanilla SD knobs: block length ``gamma`` and the drafter."""

    gamma: int = 4
    drafter: DrafterConfig = field(default_factory=DrafterConfig)

    def validate(self) -> None:
        if int(self.gamma) < 1:
            raise ConfigError(f"gamma must be >= 1 (got {self.gamma}); set method.gamma")


@register_method("sd", SDConfig, lossless=True, description="vanilla speculative decoding", replayable=True)
def sd(pair, prompt_ids, cfg: SDConfig, gen, rng) -> DecodeResult:
    """Speculative decoding of one prompt ``[1, P]``; returns a :class:`DecodeResult`."""
    t0 = time.perf_counter()
    drafter = make_drafter(pair, prompt_ids, cfg.drafter)
    return speculate(pair, prompt_ids, drafter, cfg.drafter.length_policy_for(cfg.gamma), gen, rng, "sd", t0)


OnRound = Callable[[Counters, Proposal, int], dict]


def sd_rounds(world: World, drafter, policy: LengthPolicy, on_round: OnRound | None = None) -> None:
    """Algorithm 1 until ``world`` is done: draft, verify the block in one target forward, commit.

    ``on_round(counters, proposal, accepted)`` may count more per round and returns the round's
    ``extra`` record (Cascade SD's levels).
    """
    while not world.done:
        proposal = world.propose(drafter, policy.next(world.remaining), policy.min_confidence)
        k = len(proposal)
        n, token, drafted = world.verify(proposal)  # the target scores the block: q at k + 1 positions
        emitted = world.commit(list(drafted[:n]) + [token], [3] * (n + 1))
        policy.update(k, n)
        world.counters.record_round(k, n, emitted)
        extra = on_round(world.counters, proposal, n) if on_round is not None else {}
        world.record(RoundRecord(drafted=k, accepted=n, emitted=emitted, extra=extra))


def speculate(pair, prompt_ids: torch.Tensor, drafter: Drafter, policy: LengthPolicy, gen, rng, method: str, t0: float,
              on_round: OnRound | None = None) -> DecodeResult:
    """:func:`sd_rounds` over live models for one prompt ``[1, P]`` with a built drafter and length policy
    (``t0``: when the method started, drafter set-up included). A drafter with ``needs_hidden`` gets the
    target's hidden states at the positions it verified (:class:`~viasd.engine.world.LiveWorld`)."""
    world = LiveWorld(pair, prompt_ids, gen, rng, drafter)
    sd_rounds(world, drafter, policy, on_round)
    return world.result(method, drafter.stats(), t0)
