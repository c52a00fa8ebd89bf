"""``python -m experiments.train_gate run=<ar run id> mask=<mask> [out=gate.pt] [lam=0.5|[0.3,0.5,0.7]]
[transfer=<run id>] [gamma=4] [test=0.25] [live=N] [topk=8] [gate_temperature=1.0] [seed=0] [min_rows=50]
[runs_dir=…]``

Trains the learned VIA-SD gate (``method.gate=learned``, :mod:`viasd.core.gate`) on a traced run
(``python -m experiments.trace run=<id> masks=[<mask>]`` first; the draft must be traced): labels
from the trace (is the slim verifier's greedy token the target's?), a logistic regression weighted
by ``λ`` (each value of a list is one gate, ``out`` gets ``-lam<λ>`` per value), train/test split
by problem (``test``: held-out share; ``live=N`` holds out at least the ``N`` problems a live decode with
``task.n_examples=N`` of the run's task runs, so the gate can be decoded on problems it never saw) and, with ``transfer=<run id>`` (another task, same pair and
traced mask), a transfer row scored on all of that run's problems. Prints the held-out metrics;
the gate file records the pair, mask, features, λ, the trace and those metrics (``docs/method.md``).
Out-of-range values (``topk``, ``gamma``, ``min_rows``, ``live`` below 1, ``seed`` outside ``[0, 2**32)``,
``gate_temperature`` not positive, ``lam`` outside ``(0, 1)``) and a ``transfer=`` run traced on another pair
are one error line each, before anything is labelled or written.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.trace import argv_or_help, parse_args, parse_mask
from viasd.analysis.gate_train import fit, labelled, scores, split_problems
from viasd.analysis.paired import resolve_run_id
from viasd.analysis.replay import TraceSet
from viasd.analysis.trace import slim_key, trace_dir
from viasd.engine.gate_file import save_gate
from viasd.errors import ConfigError, one_line_errors
from viasd.paths import runs_dir
from viasd.tasks.base import build_task
from viasd.tracking.store import RunStores


@dataclass
class TrainArgs:
    """The command's ``key=value`` arguments."""

    run: str = ""
    mask: Any = None
    out: str = "gate.pt"
    lam: list[float] = field(default_factory=lambda: [0.5])
    transfer: str | None = None
    gamma: int = 4
    test: float = 0.25
    live: int | None = None
    topk: int = 8
    gate_temperature: float = 1.0
    seed: int = 0
    min_rows: int = 50
    runs_dir: str | None = None

    def check(self) -> None:
        """One error line naming the fix for a value out of range (types are checked by :func:`parse_args`)."""
        if not self.run or self.mask is None:
            raise ConfigError("name the traced run and the slim mask: run=<ar run id> mask=<mask> (e.g. mask=[0,1,3])")
        if not 0 < self.test < 1:
            raise ConfigError(f"test must be in (0, 1) (got {self.test}): the share of problems held out")
        for key in ("gamma", "topk", "min_rows"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1 (got {getattr(self, key)}); e.g. {key}="
                                  f"{TrainArgs.__dataclass_fields__[key].default}")
        if self.live is not None and self.live < 1:
            raise ConfigError(f"live must be >= 1 (got {self.live}): the problems a live decode runs; drop it for none")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"seed must be in [0, 2**32) (got {self.seed}): it seeds the train/test split")
        if not math.isfinite(self.gate_temperature) or self.gate_temperature <= 0:
            raise ConfigError(f"gate_temperature must be > 0 (got {self.gate_temperature}); 1.0 reads the raw softmax")
        for lam in self.lam:
            if not 0 < lam < 1:
                raise ConfigError(f"lam must be in (0, 1) (got {lam}): the weight of a wrong trust; 0.5 weighs both "
                                  "errors alike")


def traces_of(store, run: str) -> tuple[str, TraceSet]:
    """A finished, greedy, traced run's ``(id, traces)`` (one error line naming the fix otherwise)."""
    rid = resolve_run_id(store, run)
    folder = trace_dir(store.root, rid)
    if not (folder / "index.json").is_file():
        raise ConfigError(f"run {rid} has no traces; run `python -m experiments.trace run={rid} masks=[<mask>]`")
    traces = TraceSet(folder)
    if float(traces.meta.get("temperature", 0.0)) > 0:
        raise ConfigError(f"run {rid} was sampled; the gate's labels need a greedy (ar) run")
    return rid, traces


