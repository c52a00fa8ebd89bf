"""The world a method's round loop runs in: live models, or a recorded trace.

A method's algorithm is written once (e.g. :func:`viasd.methods.sd.sd_rounds`) against the small
:class:`World` interface below; :class:`LiveWorld` implements it with :class:`~viasd.engine.stream.Stream`
forwards over loaded models (``experiments.run``), and :class:`viasd.analysis.replay.Episode` with
teacher-forced trace rows priced by the cost model (``experiments.replay``). Only where the numbers come
from differs; the loop, its length policy and its counting are the same code.

The interface (greedy or sampled for the live world; greedy for a trace):

* ``done`` / ``remaining``: whether decoding has stopped; how many tokens may still be emitted.
* ``counters``: the run's :class:`~viasd.engine.result.Counters`.
* ``propose(drafter, k, min_confidence)``: the drafter's :class:`~viasd.engine.drafters.Proposal`
  of up to ``k`` tokens after the committed sequence.
* ``verify(proposal)``: the target scores the block in one forward and verifies it with the SD rules:
  ``(n, token, drafted)`` — accepted count, correction or bonus token, and the drafted tokens on the
  host (at least the first ``n``).
* ``next_token()``: the target's next token after the committed sequence (one forward).
* ``commit(tokens, tiers)``: append tokens until a stop rule fires (a trace: until its trajectory
  ends or a token leaves it); returns how many were kept. ``tiers``: per token, which verifier decided.
* ``record(round)``: keep a round's :class:`~viasd.engine.result.RoundRecord`.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from viasd.core.rules import verify_block, verify_greedy
from viasd.core.sampling import probs_from_logits, sample
from viasd.engine.drafters import Drafter, Features, Proposal
from viasd.engine.result import Counters, DecodeResult, Output, RoundRecord
from viasd.engine.stream import Stream, start_sequence
from viasd.engine.syncs import to_host


class World(Protocol):
    """What a round loop reads and does (see the module docstring)."""

    counters: Counters

    @property
    def done(self) -> bool: ...

    @property
    def remaining(self) -> int: ...

    def propose(self, drafter, k: int, min_confidence: float) -> Proposal: ...

    def verify(self, proposal: Proposal) -> tuple[int, int, list[int]]: ...

    def next_token(self) -> int: ...

    def commit(self, tokens: list[int], tiers: list[int]) -> int: ...

    def record(self, round: RoundRecord) -> None: ...


class LiveWorld:
    """The live world: the target's :class:`Stream` over the committed sequence (:class:`Output`).

    ``target``: the target's stream when the method built it (``via_sd``: sharing a prefix with its slim
    verifier). A drafter with ``needs_hidden`` (:meth:`attach`) gets the target's hidden states (:class:`Features`):
    the initial sequence's from one pre-fill forward (kept in the target's cache), then, at each commit after a
    target forward (:meth:`score`), those of every committed position the target has now run on — each position
    once, in order, whatever method drives the world (``sd``, ``via_sd``'s escalations, ``faster_cascades``).
    """

    def __init__(self, pair, prompt_ids: torch.Tensor, gen, rng: torch.Generator | None, drafter: Drafter | None = None,
                 target: Stream | None = None):
        self.pair, self.prompt_ids, self.gen, self.rng = pair, prompt_ids, gen, rng
        self.target = target if target is not None else Stream(pair.target, prompt_ids, "target")
        self.out = Output(start_sequence(pair.target, prompt_ids), gen, gen.eos_ids(pair), pair.tokenizer)
        self.counters, self.rounds = Counters(), []
        self.features: Features | None = None  # the positions not yet handed to the drafter (None: it reads none)
        self._states: tuple[torch.Tensor, int] | None = None  # the last target forward's hidden states, first position
        if drafter is not None:
            self.attach(drafter)

    def attach(self, drafter: Drafter) -> None:
        """Feed ``drafter`` the target's hidden states if it reads them (``needs_hidden``): one pre-fill forward of
        the target over the initial sequence ``[1, L]``, whose cache the first verification reuses."""
        if drafter.needs_hidden and self.features is None:
            _, states = self.target.logits(self.out.seq, last=self.out.seq.shape[1], host=self.out.ids, hidden=True)
            self.features = Features(states, 0)

    def handed(self) -> Features | None:
        """The features to hand the drafter now (those since its previous call; ``None``: it reads none)."""
        features = self.features
        if features is not None:
            self.features = Features(features.hidden[:, :0], features.end)
        return features

    def score(self, block: torch.Tensor, last: int, host: list[int] | None = None) -> torch.Tensor:
        """The target's logits ``[1, last, V]`` at the last ``last`` positions of ``block`` ``[1, L]`` (one
        forward). For a drafter with ``needs_hidden`` the forward also returns the hidden states from the first
        position the drafter lacks (the target may lag behind the committed tokens: ``via_sd``), held until
        :meth:`commit` knows which of them were committed."""
        if self.features is None:
            return self.target.logits(block, last=last, host=host)
        rows = max(last, block.shape[1] - self.features.end)
        logits, states = self.target.logits(block, last=rows, host=host, hidden=True)
        self._states = (states, block.shape[1] - rows)
        return logits[:, rows - last:]

    @property
    def done(self) -> bool:
        return self.out.done

    @property
    def remaining(self) -> int:
        return self.out.remaining

    def propose(self, drafter: Drafter, k: int, min_confidence: float) -> Proposal:
        out = self.out
        return drafter.propose(out.seq, k, self.gen, self.rng, min_confidence, out.ids, self.handed())

    def verify(self, proposal: Proposal) -> tuple[int, int, list[int]]:
        out, draft, k = self.out, proposal.tokens, len(proposal)
        block = torch.cat([out.seq, draft.view(1, -1)], 1)
        logits = self.score(block, k + 1, out.ids)
        q = probs_from_logits(logits[0], self.gen)
        if self.gen.temperature == 0:  # the round's one host sync: the verdict and the drafted tokens
            n, token, *drafted = to_host(torch.cat([verify_greedy(draft, q), draft]))
        else:
            n, token = verify_block(draft, proposal.probs, q, self.rng)
            drafted = proposal.host if proposal.host is not None else draft[:n].tolist()
        return n, token, drafted

    def next_token(self) -> int:
        q = probs_from_logits(self.target.logits(self.out.seq, host=self.out.ids)[0, -1], self.gen)
        return to_host(sample(q, self.rng, self.gen.temperature == 0))  # one host sync per token: reading it

    def commit(self, tokens: list[int], tiers: list[int] | None = None) -> int:
        start = self.out.seq.shape[1]
        emitted = self.out.commit(tokens)
        if self._states is not None:  # the target ran on every committed token but the last (its correction/bonus)
            states, first = self._states
            end = start + min(len(tokens) - 1, emitted)  # one past the last committed position the target ran on
            self.features = self.features.after(states[:, :max(0, end - first)], first)
            self._states = None
        return emitted

    def record(self, round: RoundRecord) -> None:
        self.rounds.append(round)

    def result(self, method: str, models: dict, t0: float) -> DecodeResult:
        """The decode's :class:`DecodeResult` (``models``: the drafter's statistics; the target's are added)."""
        return DecodeResult(method, self.prompt_ids.shape[1], self.out.new, self.rounds, self.counters,
                            {**models, "target": self.target.stats}, time.perf_counter() - t0, self.out.stop_reason)
