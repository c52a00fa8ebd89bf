"""``cascade_sd``: Cascade Speculative Drafting (Chen et al. 2023, "Cascade Speculative Drafting
for Even Faster LLM Inference").

Each round the cascade (:mod:`viasd.engine.cascade`: vertical and horizontal cascades of drafters, down
to the statistical n-gram model) drafts a block and the target verifies it exactly as in ``sd``;
lossless w.r.t. the target for the reasons given there. This module owns the method's knobs
(:class:`CascadeSDConfig`: ``method.levels``, the block length) and its loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from viasd.engine.cascade import (  # noqa: F401  (re-exported: the cascade's names as cascade_sd knew them)
    DEFAULT_LEVELS,
    CascadeDrafter,
    CascadeLevel,
    MaxGramDrafter,
    VerticalDrafter,
    bigram_next,
    cascade_drafter,
    cascade_levels,
    inner_quota,
    level_quota,
)
from viasd.engine.drafters import DrafterConfig
from viasd.engine.result import DecodeResult
from viasd.engine.rounds import count_levels
from viasd.engine.world import LiveWorld, World
from viasd.errors import ConfigError
from viasd.methods.registry import register_method
from viasd.methods.sd import sd_rounds


@dataclass
class CascadeSDConfig:
    """Cascade SD knobs: the cascade (``levels``), the block length and shared drafter options.

    ``gamma``: block length per target verification; ``None`` = sum of the levels' ``tokens``.
    ``drafter``: options shared by every member (``ngram_max``/``ngram_min``, ``self`` layers,
    the draft-length policy); its ``name`` must stay ``cascade`` — ``levels`` names the drafters.
    ``bigram_fallback``: the ``ngram`` member falls back to a context bigram (:class:`MaxGramDrafter`).
    """

    levels: list = field(default_factory=lambda: [dict(lv) for lv in DEFAULT_LEVELS])
    gamma: int | None = None
    bigram_fallback: bool = True
    drafter: DrafterConfig = field(default_factory=lambda: DrafterConfig(name="cascade"))

    def validate(self) -> None:
        if self.drafter.name != "cascade":
            raise ConfigError(f"cascade_sd drafts with its cascade: set the drafters in method.levels "
                              f"(got method.drafter.name={self.drafter.name!r}; leave it 'cascade')")
        self.levels = cascade_levels(self.levels)
        if self.gamma is not None and self.gamma < 1:
            raise ConfigError(f"gamma must be an integer >= 1 or null (got {self.gamma!r}); "
                              "null drafts sum(levels[*].tokens) tokens per round")

    @property
    def block(self) -> int:
        """Tokens drafted per round (before the length policy adapts it)."""
        return int(self.gamma) if self.gamma is not None else sum(lv.tokens for lv in self.levels)


def cascade_rounds(world: World, drafter, cfg: CascadeSDConfig) -> None:
    """``sd``'s rounds with the cascade drafter in ``world`` (live or a trace), counting per level."""
    sd_rounds(world, drafter, cfg.drafter.length_policy_for(cfg.block),
              on_round=lambda c, proposal, n: count_levels(c, proposal.levels, n))
    for key, value in drafter.counters().items():
        world.counters.bump(key, value)


@register_method("cascade_sd", CascadeSDConfig, lossless=True,
                 description="Cascade Speculative Drafting (vertical + horizontal drafter cascades)", replayable=True)
def cascade_sd(pair, prompt_ids, cfg: CascadeSDConfig, gen, rng) -> DecodeResult:
    """Cascade speculative drafting of one prompt ``[1, P]``; returns a :class:`DecodeResult`.

    Counters: the usual ones, plus ``level{i}_drafted|accepted|rejected`` (target verdicts on the
    positions level ``i`` drafted) and the vertical ones of :meth:`CascadeDrafter.counters`.
    """
    t0 = time.perf_counter()
    # Cascade drafting: larger levels first (horizontal), each possibly drafted itself (vertical);
    # the target verifies each block in one forward with the standard SD rules.
    drafter = CascadeDrafter.build(pair, prompt_ids, cfg.levels, cfg.drafter, cfg.bigram_fallback)
    world = LiveWorld(pair, prompt_ids, gen, rng, drafter)
    cascade_rounds(world, drafter, cfg)
    return world.result("cascade_sd", drafter.stats(), t0)
