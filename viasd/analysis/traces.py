"""A finished run's traces and the trace world a replayed policy runs in.

:class:`TraceSet` reads the traces of one run (``<store>/_traces/<run_id>/``: the trajectory and, per traced
model, its rows); :class:`Episode` is one policy over one example — the trace side of the
:class:`~viasd.engine.world.World` interface the methods' round loops are written against (greedy: a
model's token at a context is its trace row there; forward calls are counted and priced by
:class:`~viasd.analysis.sim.SimStream`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from viasd.analysis.cost import CostModel
from viasd.analysis.sim import LookupSim, Model, SimStream, Trajectory, greedy_verify
from viasd.analysis.trace import Rows, TraceFile, read_index
from viasd.core.rules import acceptance_rate, sd_accept_prob
from viasd.engine.drafters import Proposal
from viasd.engine.result import Counters, DecodeResult
from viasd.errors import ConfigError


class TraceSet:
    """The traces of one run (``<store>/_traces/<run_id>/``): the trajectory and rows per spec."""

    def __init__(self, folder: Path):
        self.folder, self.index = Path(folder), read_index(Path(folder))
        self._files: dict[str, TraceFile] = {}
        self._memo: dict[tuple, Any] = {}
        self.target = self.file("target")
        self.meta = self.target.meta
        self.n_examples = self.target.n_examples

    def file(self, spec: str) -> TraceFile:
        """The trace file serving ``spec`` (a ConfigError names the trace command when it is missing)."""
        name = self.index["specs"].get(spec)
        if name is None:
            have = ", ".join(sorted(self.index["specs"])) or "none"
            run = self.folder.name
            fix = {"draft": "draft=true", "intermediate": "intermediate=true"}.get(spec, f"masks=[{spec}]")
            alt = ("; a pair without a draft model: add one with pair.options.draft=trained (smollm2) or "
                   "pair.draft.id=<hub id or folder>, or replay a model-free drafter (method.drafter.name=ngram)"
                   if spec == "draft" else "")
            raise ConfigError(f"run {run} has no trace of {spec!r} (traced: {have}); "
                              f"run `python -m experiments.trace run={run} {fix}`{alt}")
        if name not in self._files:
            self._files[name] = TraceFile(self.folder / name)
        return self._files[name]

    def rows(self, spec: str, i: int) -> Rows:
        key = ("rows", spec, i)
        if key not in self._memo:
            self._memo[key] = self.file(spec).rows(i)
        return self._memo[key]

    def trajectory(self, i: int) -> Trajectory:
        key = ("traj", i)
        if key not in self._memo:
            t = self.target
            self._memo[key] = Trajectory(t.sequence("start", i), t.sequence("prompt", i), t.sequence("tokens", i),
                                         bool(self.meta.get("encoder_decoder")))
        return self._memo[key]

    def lookup(self, i: int, ngram_max: int, ngram_min: int) -> LookupSim:
        key = ("lookup", i, ngram_max, ngram_min)
        if key not in self._memo:
            self._memo[key] = LookupSim(self.trajectory(i), int(self.meta["vocab"]), ngram_max, ngram_min)
        return self._memo[key]

    def ratio(self, i: int, p_spec: str, q_spec: str, temperature: float) -> tuple[np.ndarray, ...]:
        """Per row, for the greedy token of model ``p_spec``: ``(p̂, q̂', exact, s)`` with ``s`` the
        ratio agreement :func:`sd_accept_prob` and ``exact`` False where the trace lacks ``q̂'``."""
        key = ("ratio", i, p_spec, q_spec, temperature)
        if key not in self._memo:
            p_rows = self.rows(p_spec, i)
            p = p_rows.max_prob(temperature)
            q, exact = self.rows(q_spec, i).probs_of(p_rows.argmax, temperature)
            self._memo[key] = (p, q, exact, sd_accept_prob(torch.from_numpy(p), torch.from_numpy(q)).numpy())
        return self._memo[key]

    def lookup_ratio(self, i: int, q_spec: str, temperature: float, r: int, token: int) -> tuple[float, bool]:
        """``(s, exact)`` of a one-hot (lookup) token at row ``r``: :func:`sd_accept_prob` of ``(1, q̂'(y))``."""
        key = ("lookup_ratio", i, q_spec, temperature, r, token)
        if key not in self._memo:
            q, exact = self.rows(q_spec, i).prob(r, token, temperature)
            self._memo[key] = (float(sd_accept_prob(torch.tensor(1.0), torch.tensor(q))), exact)
        return self._memo[key]

    def tv(self, i: int, p_spec: str, q_spec: str, temperature: float) -> np.ndarray:
        """``[N]`` ``1 − TV(p̂, q̂')`` per row from the two top-k sets (:func:`acceptance_rate` over
        their union; exact when the trace kept full rows, else a lower bound: ``docs/replay.md``)."""
        key = ("tv", i, p_spec, q_spec, temperature)
        if key not in self._memo:
            (pi, pp), (qi, qp) = (self.rows(s, i).topk_probs(temperature) for s in (p_spec, q_spec))
            match = pi[:, :, None] == qi[:, None, :]
            q_at_p = (match * qp[:, None, :]).sum(-1)
            self._memo[key] = acceptance_rate(torch.from_numpy(pp), torch.from_numpy(q_at_p)).numpy()
        return self._memo[key]


class Episode:
    """One policy over one example: the streams it runs, its counters and commit bookkeeping."""

    def __init__(self, traces: TraceSet, i: int, cost: CostModel | None):
        self.traces, self.i, self.cost = traces, i, cost
        self.traj = traces.trajectory(i)
        self.target = Model("target", traces.rows("target", i), self.traj)
        self.c, self.streams, self.t = Counters(), {}, 0
        self.max_new = int(traces.meta["max_new_tokens"])

    def stream(self, name: str, model: str = "target", layers: int | None = None) -> SimStream:
        if name not in self.streams:
            if self.cost is not None and model == "intermediate" and model not in self.cost.models:
                model = "draft"  # the pair's intermediate is its draft (priced once by the bench)
            price = self.cost.pricer(model, layers) if self.cost is not None else None
            self.streams[name] = SimStream(self.traj, price)
        return self.streams[name]

    def model(self, spec: str, name: str) -> Model:
        return Model(name, self.traces.rows(spec, self.i), self.traj)

    # The World interface (viasd.engine.world) the methods' loops run against: trace rows, priced calls.

    @property
    def done(self) -> bool:
        return self.t >= self.traj.n

    @property
    def remaining(self) -> int:
        return self.max_new - self.t

    @property
    def counters(self) -> Counters:
        return self.c

    def propose(self, drafter, k: int, min_confidence: float) -> Proposal:
        """A replay drafter's (:mod:`viasd.analysis.sim`) greedy proposal after the committed tokens:
        tokens on the host, no distributions (a trace holds rows, not tensors)."""
        y, _ = drafter.propose(self.t, [], k, min_confidence)
        return Proposal(y, None, None, y, getattr(drafter, "last_levels", None))

    def verify(self, proposal: Proposal) -> tuple[int, int, list[int]]:
        """The target's forward over the block (priced) and greedy verification against its traced tokens."""
        t, y = self.t, proposal.tokens
        self.stream("target").call(t, y, last=len(y) + 1)
        n, token = greedy_verify(y, self.target.argmaxes(self.traj.rows(t, y)))
        return n, token, y

    def next_token(self) -> int:
        self.stream("target").call(self.t, [], last=1)
        return self.target.argmax(self.t, [])

    def record(self, round) -> None:
        """Rounds are not kept (a replay reports counters)."""

    def commit(self, tokens: list[int], tiers: list[int]) -> int:
        """Commit a round's tokens along the trajectory (the run's end stops it): a token that differs
        from the trajectory is a divergence — the trajectory token takes its place and the round
        ends. Counts per tier the tokens emitted and those equal to the target's greedy token."""
        kept = 0
        for tok, tier in zip(tokens, tiers):
            if self.t >= self.traj.n:
                break
            self.c.bump(f"replay/tier{tier}_emitted")
            self.c.bump(f"replay/tier{tier}_correct", int(tok == int(self.target.rows.argmax[self.t])))
            same = tok == self.traj.tokens[self.t]
            self.t += 1
            kept += 1
            if not same:
                if not self.c.tiers.get("replay/divergences"):
                    self.c.bump("replay/tokens_to_first_divergence", self.t - 1)
                self.c.bump("replay/divergences")
                break
        return kept

    def result(self, method: str) -> DecodeResult:
        if not self.c.tiers.get("replay/divergences"):
            self.c.bump("replay/tokens_to_first_divergence", self.t)
        models = {name: s.stats for name, s in self.streams.items()}
        wall = sum(s.seconds for s in models.values())
        return DecodeResult(method, len(self.traj.start), self.traj.tokens[:self.t], [], self.c, models, wall,
                            "trajectory")


# ----------------------------------------------------------------------------- policies


class OnEpisode:
    """A trace world whose run state is its :class:`Episode` ``ep``: ``done``, ``remaining`` and the
    counters are the episode's (the trace worlds of :mod:`viasd.analysis.verifiers` and
    :mod:`viasd.analysis.deferral`)."""

    ep: Episode

    @property
    def done(self) -> bool:
        return self.ep.done

    @property
    def remaining(self) -> int:
        return self.ep.remaining

    @property
    def counters(self) -> Counters:
        return self.ep.c
