"""The world a replayed policy runs in: a trajectory, cache accounting, and the drafters' proposals.

A sequence is described relative to the trajectory: ``(t, block)`` is the initial decoding
sequence, the first ``t`` generated tokens, then ``block`` (tokens a policy proposed). Tokens a
trace cannot know — a model's greedy token after a context that left the trajectory — are
*unknown*: fresh negative ids that equal nothing else (:meth:`Trajectory.unknown`).

* :class:`SimStream` counts forward calls and tokens exactly as
  :class:`~viasd.engine.stream.Stream` does (roll back to the valid prefix, keep at least
  ``last`` rows to feed) and prices each call with the cost model.
* :class:`Model` reads a traced model's greedy token at a context (known on the trajectory).
* Proposals, each the greedy-mode twin of a drafter of :mod:`viasd.engine.drafters` /
  :mod:`viasd.engine.cascade`: :class:`LookupSim` calls the prompt-lookup drafter itself on
  the trajectory; :class:`ModelSim` is the draft's greedy continuation read from its trace;
  :class:`HybridSim`; :class:`VerticalSim` and :class:`CascadeSim` subclass the cascade drafters
  (their counters and level structure) and replace only how a block is proposed. Every proposal
  returns ``(tokens, sources)``: per token the traced model whose raw distribution the gate reads
  and its row (``None``: a one-hot lookup token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from viasd.analysis.trace import Rows, layers_key
from viasd.core.rules import verify_block
from viasd.engine.cascade import (
    DEFAULT_LEVELS,
    CascadeDrafter,
    MaxGramDrafter,
    VerticalDrafter,
    cascade_levels,
    inner_quota,
    level_quota,
)
from viasd.engine.drafters import DrafterConfig, NgramDrafter
from viasd.engine.stream import ModelStats
from viasd.errors import ConfigError

_RNG = torch.Generator()  # greedy verification draws nothing that matters; keep torch's global generator untouched
Source = tuple[str, int] | None  # (traced model, row) whose raw distribution the gate reads; None: one-hot


@dataclass
class Trajectory:
    """One finished example: initial decoding sequence ``start``, ``prompt`` ids (the lookup's
    context for encoder-decoders) and the generated ``tokens``."""

    start: list[int]
    prompt: list[int]
    tokens: list[int]
    encoder_decoder: bool = False
    _unknown: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self.n = len(self.tokens)

    def unknown(self) -> int:
        """A fresh unknown token id (negative, unique)."""
        self._unknown -= 1
        return self._unknown

    def normalize(self, t: int, block: list[int]) -> tuple[int, list[int]]:
        """``(b, rest)``: the same sequence with its leading on-trajectory block tokens folded into ``b``."""
        i = 0
        while i < len(block) and t + i < self.n and block[i] == self.tokens[t + i]:
            i += 1
        return t + i, list(block[i:])

    def rows(self, t: int, block: list[int]) -> list[int | None]:
        """:meth:`row` of ``(t, block[:j])`` for ``j = 0..len(block)`` in one pass."""
        m = self.normalize(t, block)[0] - t  # leading block tokens on the trajectory
        return [t + j if j <= m and t + j < self.n else None for j in range(len(block) + 1)]

    def row(self, t: int, block: list[int]) -> int | None:
        """The trace row of the distribution after ``(t, block)``: known only on the trajectory."""
        b, rest = self.normalize(t, block)
        return b if not rest and b < self.n else None

    def context(self, t: int) -> torch.Tensor:
        """``LongTensor[1, L0 + t]``: the committed decoding sequence after ``t`` tokens."""
        return torch.tensor([self.start + self.tokens[:t]], dtype=torch.long)


Price = Callable[[int, int, int], float]  # (tokens fed, cached context, logits rows) -> seconds


class SimStream:
    """Forward calls and tokens of one model's stream, as :class:`~viasd.engine.stream.Stream` counts them.

    ``price(n, context, last)`` gives a call's predicted seconds (the cost model; 0 without one).
    Encoder-decoders start with one encoder call over the prompt, as the stream does.
    """

    def __init__(self, traj: Trajectory, price: Price | None = None):
        self.traj, self.price = traj, price or (lambda n, ctx, last: 0.0)
        self.stats = ModelStats()
        self.cached: tuple[int, list[int]] = (0, [])  # (trajectory tokens, off-trajectory tail)
        self.length = 0  # cached positions (the initial sequence included once fed)
        if traj.encoder_decoder:
            self._count(len(traj.prompt), 0, 1)

    def _count(self, n: int, ctx: int, last: int, price: Price | None = None) -> None:
        self.stats.calls += 1
        self.stats.tokens += n
        self.stats.seconds += (price or self.price)(n, ctx, last)

    def call(self, t: int, block: list[int], last: int = 1, price: Price | None = None) -> None:
        """One ``Stream.logits(seq, last)`` on the sequence ``(t, block)`` (``price``: this call's
        pricing instead of the stream's, e.g. a full pass resuming from a shared prefix)."""
        l0 = len(self.traj.start)
        b, rest = self.traj.normalize(t, block)
        a, tail = self.cached
        if self.length == 0:
            valid = 0
        elif a != b:
            valid = l0 + min(a, b)
        else:
            common = 0
            while common < min(len(tail), len(rest)) and tail[common] == rest[common]:
                common += 1
            valid = l0 + a + common
        length = l0 + b + len(rest)
        keep = min(valid, length - last)
        self._count(length - keep, keep, last, price)
        self.cached, self.length = (b, rest), length


class Model:
    """A traced model's greedy tokens at any context (unknown off the trajectory)."""

    def __init__(self, name: str, rows: Rows, traj: Trajectory):
        self.name, self.rows, self.traj = name, rows, traj

    def argmax(self, t: int, block: list[int]) -> int:
        r = self.traj.row(t, block)
        return int(self.rows.argmax[r]) if r is not None else self.traj.unknown()

    def argmaxes(self, rows: list[int | None]) -> list[int]:
        """Greedy tokens at trace rows (:meth:`Trajectory.rows`; unknown where ``None``)."""
        return [int(self.rows.argmax[r]) if r is not None else self.traj.unknown() for r in rows]


_VERIFIED: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, int]] = {}


