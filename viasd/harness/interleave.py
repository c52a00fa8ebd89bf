"""Interleaved runs: the cells of one workload decoded in one process, example by example.

An exp with ``exp.entry: interleave`` lists its cells as ``exp.variants`` — ``label: [Hydra
overrides]``, e.g. ``ar: [method=ar]`` and ``fast: [method=via_sd, method.tau_accept=0.9]``
(``conf/exp/main.yaml``; on the command line ``'+exp.variants.sd=["method=sd"]'`` adds one).
Hydra composes each variant as the job's own overrides plus the variant's plus
``schedule=interleaved`` (:func:`variant_cells`), and each is a normal run of the store: its own
folder, lock, ``examples.jsonl``, summary with scoring, and W&B run (logged from its folder when it
finishes, so one W&B run is open at a time). ``schedule`` is part of a run's identity, left out at
its default ``sequential`` (:data:`~viasd.harness.config.IDENTITY_UNSET`, so no other run id
changes): a cell decoded interleaved is another run than the same cell decoded alone, since its
time per example was measured between the other cells'.

:func:`run_interleaved` decodes example 1 with every unfinished cell, then example 2, …; the
cells' order is rotated by one per example (each record's ``interleave_slot`` is its position), so
load drift and position effects hit every cell alike. A kill at any point loses at most the
example in flight: each cell keeps its complete examples and the next attempt resumes each cell
where it stopped; finished cells are skipped (a cell decoded later, without the others, records
who it ran with in ``meta.json``). The variants must share the workload (everything but the
method); the ``ar`` cell finishes first, so every other cell's speedup is against the ``ar``
cell of its own group. The grid (:func:`viasd.harness.grid.exp_cells`) sees the variants as its
cells (:func:`expand`), so dry runs, prerequisite checks and reports treat them like any run.
"""

from __future__ import annotations

import sys
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from viasd.errors import ConfigError, RunInterrupted
from viasd.harness.identity import _prepare, cached_pair
from viasd.harness.runner import FULL_STORES, Cell, command_line
from viasd.harness.summary import fmt
from viasd.paths import PROJECT_ROOT
from viasd.tasks.length import fit_examples
from viasd.tracking.baseline import workload_key
from viasd.tracking.store import RunStore, StoreFull

INTERLEAVED = ["schedule=interleaved", "exp.entry=run"]


def variant_cells(job: list[str], cfg: DictConfig) -> list[tuple[str, list[str], DictConfig]]:
    """``(label, overrides, composed config)`` of every variant of the interleave cell ``cfg``
    (``job``: the overrides ``cfg`` was composed from)."""
    variants = OmegaConf.select(cfg, "exp.variants", default=None)
    name = OmegaConf.select(cfg, "exp.name", default="?")
    if not variants:
        raise ConfigError(f"exp {name!r} has exp.entry=interleave but no exp.variants; list them as "
                          "`label: [overrides]`, e.g. `ar: [method=ar]`")

    def _do() -> list[tuple[str, list[str], DictConfig]]:
        out = []
        for label, extra in variants.items():
            if isinstance(extra, str) or not all(isinstance(o, str) for o in extra or []):
                raise ConfigError(f"exp {name!r}: variant {label!r} must be a list of overrides, e.g. [method=ar]")
            overrides = [*job, *extra, *INTERLEAVED]
            out.append((str(label), overrides, compose(config_name="config", overrides=overrides)))
        return out

    if GlobalHydra.instance().is_initialized():
        return _do()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return _do()


def variant_label(cell: list[str], cfg: DictConfig) -> str | None:
    """The ``exp.variants`` label of the interleaved cell whose overrides are ``cell`` (as
    :func:`expand` made them), or None for a cell of another entry."""
    variants = OmegaConf.select(cfg, "exp.variants", default=None) or {}
    tails = [(len(extra), str(label)) for label, extra in variants.items()
             if len(cell) >= len(extra) + len(INTERLEAVED) and
             list(cell[len(cell) - len(extra) - len(INTERLEAVED):]) == [*extra, *INTERLEAVED]]
    return max(tails)[1] if tails else None


def expand(job: list[str], cfg: DictConfig) -> list[tuple[list[str], DictConfig]]:
    """The run cells of one composed job: its variants for an interleave cell, else itself."""
    if OmegaConf.select(cfg, "exp.entry", default="run") != "interleave":
        return [(job, cfg)]
    return [(overrides, c) for _, overrides, c in variant_cells(job, cfg)]


def _group(cfg: DictConfig, job: list[str]) -> list[tuple[str, Cell]]:
    cells = [(label, Cell(c)) for label, _, c in variant_cells(job, cfg)]
    ids: dict[str, str] = {}
    first = workload_key(cells[0][1].resolved)
    for label, c in cells:
        if c.run_id in ids:
            raise ConfigError(f"variants {ids[c.run_id]!r} and {label!r} are the same run ({c.run_id}); drop one")
        ids[c.run_id] = label
        if workload_key(c.resolved) != first:
            raise ConfigError(f"variant {label!r} is not the workload of {cells[0][0]!r} (only the method may differ "
                              "between interleaved cells: same pair, task, generation settings and seed)")
    return cells


def _rotated(cells: list, i: int) -> list:
    k = i % len(cells)
    return cells[k:] + cells[:k]


