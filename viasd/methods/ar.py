"""``ar``: the target alone, one token per forward — the speedup denominator."""

from __future__ import annotations

import time
from dataclasses import dataclass

from viasd.core.sampling import probs_from_logits, sample
from viasd.engine.result import Counters, DecodeResult, Output, RoundRecord
from viasd.engine.stream import Stream, start_sequence
from viasd.engine.syncs import to_host
from viasd.methods.registry import register_method


@dataclass
class ARConfig:
    """Autoregressive decoding has no knobs."""


@register_method("ar", ARConfig, lossless=True, description="target-only autoregressive decoding")
def ar(pair, prompt_ids, cfg: ARConfig, gen, rng) -> DecodeResult:
    """Greedy or sampled decoding with the target alone; ``prompt_ids``: ``[1, P]``."""
    t0 = time.perf_counter()
    target = Stream(pair.target, prompt_ids, "target")
    out = Output(start_sequence(pair.target, prompt_ids), gen, gen.eos_ids(pair), pair.tokenizer)
    counters, rounds = Counters(), []
    greedy = gen.temperature == 0
    while not out.done:  # one host sync per token: reading it
        q = probs_from_logits(target.logits(out.seq, host=out.ids)[0, -1], gen)
        out.commit([to_host(sample(q, rng, greedy))])
        counters.rounds += 1
        rounds.append(RoundRecord(drafted=0, accepted=0, emitted=1))
    return DecodeResult("ar", prompt_ids.shape[1], out.new, rounds, counters, {"target": target.stats},
                        time.perf_counter() - t0, out.stop_reason)
