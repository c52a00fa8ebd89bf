"""``ar``: the target alone, one token per forward — the speedup denominator.

The loop (:func:`ar_steps`) is written once against :class:`~viasd.engine.world.World`: live models
when decoding, trace rows when replayed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from viasd.engine.result import DecodeResult, RoundRecord
from viasd.engine.world import LiveWorld, World
from viasd.methods.registry import register_method


@dataclass
class ARConfig:
    """Autoregressive decoding has no knobs."""


def ar_steps(world: World) -> None:
    """One target forward per token until ``world`` is done."""
    while not world.done:
        world.commit([world.next_token()], [3])
        world.counters.rounds += 1
        world.record(RoundRecord(drafted=0, accepted=0, emitted=1))


@register_method("ar", ARConfig, lossless=True, description="target-only autoregressive decoding", replayable=True)
def ar(pair, prompt_ids, cfg: ARConfig, gen, rng) -> DecodeResult:
    """Greedy or sampled decoding with the target alone; ``prompt_ids``: ``[1, P]``."""
    t0 = time.perf_counter()
    world = LiveWorld(pair, prompt_ids, gen, rng)
    ar_steps(world)
    return world.result("ar", {}, t0)