def run_interleaved(cfg: DictConfig, job: list[str] | None = None) -> dict[str, Any]:
    """Decode the variants of the interleave cell ``cfg`` example by example (see the module doc);
    ``job``: the overrides it was composed from (default: the running Hydra job's). Returns
    ``{"runs": {label: run_id}, "summaries": {label: summary}}``."""
    _prepare(cfg)
    job = list(job if job is not None else command_line() or [])
    cells = _group(cfg, job)
    name = OmegaConf.select(cfg, "exp.name", default="interleaved")
    print(f"[viasd] {', '.join(lb for lb, _ in cells)} interleaved example by example on "
          f"{cells[0][1].cfg.pair.name}/{cells[0][1].task.name}")
    store = cells[0][1].store
    if store.root in FULL_STORES:
        return {"failed": name, "reason": "the run store is full"}
    done = {label: s for label, c in cells if (s := c.done()) is not None}
    todo = [c for label, c in cells if label not in done]
    claimed: list[Cell] = []
    try:
        for c in sorted(todo, key=lambda c: c.run_id):  # one order for every process: no deadlock
            c.claim(wait=True)
            claimed.append(c)
        done.update({label: s for label, c in cells if label not in done and (s := c.done()) is not None})
        todo = [c for label, c in cells if label not in done]
        if todo:
            _decode_interleaved(todo, [c.run_id for _, c in cells])
    except StoreFull:
        FULL_STORES.add(store.root)
        raise
    finally:
        for c in claimed:
            c.release()
    summaries = {label: (store.find(c.run_id) or {}).get("summary", {}) for label, c in cells}
    print_group(cells, summaries, store, job)
    return {"runs": {label: c.run_id for label, c in cells}, "summaries": summaries}


def _decode_interleaved(todo: list[Cell], group: list[str]) -> None:
    examples = todo[0].task.examples()
    pair = cached_pair(todo[0].cfg.pair)
    examples = fit_examples(todo[0].task, examples, pair, todo[0].gen.max_new_tokens)  # over-long prompts: refused or cut
    try:
        for c in todo:
            c.open(examples, live_wandb=False)
        for c in todo:
            c.attach(pair)
            c.run_dir.update_meta(schedule={"kind": "interleaved", "group": group,
                                            "decoded_with": [d.run_id for d in todo],
                                            "order": "cells rotated by one per example (interleave_slot)"})
            c.warm_up(pair, examples)
        bar = tqdm(examples, desc=f"{len(todo)} interleaved runs on {pair.name}/{todo[0].task.name}", unit="ex",
                   file=sys.stderr)
        for i, ex in enumerate(bar):
            order = [c for c in _rotated(todo, i) if i >= c.reused]
            for slot, c in enumerate(order):
                c.decode(pair, i, ex, interleave_slot=slot)
        for c in sorted(todo, key=lambda c: c.method != "ar"):  # ar first: the others' speedups divide by it
            c.finish(pair, examples)
    except KeyboardInterrupt as e:
        for c in todo:
            c.abort()
        raise RunInterrupted(f"{todo[0].store.root} ({len(todo)} interleaved runs)") from e
    except BaseException as e:
        for c in todo:
            c.abort(e)
        raise


def shorten(text: str, limit: int = 300) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, ``…`` marking the cut."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    at_word_end = cut[-1:].isspace() or text[limit - 1].isspace()
    head = cut if at_word_end or len(cut.split(None, 1)) < 2 else cut.rsplit(None, 1)[0]
    return head.rstrip() + " …"


def print_group(cells: list[tuple[str, Cell]], summaries: dict[str, dict], store: RunStore, job: list[str]) -> None:
    """Each cell's speedup over the group's ``ar`` cell with its n, whether its outputs are ``ar``'s
    token for token, and one prompt with its output (the first non-``ar`` cell's)."""
    ar = next((c for _, c in cells if c.method == "ar"), None)
    ar_tokens = {e["id"]: e["token_ids"] for e in store.examples(ar.run_id)} if ar else {}
    print()
    for label, c in cells:
        s = summaries[label]
        line = f"  {label:<12} {fmt(s.get('tokens_per_s'))} tokens/s on {s.get('n_examples')} examples"
        if ar is not None and c is not ar:
            mine = store.examples(c.run_id)
            same = sum(ar_tokens.get(e["id"]) == e["token_ids"] for e in mine)
            line += (f"; {fmt(s.get('speedup_vs_ar'))}x ar's tokens/s (n={s.get('n_examples')}); "
                     f"outputs identical to ar token for token: {same}/{len(mine)}")
        print(line)
    if ar is None:
        print(f"  no ar cell in this group, so no speedup; add one: python -m experiments.run {' '.join(job)} "
              "'+exp.variants.ar=[\"method=ar\"]'")
    shown = next((c for _, c in cells if c is not ar), cells[0][1])
    first = next(iter(store.examples(shown.run_id)), None)
    if first is not None:  # the user message, not the chat-templated text the model read
        prompt = next((ex.prompt for ex in shown.task.examples() if ex.id == first["id"]), first["prompt"])
        print(f"\n  prompt 1: {shorten(prompt)!r}\n  {shown.labels['job_type']} output: {shorten(first['raw_output'])!r}")
    print(f"\n  run folders: {store.root}/<run id> for {', '.join(c.run_id for _, c in cells)}")
