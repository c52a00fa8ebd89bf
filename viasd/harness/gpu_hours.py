"""GPU-hour estimate of a dry run's cells: a roofline model, not a measurement.

What this module owns: the per-cell and per-grid GPU-hour lines of ``dry_run=true``
(:mod:`viasd.harness.dryrun`). A decoding cell on GPUs costs at most::

    GPU-h = rows taken × max new tokens × t(one target forward of 1 token) × GPUs the cell holds / 3600 s

* rows taken: the subset the cell decodes (``examples: all`` of XSum on the hub = 11,334 rows); a cell
  whose row count the dry run does not know (no data folder, ``n_examples: null``) says ``rows unknown``;
* max new tokens: ``generation.max_new_tokens`` (else the task's) — an upper bound, a row stops at EOS;
* t: :func:`viasd.analysis.roofline.forward_ms` of the target (bf16 weights read once per token at the
  card's peak bandwidth, plus the eager per-forward overhead) after :data:`CONTEXT` cached tokens;
  ``ar`` does one such forward per token. A speculative method is given the same ``ar`` figure: its
  speedup over ``ar`` is what the run measures (a method slower than ``ar`` would exceed it);
* GPUs: enough cards of the chosen kind to hold the cell's memory (the dry run's ``weights × 1.2``);
  a target spread over them by ``device_map`` runs its layers one card after another, so the wall time
  is one card's and every held card is billed for it. Prefill (one forward per row) is left out.

The card is ``h100`` unless ``VIASD_DRYRUN_GPU_KIND`` names another of
:data:`viasd.analysis.roofline.GPUS`. CPU pairs, calibration (DIMR/KL) cells and models without a
roofline shape (``conf/paper_shapes.yaml``) get ``n/a`` with the reason.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from viasd.analysis.roofline import GPUS, forward_ms, shape_of
from viasd.errors import ConfigError
from viasd.harness.model_sizes import GIB

__all__ = ["ENV", "CONTEXT", "CellHours", "gpu_kind", "cell_hours", "fmt_hours", "print_gpu_hours"]

ENV = "VIASD_DRYRUN_GPU_KIND"
DataLine = Callable[[Any], "tuple[str, int | None]"]  # the dry run's row reader: task -> (data line, rows or None)
CONTEXT = 512  # cached tokens a decode step reads (prompt + half the answer): an assumption; KV is a small term


def gpu_kind() -> str:
    """The card the estimate prices (``VIASD_DRYRUN_GPU_KIND``, default ``h100``); an unknown name is one
    ConfigError line naming the variable and the known cards."""
    kind = os.environ.get(ENV, "").strip().lower() or "h100"
    if kind not in GPUS:
        raise ConfigError(f"{ENV}={os.environ.get(ENV)!r} is not a GPU the roofline knows; "
                          f"use one of {', '.join(GPUS)} (e.g. {ENV}=h100) or unset it")
    return kind


@dataclass
class CellHours:
    """One cell's estimate: ``hours`` (None: no estimate), the line that says how (or why not), and
    ``on_gpu``: False for a CPU pair or a calibration cell, which the estimate does not price."""

    hours: float | None
    line: str
    on_gpu: bool = True


def fmt_hours(h: float) -> str:
    """``0.31``, ``4.2``, ``40``, ``1,234``: GPU-hours to two significant figures, never in e-notation."""
    return f"{h:.2f}" if h < 1 else f"{h:.1f}" if h < 10 else f"{h:,.0f}"


def _rows(cfg: DictConfig, data_line: DataLine) -> tuple[int | None, int]:
    """(rows the cell decodes or None when unknown, max new tokens per row)."""
    from viasd.tasks import build_task

    task = build_task(cfg.task)
    _, rows = data_line(task)
    n = task.cfg["n_examples"]
    taken = rows if n is None else (min(n, rows) if rows is not None else n)
    new = OmegaConf.select(cfg, "generation.max_new_tokens", default=None)
    return taken, int(new) if new is not None else task.max_new_tokens


def cell_hours(cfg: DictConfig, plan: Any, kind: str, data_line: DataLine) -> CellHours:
    """The GPU-hour estimate of one planned cell (``plan``: its :class:`~viasd.harness.dryrun.CellPlan`)
    on cards of ``kind`` (module docstring for the formula and what it leaves out); ``data_line``: the
    dry run's reader of a task's rows (task → (line, rows or None))."""
    label = f"{kind} roofline, ar upper bound"
    if plan.entry != "run":
        return CellHours(None, "n/a (calibration cell: no decode to price)", on_gpu=False)
    if plan.device != "cuda":
        return CellHours(None, "n/a (CPU pair)", on_gpu=False)
    pair = OmegaConf.to_container(cfg.pair, resolve=True)
    target = str((pair.get("target") or {}).get("id") or "")
    try:
        shape = shape_of(target)
    except ConfigError:
        return CellHours(None, f"n/a (no roofline shape for target {target or pair.get('name')!r})")
    rows, new = _rows(cfg, data_line)
    if rows is None:
        return CellHours(None, f"n/a (rows unknown: examples: all, and no data folder or hub row count here; {label})")
    card = GPUS[kind]
    gpus = max(1, math.ceil(plan.need_gib / (card.memory_gb * 1e9 / GIB)))
    ms = forward_ms(shape, card, 1, CONTEXT)
    hours = rows * new * ms / 1e3 / 3600 * gpus
    method = str(OmegaConf.select(cfg, "method.name", default="ar"))
    why = "" if method == "ar" else f"; {method} divides it by its speedup, which the run measures"
    return CellHours(hours, f"~{fmt_hours(hours)} GPU-h ({label}): {rows} rows x {new} new tokens x "
                            f"{ms:.1f} ms/target forward x {gpus} GPU(s){why}")


def print_gpu_hours(cells: list[DictConfig], plans: list[Any], kind: str, data_line: DataLine) -> list[CellHours]:
    """Print one line per cell on GPUs (``~X GPU-h (h100 roofline, ar upper bound)``, or ``n/a`` with the
    reason) and the grid's line: the sum over the cells still to run; cells on the CPU and calibration
    cells are only counted (a CPU grid gets one ``n/a`` line). Returns every cell's estimate."""
    est = [cell_hours(cfg, plan, kind, data_line) for cfg, plan in zip(cells, plans)]
    for i, (e, plan) in enumerate(zip(est, plans), 1):
        if e.on_gpu:
            print(f"[viasd] gpu-hours ({i}/{len(plans)}) {plan.label}: {e.line}")
    todo = [e.hours for e, p in zip(est, plans) if e.hours is not None and not p.finished]
    done = sum(e.hours is not None and p.finished for e, p in zip(est, plans))
    gpu = sum(e.on_gpu for e in est)
    if not todo and not done:
        why = ("CPU pairs only" if all(e.line == "n/a (CPU pair)" for e in est) else
               "no decoding cell on GPUs: CPU pairs or calibration cells" if not gpu else
               "no GPU cell with a roofline shape and a known row count")
        print(f"[viasd] GPU-hours: n/a ({why})")
        return est
    parts = ((done, "finished cell(s) not counted"), (gpu - len(todo) - done, "GPU cell(s) n/a"),
             (len(est) - gpu, "CPU or calibration cell(s) not priced"))
    print(f"[viasd] GPU-hours: ~{fmt_hours(sum(todo))} GPU-h for {len(todo)} cell(s) to run (estimate from the "
          f"{kind} roofline model, not measured; ar upper bound at max_new_tokens"
          + "".join(f"; {n} {what}" for n, what in parts if n) + ")")
    return est
