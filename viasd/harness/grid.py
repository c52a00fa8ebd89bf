"""Experiment grids as Hydra multiruns: the cells of an exp, what runs per cell, and the grid callback.

An exp file (``conf/exp/NAME.yaml``) sets ``hydra.mode: MULTIRUN`` and ``hydra.sweeper.params``
(method/task/seed… dimensions); its defaults pull the ``scale`` group (``scale=smoke|local|paper``,
default local) and ``conf/scale/NAME/<scale>.yaml``, which adds that scale's pairs (a sweep
dimension at paper scale) and sizes to the same ``hydra.sweeper.params``. Hydra's basic sweeper
expands them; a command-line value for a swept key replaces the exp's values for it. So
``python -m experiments.run +exp=table2 scale=smoke`` runs every cell as one multirun job, and
``hydra/launcher=viasd_slurm`` sends the same jobs to a cluster.

:class:`GridCallback` (configured in ``conf/config.yaml``) checks the cells' prerequisites once
before the first job (one error line, exit status 2; any failure of the check itself too, where
Hydra would only warn and run every cell unchecked), prints the plan of every cell and exits
for ``dry_run=true``, numbers the jobs, and ends with a summary (exit status 1 when a cell
failed; a failing cell never stops the others). A cell counts as done only when its run is
finished in the run store, so the summary is true under any launcher, also one that runs cells
in processes of their own (``submitit_local``, ``viasd_local``, SLURM) whose failures the grid
process never sees. Cells in local processes of their own decode a bounded number at a time and
stop when the grid process dies (:mod:`viasd.harness.launchers`). Finished runs (same resolved
config) are skipped by the runner, so a killed grid resumes where it stopped; a cell another process
is writing is skipped and done at the end (so two identical grids on one store share their cells).
An interleave job (``exp.entry: interleave``, :mod:`viasd.harness.interleave`) counts as its variants.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from viasd.errors import ConfigError
from viasd.harness.cli import CONF_DIR, hydra_error_line, python_command
from viasd.harness.dimr_runs import run_kl, run_search
from viasd.harness.dryrun import dry_run
from viasd.harness.interleave import expand, run_interleaved
from viasd.harness.launchers import ENV_LOCK, GridLock, in_cell_process, take_slot, watch_grid
from viasd.harness.prereq import check_ready
from viasd.harness.runner import defer_locked_runs, identity, run, run_deferred
from viasd.methods.api import method_config
from viasd.tasks import build_task
from viasd.tasks.families import HUB
from viasd.tracking.store import RunStore, run_id_for

__all__ = ["CONF_DIR", "exp_names", "exp_file", "sweep_overrides", "exp_jobs", "exp_cells", "compose_cells", "run_cell",
           "check_prerequisites", "cell_label", "cell_names", "cell_finished", "GridCallback"]


def exp_names() -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / "exp").glob("*.yaml"))


def exp_file(name: str) -> Path:
    return CONF_DIR / "exp" / f"{name}.yaml"


def sweep_overrides(params: dict[str, Any], overrides: list[str]) -> list[list[str]]:
    """The override list of every job of a multirun, as Hydra's basic sweeper expands it.

    ``params``: ``hydra.sweeper.params``; ``overrides``: the command line (a key given there
    replaces the params' values for it).
    """
    args = [f"{k}={v}" for k, v in params.items()] + list(overrides)
    parsed = OverridesParser.create().parse_overrides(args)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def exp_jobs(overrides: list[str]) -> list[list[str]]:
    """The override list of every cell of the sweep ``overrides`` select (its exp's sweeper params
    expanded); call it with Hydra initialized (:func:`exp_cells` does)."""
    fixed = [o.input_line for o in OverridesParser.create().parse_overrides(list(overrides))
             if not o.is_sweep_override()]  # the sweep itself cannot compose; its sweeper params can
    top = compose(config_name="config", overrides=fixed, return_hydra_config=True)
    params = OmegaConf.select(top, "hydra.sweeper.params", default=None)  # None: a plain -m sweep
    params = OmegaConf.to_container(params, resolve=True) if params is not None else {}
    return sweep_overrides(params, overrides)


def exp_cells(overrides: list[str]) -> list[tuple[list[str], DictConfig]]:
    """``(job overrides, composed config)`` of every cell of the sweep ``overrides`` select
    (e.g. ``["+exp=table2", "scale=smoke"]``); works inside or outside a Hydra app."""

    def _do() -> list[tuple[list[str], DictConfig]]:
        return [cell for job in exp_jobs(overrides)  # an interleave job: its variants
                for cell in expand(job, compose(config_name="config", overrides=job))]

    if GlobalHydra.instance().is_initialized():
        return _do()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return _do()


def compose_cells(overrides: list[str]) -> list[DictConfig]:
    """The composed config of every cell (see :func:`exp_cells`)."""
    return [cfg for _, cfg in exp_cells(overrides)]


def run_cell(cfg: DictConfig) -> dict[str, Any]:
    """Execute one composed cell according to ``exp.entry`` (run | search | kl)."""
    entry = OmegaConf.select(cfg, "exp.entry", default="run")
    runners = {"run": run, "search": run_search, "kl": run_kl, "interleave": run_interleaved}
    if entry not in runners:
        raise ConfigError(f"unknown exp.entry {entry!r}; use run, search, kl or interleave")
    return runners[entry](cfg)


def check_prerequisites(cells: list[DictConfig]) -> None:
    """Raise the first ConfigError any cell would hit before decoding: its method config (type
    and range checks), its slim verifier's DIMR mask and its task's preflight (sandbox)
    (:func:`~viasd.harness.prereq.check_ready`), and its task's data (each distinct task config
    is loaded once; every task whose data cannot be read is named in one line with the one command
    that fetches them all)."""
    check_ready(cells)
    seen: set[str] = set()
    no_data: dict[str, ConfigError] = {}
    for cfg in cells:
        if OmegaConf.select(cfg, "exp.entry", default="run") == "run":
            method_config(cfg.method.name, cfg.method)
        key = OmegaConf.to_yaml(cfg.task)
        if key not in seen:
            seen.add(key)
            try:
                build_task(cfg.task).examples()
            except ConfigError as e:
                if str(cfg.task.name) not in HUB or not cfg.task.get("offline_file"):
                    raise
                no_data.setdefault(str(cfg.task.name), e)
    if len(no_data) == 1:
        raise next(iter(no_data.values()))
    if no_data:
        names = " ".join(no_data)
        raise ConfigError(f"{len(no_data)} tasks of this grid have no data here ({', '.join(no_data)}: no offline file "
                          f"under VIASD_DATA_DIR and the hub not reachable); fetch them all at once where the hub is "
                          f"reachable with `python -m experiments.data fetch {names}` (writes into VIASD_DATA_DIR; copy "
                          f"the folder here), or point VIASD_DATA_DIR at a folder that has them")


def cell_label(cfg: DictConfig) -> str:
    """``pair/method/task`` of a cell; search and KL cells name their entry and calibration sources."""
    entry = OmegaConf.select(cfg, "exp.entry", default="run")
    if entry in ("search", "kl"):
        what = "dimr_search" if entry == "search" else "kl_geometry"
        calib = OmegaConf.select(cfg, "search.calibration", default=[]) or []
        return f"{cfg.pair.name}/{what}/{'+'.join(map(str, calib))}"
    return f"{cfg.pair.name}/{OmegaConf.select(cfg, 'method.name')}/{OmegaConf.select(cfg, 'task.name')}"


def cell_names(cells: list[tuple[list[str], DictConfig]]) -> list[str]:
    """:func:`cell_label` of every ``(job overrides, config)`` of :func:`exp_cells`, plus the job's
    overrides that tell it apart from the other cells of the same label (``[method.gamma=4]``)."""
    labels = [cell_label(cfg) for _, cfg in cells]
    names = []
    for (job, _), label in zip(cells, labels):
        same = [j for (j, _), other in zip(cells, labels) if other == label]
        differ = [o for o in job if not all(o in j for j in same)]
        names.append(f"{label} [{' '.join(differ)}]" if len(same) > 1 and differ else label)
    return names


def cell_finished(cfg: DictConfig) -> bool:
    """Whether the run of a composed cell is finished in its run store (what the runner skips)."""
    entry = OmegaConf.select(cfg, "exp.entry", default="run")
    return RunStore(cfg.tracking.store_dir).is_finished(run_id_for(identity(cfg, entry)))


def _slots(config: DictConfig) -> int:
    """Cells decoding at once in processes of their own: ``hydra.launcher.max_parallel`` when the
    launcher has it, else the cores this process may use divided by ``threads``."""
    cap = OmegaConf.select(config, "hydra.launcher.max_parallel", default=None)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return int(cap) if cap else max(1, cores // max(1, int(config.get("threads") or 1)))


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


class GridCallback(Callback):
    """Hydra callback around every multirun (an exp or a ``-m`` sweep): prerequisites and dry
    run before the first job, job numbering, decode slots and the grid watch in cells of their
    own process, and the closing summary read from the run store."""

    def __init__(self) -> None:
        self.name, self.total, self.failures = "sweep", 0, set()
        self.cells: list[tuple[list[str], DictConfig]] = []
        self.grid: GridLock | None = None

    def __getstate__(self) -> dict[str, Any]:  # a launcher pickles the callbacks into each job: not the lock
        return {**self.__dict__, "grid": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.name = str(OmegaConf.select(config, "exp.name", default="sweep"))
        self.failures = set()  # job numbers this process saw fail (a launcher's own processes: none)
        overrides = list(config.hydra.overrides.task)
        try:
            self.cells = exp_cells(overrides)
            if config.get("dry_run"):
                dry_run([cfg for _, cfg in self.cells], self.name, bool(config.get("dry_run_strict")),
                        launcher=OmegaConf.select(config, "hydra.launcher", default=None) or {})
                sys.exit(0)
            check_prerequisites([cfg for _, cfg in self.cells])
        except ConfigError as e:
            _fail(str(e))
        except (HydraException, OmegaConfBaseException) as e:
            _fail(f"exp {self.name!r}: a cell does not compose: {hydra_error_line(e)}")
        except Exception as e:  # Hydra would only warn about it and run every cell unchecked
            _fail(f"exp {self.name!r}: the start-of-grid check failed ({type(e).__name__}: {e})")
        self.total = len(self.cells)
        slots = _slots(config)
        self.grid = GridLock(slots)
        defer_locked_runs()  # a cell another process is writing is done at the end (on_multirun_end)
        print(f"[viasd] exp {self.name}: {self.total} runs")
        given = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
        for key in sorted(given & set(OmegaConf.select(config, "hydra.sweeper.params", default=None) or {})):
            print(f"[viasd] command line sets {key}; the exp's values for it are not used")
        target = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if target.endswith("submitit_launcher.LocalLauncher") and self.total > slots:
            print(f"[viasd] hydra/launcher=submitit_local starts all {self.total} cells at once and {slots} decode at "
                  "a time; hydra/launcher=viasd_local starts only hydra.launcher.max_parallel")

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        num = OmegaConf.select(config, "hydra.job.num", default=None, throw_on_missing=False)
        if num is None or OmegaConf.select(config, "exp.entry") == "interleave":  # a single run; a group names itself
            return
        print(f"[viasd] ({num + 1}/{self.total or '?'}) {cell_label(config)}", flush=True)  # ?: another process
        if in_cell_process() and ENV_LOCK in os.environ:  # a launcher's own process: bounded, and tied to the grid
            watch_grid()
            take_slot()

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        num = OmegaConf.select(config, "hydra.job.num", default=None, throw_on_missing=False)
        if job_return.status == JobStatus.FAILED or (
                isinstance(job_return.return_value, dict) and job_return.return_value.get("failed")):
            self.failures.add(int(num))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        run_deferred(run_cell, cell_label)  # cells another process held; failures show as unfinished below
        if self.grid is not None:
            self.grid.release()
        names = cell_names(self.cells)
        failed = sorted(self.failures | {i for i, (_, cfg) in enumerate(self.cells) if not cell_finished(cfg)})
        if failed:
            target = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
            logs = f"; job logs: {config.hydra.sweep.dir}/.submitit/" if "submitit" in target else ""
            print(f"[viasd] exp {self.name}: {len(failed)} of {self.total} runs failed: "
                  f"{', '.join(names[i] for i in failed if i < len(names))}{logs}", file=sys.stderr)
            sys.exit(1)
        print(f"[viasd] exp {self.name}: all {self.total} runs finished; "
              f"build reports with `{python_command()} -m experiments.report` (or `make report`)")
