"""``sd``: vanilla speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Each round: the drafter proposes ``γ`` tokens with distributions ``p``; the target scores the
block in one forward (``q`` at ``γ + 1`` positions); :func:`~viasd.core.rules.verify_block`
accepts a prefix and adds a correction or bonus token. Lossless w.r.t. the target.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from viasd.core.rules import verify_block, verify_greedy
from viasd.core.sampling import probs_from_logits
from viasd.engine.drafters import DrafterConfig, LengthPolicy, make_drafter
from viasd.engine.result import Counters, DecodeResult, Output, RoundRecord
from viasd.engine.stream import Stream, start_sequence
from viasd.engine.syncs import to_host
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


@register_method("sd", SDConfig, lossless=True, description="vanilla speculative decoding")
def sd(pair, prompt_ids, cfg: SDConfig, gen, rng) -> DecodeResult:
    """Speculative decoding of one prompt ``[1, P]``; returns a :class:`DecodeResult`."""
    t0 = time.perf_counter()
    drafter = make_drafter(pair, prompt_ids, cfg.drafter)
    policy = LengthPolicy(cfg.drafter.length_policy, cfg.gamma, cfg.drafter.min_confidence, cfg.drafter.max_gamma)
    return speculate(pair, prompt_ids, drafter, policy, gen, rng, "sd", t0)


def speculate(pair, prompt_ids: torch.Tensor, drafter, policy: LengthPolicy, gen, rng, method: str, t0: float,
              on_round: Callable[[Counters, int, int], dict] | None = None) -> DecodeResult:
    """The SD loop (Algorithm 1) of one prompt ``[1, P]`` with a built drafter and length policy.

    ``on_round(counters, drafted, accepted)`` may count more per round and returns the round's
    ``extra`` record (Cascade SD's levels); ``t0`` is when the method started (drafter set-up included).
    """
    target = Stream(pair.target, prompt_ids, "target")
    out = Output(start_sequence(pair.target, prompt_ids), gen, gen.eos_ids(pair), pair.tokenizer)
    c, rounds = Counters(), []
    while not out.done:
        draft, p = drafter.propose(out.seq, policy.next(out.remaining), gen, rng, policy.min_confidence, out.ids)
        k = draft.shape[0]
        # The target scores the block in one forward: q at k + 1 positions.
        block = torch.cat([out.seq, draft.view(1, -1)], 1)
        q = probs_from_logits(target.logits(block, last=k + 1, host=out.ids)[0], gen)
        if gen.temperature == 0:  # the round's one host sync: the verdict and the drafted tokens
            n, token, *drafted = to_host(torch.cat([verify_greedy(draft, q), draft]))
        else:
            n, token = verify_block(draft, p, q, rng)
            drafted = drafter.last_host if drafter.last_host is not None else draft[:n].tolist()
        emitted = out.commit(drafted[:n] + [token])
        policy.update(k, n)
        c.record_round(k, n, emitted)
        extra = on_round(c, k, n) if on_round is not None else {}
        rounds.append(RoundRecord(drafted=k, accepted=n, emitted=emitted, extra=extra))
    return DecodeResult(method, prompt_ids.shape[1], out.new, rounds, c, {**drafter.stats(), "target": target.stats},
                        time.perf_counter() - t0, out.stop_reason)
