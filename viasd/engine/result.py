"""The one result type every method returns, and the committed-output bookkeeping.

:class:`DecodeResult` carries tokens, per-round records, counters, per-model statistics and
timings; derived metrics (rejection rate, mean accepted length, full-model calls per token)
are computed here once, the same way for every method.

**Rejection rate**, for every method: the share of drafted tokens *not emitted as drafted*,
whichever verifier decided (the target in ``sd``/``cascade_sd``, the deferral target ``π`` in
``faster_cascades``, the slim or the full model in ``viasd``). ``Counters.accepted`` counts the
drafted tokens emitted as drafted (:func:`emitted_as_drafted`), ``rejected`` the rest. Next to
it every table shows ``target_calls_per_token``: full-model forward calls per emitted token. :class:`Output` holds the committed
sequence and applies the stop rules (``max_new_tokens``, EOS, stop strings) for all methods.
:func:`aggregate` sums per-example summaries into a run's (ratios of sums), for runs and replays alike.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from viasd.config import GenerationConfig
from viasd.engine.stream import ModelStats


@dataclass
class Counters:
    """Token counters of one decode.

    ``drafted``/``accepted``/``rejected`` count draft tokens (``accepted``: emitted as drafted,
    whichever verifier decided; ``rejected = drafted − accepted``); ``bonus`` counts tokens emitted
    after a fully accepted block; ``corrected`` counts verifier tokens emitted after a rejection.
    ``tiers`` holds method-specific counters (e.g. VIA-SD's per-tier counts).
    """

    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    bonus: int = 0
    corrected: int = 0
    rounds: int = 0
    tiers: dict[str, int] = field(default_factory=dict)

    def bump(self, key: str, n: int = 1) -> None:
        """Increment a method-specific counter."""
        self.tiers[key] = self.tiers.get(key, 0) + n

    def record_round(self, drafted: int, accepted: int, emitted: int) -> None:
        """Count one standard verification round: ``drafted`` proposed, ``accepted`` kept, then
        ``emitted`` tokens committed (a bonus after a full block, a correction otherwise)."""
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.rejected += drafted - accepted
        if emitted > accepted:
            self.bonus += accepted == drafted
            self.corrected += accepted < drafted


def emitted_as_drafted(draft: list[int], emitted: list[int]) -> int:
    """Drafted tokens emitted as drafted in one round: the common prefix of the drafted block
    ``y_1..y_k`` and the tokens the round decided to emit (before stop rules)."""
    n = 0
    for d, e in zip(draft, emitted):
        if d != e:
            break
        n += 1
    return n


@dataclass
class RoundRecord:
    """One drafting/verification round: drafted and accepted counts and tokens emitted."""

    drafted: int
    accepted: int
    emitted: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class DecodeResult:
    """What every decoding method returns for one prompt."""

    method: str
    prompt_len: int
    tokens: list[int]
    rounds: list[RoundRecord]
    counters: Counters
    models: dict[str, ModelStats]
    wall_s: float
    stop_reason: str
    text: str | None = None

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def rejection_rate(self) -> float:
        """Share of drafted tokens not emitted as drafted, ``1 − accepted / drafted`` (NaN when
        nothing was drafted); the same definition for every method (see the module docstring)."""
        c = self.counters
        return 1.0 - c.accepted / c.drafted if c.drafted else math.nan

    @property
    def mean_accepted(self) -> float:
        """Mean tokens emitted per round (Spec-Bench's τ; 1.0 for ``ar``)."""
        return self.new_tokens / self.counters.rounds if self.counters.rounds else math.nan

    @property
    def tokens_per_target_call(self) -> float:
        """New tokens per forward call of the full target model."""
        t = self.models.get("target")
        return self.new_tokens / t.calls if t and t.calls else math.nan

    @property
    def target_calls_per_token(self) -> float:
        """Forward calls of the full target model per emitted token (``ar``: 1; 0 when no call)."""
        t = self.models.get("target")
        return (t.calls if t else 0) / self.new_tokens if self.new_tokens else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else math.nan

    def summary(self) -> dict[str, Any]:
        """Flat dict of counters and derived metrics (JSON-serializable)."""
        out: dict[str, Any] = {
            "method": self.method,
            "new_tokens": self.new_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "rejection_rate": self.rejection_rate,
            "mean_accepted": self.mean_accepted,
            "tokens_per_target_call": self.tokens_per_target_call,
            "target_calls_per_token": self.target_calls_per_token,
            "stop_reason": self.stop_reason,
        }
        c = asdict(self.counters)
        tiers = c.pop("tiers")
        out.update(c)
        out.update(tiers)
        for name, s in self.models.items():
            out[f"{name}_calls"] = s.calls
            out[f"{name}_tokens"] = s.tokens
            out[f"{name}_s"] = s.seconds
            out[f"{name}_layer_tokens"] = s.layer_tokens
        return out


class Output:
    """Committed tokens and stop rules shared by every method.

    ``seq``: the committed sequence ``[1, L]`` on the model's device; ``ids``: the same tokens on
    the host (what streams compare their caches with, without a host sync).

    Args:
        start: ``LongTensor[1, L0]`` the initial decoding sequence.
        gen: generation settings (``max_new_tokens``, ``stop_strings``, ``ignore_eos``).
        eos_ids: token ids that end generation (the EOS token is kept in the output, as
            ``transformers.generate`` does).
        tokenizer: needed only for stop strings.
    """

    def __init__(self, start: torch.Tensor, gen: GenerationConfig, eos_ids: list[int], tokenizer=None):
        self.seq = start
        self.ids: list[int] = start[0].tolist()  # the sequence on the host (one read, at the start)
        self.start_len = start.shape[1]
        self.gen = gen
        self.eos = set(eos_ids)
        self.tokenizer = tokenizer
        self.new: list[int] = []
        self.stop_reason = ""

    @property
    def done(self) -> bool:
        return bool(self.stop_reason)

    @property
    def remaining(self) -> int:
        """How many tokens may still be emitted."""
        return self.gen.max_new_tokens - len(self.new)

    def commit(self, tokens: list[int]) -> int:
        """Append ``tokens`` until a stop rule fires; returns how many were kept. Every rule is checked
        token by token, so a block that completes a stop string keeps nothing after it: the output is
        ``ar``'s whatever the block size."""
        kept = 0
        for t in tokens:
            if self.done:
                break
            self.new.append(int(t))
            kept += 1
            if int(t) in self.eos:
                self.stop_reason = "eos"
            elif len(self.new) >= self.gen.max_new_tokens:
                self.stop_reason = "max_new_tokens"
            elif self._ends_with_stop_string():
                self.stop_reason = "stop_string"
        if kept:
            self.ids += self.new[-kept:]
            add = torch.tensor([self.new[-kept:]], dtype=self.seq.dtype, device=self.seq.device)
            self.seq = torch.cat([self.seq, add], dim=1)
        return kept

    def _ends_with_stop_string(self) -> bool:
        """Whether the last tokens' text holds a stop string (checked after each token, so the first
        token that completes one is the last kept)."""
        if not self.gen.stop_strings or self.tokenizer is None:
            return False
        tail = self.tokenizer.decode(self.new[-64:])
        return any(s in tail for s in self.gen.stop_strings)


def aggregate(results: list[DecodeResult] | list[dict[str, Any]]) -> dict[str, Any]:
    """Corpus-level decoding statistics: sums of counters, ratios of sums (results or their summaries)."""
    tot: dict[str, float] = {}
    for r in results:
        for k, v in (r.summary() if isinstance(r, DecodeResult) else r).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in (
                    "tokens_per_s", "rejection_rate", "mean_accepted", "tokens_per_target_call",
                    "target_calls_per_token", "interleave_slot"):
                tot[k] = tot.get(k, 0) + (0 if isinstance(v, float) and math.isnan(v) else v)
    new, wall = tot.get("new_tokens", 0), tot.get("wall_s", 0.0)
    drafted, accepted, rounds = tot.get("drafted", 0), tot.get("accepted", 0), tot.get("rounds", 0)
    tot["tokens_per_s"] = new / wall if wall else math.nan
    tot["rejection_rate"] = 1 - accepted / drafted if drafted else math.nan
    tot["mean_accepted"] = new / rounds if rounds else math.nan
    tot["tokens_per_target_call"] = new / tot["target_calls"] if tot.get("target_calls") else math.nan
    tot["target_calls_per_token"] = tot["target_calls"] / new if new and "target_calls" in tot else math.nan
    return tot