def greedy_verify(draft: list[int], best: list[int]) -> tuple[int, int]:
    """:func:`~viasd.core.rules.verify_block` on greedy (one-hot) distributions: the drafts ``y``
    and the verifier's greedy tokens ``best`` (``k + 1``) on a vocabulary of just those tokens.

    The outcome depends only on which of these tokens are equal, so it is memoized on that
    pattern (the tokens renumbered in order of appearance): one call of the rule per pattern.
    """
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(draft + best))}
    key = (tuple(vocab[x] for x in draft), tuple(vocab[x] for x in best))
    if key not in _VERIFIED:
        eye = torch.eye(len(vocab))
        n, token = verify_block(torch.tensor(key[0], dtype=torch.long), eye[list(key[0])], eye[list(key[1])], _RNG)
        _VERIFIED[key] = (n, int(token))
    n, token = _VERIFIED[key]
    return n, list(vocab)[token]


class LookupSim:
    """Prompt lookup (:class:`~viasd.engine.drafters.NgramDrafter`) on the trajectory, memoized per position."""

    MAX = 64  # a lookup block is a prefix of the longest one (the match does not depend on k)

    def __init__(self, traj: Trajectory, vocab: int, ngram_max: int, ngram_min: int):
        context = torch.tensor(traj.prompt, dtype=torch.long) if traj.encoder_decoder else None
        self.drafter = NgramDrafter(vocab, ngram_max, ngram_min, context)
        self.traj, self.memo = traj, {}

    def found(self, t: int) -> list[int]:
        if t not in self.memo:
            self.memo[t] = self.drafter.lookup(self.traj.context(t), self.MAX).tolist()  # no [MAX, V] one-hot
        return self.memo[t]

    def propose(self, t: int, prefix: list[int], k: int, min_confidence: float = 0.0) -> tuple[list[int], list[Source]]:
        b, rest = self.traj.normalize(t, prefix)
        if k <= 0:
            return [], []
        tokens = self.found(b)[:k] if not rest else [self.traj.unknown() for _ in range(k)]  # off: an estimate
        return tokens, [None] * len(tokens)


class MaxGramSim(MaxGramDrafter):
    """Cascade SD's statistical level (lookup, then a context bigram) on the trajectory."""

    def __init__(self, traj: Trajectory, lookup: LookupSim):
        super().__init__(lookup.drafter)
        self.traj, self.sim, self.memo = traj, lookup, {}

    def propose(self, t, prefix, k, min_confidence=0.0):
        b, rest = self.traj.normalize(t, prefix)
        if rest:  # an unknown context: unknown tokens, counted as the bigram's (an estimate)
            self.fallback_tokens += k
            return [self.traj.unknown() for _ in range(k)], [None] * k
        if b not in self.memo:
            self.memo[b] = MaxGramDrafter.tokens(self, self.traj.context(b), LookupSim.MAX)
            self.fallback_tokens -= LookupSim.MAX - len(self.sim.found(b))
        self.fallback_tokens += k - min(k, len(self.sim.found(b)))
        return self.memo[b][:k], [None] * k


class ModelSim:
    """A model drafter's greedy continuation (:class:`~viasd.engine.drafters.ModelDrafter`)."""

    def __init__(self, model: Model, stream: SimStream):
        self.model, self.stream = model, stream
        self.estimated = False  # a confidence stop read at an unknown context

    def propose(self, t, prefix, k, min_confidence=0.0):
        tokens: list[int] = []
        sources: list[Source] = []
        for _ in range(k):
            self.stream.call(t, prefix + tokens, last=1)
            r = self.model.traj.row(t, prefix + tokens)
            if min_confidence > 0 and tokens:
                if r is None:
                    self.estimated = True  # unknown confidence: assume it keeps drafting
                elif float(self.model.rows.max_prob(1.0)[r]) < min_confidence:
                    break
            tokens.append(self.model.argmax(t, prefix + tokens))
            sources.append((self.model.name, r) if r is not None else None)
        return tokens, sources