def live_problems(store, rid: str, n: int) -> list[int]:
    """The trajectory indices of the problems ``task.n_examples=n`` of run ``rid``'s task decodes (its seeded
    subset is a prefix-stable choice by example id, so they are among the run's own problems)."""
    found = store.find(rid)
    task = dict(found["config"]["task"], n_examples=int(n))
    ids = [e.id for e in build_task(task).examples()]
    order = {e["id"]: i for i, e in enumerate(store.examples(rid))}
    missing = [i for i in ids if i not in order]
    if missing:
        raise ConfigError(f"live={n}: problems {missing[:3]} of the live subset are not in run {rid}; "
                          f"use live= at most the run's task.n_examples")
    return sorted(order[i] for i in ids)


def main(argv: list[str] | None = None) -> int:
    argv = argv_or_help(argv, __doc__)
    if argv is None:
        return 0
    with one_line_errors():
        args = parse_args([a.replace("lam=", "lam=[", 1) + "]" if a.startswith("lam=") and "[" not in a else a
                           for a in argv], TrainArgs)
        args.check()
        spec = slim_key(parse_mask(args.mask, 0.8))
        store = RunStores.default(args.runs_dir or runs_dir())
        rid, traces = traces_of(store, args.run)
        slim_file, _ = traces.file(spec), traces.file("draft")  # each missing trace: one line naming the command
        other = None
        if args.transfer:  # checked before any labelling
            orid, otraces = traces_of(store, args.transfer)
            for role in ("target", "draft", spec):  # the target first: another pair may not have the mask traced
                mine, theirs = traces.file(role).meta.get("pair"), otraces.file(role).meta.get("pair")
                if mine != theirs:
                    raise ConfigError(f"transfer run {orid} was traced on pair {theirs!r}, the gate is trained on "
                                      f"{mine!r}; name a traced run of the same pair (another task) as transfer=")
            if otraces.file(spec).meta.get("layers") != slim_file.meta.get("layers"):
                raise ConfigError(f"transfer run {orid} traced another mask for {spec!r}; trace it with the same pair")
        data = labelled(traces, "draft", spec, args.gamma, args.topk, args.gate_temperature)
        keep_out = live_problems(store, rid, args.live) if args.live else None
        train, held = split_problems(traces.n_examples, args.test, args.seed, keep_out)
        if args.transfer:
            other = (orid, labelled(otraces, "draft", spec, args.gamma, args.topk, args.gate_temperature))
        rows, written = [], []
        for lam in args.lam:
            params = fit(data.of(train), float(lam), args.min_rows)
            metrics = {"held_out": scores(params, data.of(held)), "train": scores(params, data.of(train))}
            rows.append({"lam": lam, "split": f"held-out problems of {rid}", **metrics["held_out"]})
            if other is not None:
                metrics["transfer"] = {"run": other[0], **scores(params, other[1])}
                rows.append({"lam": lam, "split": f"transfer: all of {other[0]}", **metrics["transfer"]})
            out = Path(args.out)
            if len(args.lam) > 1:
                out = out.with_name(f"{out.stem}-lam{lam:g}{out.suffix}")
            meta = {"pair": str(slim_file.meta.get("pair")), "mask": spec, "layers": slim_file.meta.get("layers"),
                    "lam": float(lam), "topk": args.topk, "gate_temperature": args.gate_temperature,
                    "gamma": args.gamma, "trace": {"run_id": rid, "files": [traces.target.path.name, slim_file.path.name,
                                                                             traces.file("draft").path.name]},
                    "train_problems": train, "test_problems": held, "metrics": metrics}
            written.append(save_gate(out, params["mean"], params["scale"], params["coef"], params["intercept"], meta))
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3f"))
    print(f"\n{len(data.y)} labelled rows over {traces.n_examples} problems of {rid} ({len(train)} train / "
          f"{len(held)} held out), mask {spec}")
    for p in written:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