class HybridSim:
    """:class:`~viasd.engine.drafters.HybridDrafter`: the lookup's block when it finds one, else the model's."""

    def __init__(self, lookup: LookupSim, model: ModelSim):
        self.lookup, self.model = lookup, model

    def propose(self, t, prefix, k, min_confidence=0.0):
        found = self.lookup.propose(t, prefix, k)
        return found if found[0] else self.model.propose(t, prefix, k, min_confidence)


class VerticalSim(VerticalDrafter):
    """A vertical cascade level on the trajectory (counters inherited from :class:`VerticalDrafter`)."""

    def __init__(self, upper: ModelSim, lower, lower_tokens: int, upper_name: str, lower_name: str):
        self.upper, self.lower, self.lower_tokens, self.leniency = upper, lower, lower_tokens, 0.0
        self.upper_name, self.lower_name = upper_name, lower_name
        self.drafted = self.accepted = 0

    def propose(self, t, prefix, k, min_confidence=0.0):
        tokens: list[int] = []
        sources: list[Source] = []
        model, stop = self.upper.model, False
        while len(tokens) < k and not stop:
            y, _ = self.lower.propose(t, prefix + tokens, inner_quota(self.lower_tokens, k, len(tokens)),
                                      min_confidence)
            self.upper.stream.call(t, prefix + tokens + y, last=len(y) + 1)
            n, token = greedy_verify(y, [model.argmax(t, prefix + tokens + y[:j]) for j in range(len(y) + 1)])
            self.drafted += len(y)
            self.accepted += n
            for tok in y[:n] + [token]:
                r = model.traj.row(t, prefix + tokens)
                if min_confidence > 0 and tokens:
                    if r is None:
                        self.upper.estimated = True
                    elif float(model.rows.max_prob(1.0)[r]) < min_confidence:
                        stop = True
                        break
                tokens.append(tok)
                sources.append((model.name, r) if r is not None else None)
        return tokens, sources


class CascadeSim(CascadeDrafter):
    """The horizontal cascade on the trajectory (counters inherited from :class:`CascadeDrafter`)."""

    def propose(self, t, prefix, k, min_confidence=0.0):
        tokens: list[int] = []
        sources: list[Source] = []
        owner: list[int] = []
        for i, (drafter, n_i) in enumerate(self.levels):
            want = level_quota(i, len(self.levels), n_i, k, len(tokens))
            if want <= 0:
                break
            y, src = drafter.propose(t, prefix + tokens, want, min_confidence)
            tokens += y
            sources += src
            owner += [i] * len(y)
            if min_confidence > 0 and len(y) < want:
                break
        self.last_levels = owner
        return tokens, sources


def build_drafter(ep, d: DrafterConfig, levels=None, bigram_fallback: bool = True):
    """The replay twin of ``make_drafter`` (model, ngram, hybrid, self, cascade) for an episode ``ep``
    (:class:`~viasd.analysis.replay.Episode`: its trajectory, traced models and streams)."""
    cost_model = lambda name: ep.stream(name, "draft") if name == "draft" else None  # noqa: E731
    if d.name == "ngram":
        return ep.traces.lookup(ep.i, d.ngram_max, d.ngram_min)
    if d.name == "model":
        return ModelSim(ep.model("draft", "draft"), cost_model("draft"))
    if d.name == "self":
        spec = layers_key(d.layers) if d.layers is not None else "self:default"
        n = len(ep.traces.file(spec).meta["layers"] or [])
        return ModelSim(ep.model(spec, "self_draft"), ep.stream("self_draft", "target", n))
    if d.name == "hybrid":
        return HybridSim(ep.traces.lookup(ep.i, d.ngram_max, d.lookup_min),
                         ModelSim(ep.model("draft", "draft"), cost_model("draft")))
    if d.name == "cascade":
        return build_cascade(ep, d, cascade_levels(list(levels or DEFAULT_LEVELS), "method.levels"), bigram_fallback)
    raise ConfigError(f"replay has no drafter {d.name!r}; use model, ngram, hybrid, self or cascade")


def build_cascade(ep, d: DrafterConfig, levels, bigram_fallback: bool) -> CascadeSim:
    members: dict[str, Any] = {}

    def member(name: str):
        if name not in members:
            sim = build_drafter(ep, DrafterConfig(**{**d.__dict__, "name": name}))
            members[name] = MaxGramSim(ep.traj, sim) if bigram_fallback and isinstance(sim, LookupSim) else sim
        return members[name]

    built = []
    for lv in levels:
        chain = [lv.name, *lv.vertical]
        sim = member(chain[-1])
        for upper, lower, k_low in reversed(list(zip(chain[:-1], chain[1:], lv.vertical_tokens))):
            sim = VerticalSim(member(upper), sim, k_low, upper, lower)
        built.append((sim, lv.tokens))
    return CascadeSim(built, members, int(ep.traces.meta["vocab"]))
