"""``hydra/launcher=viasd_local`` and ``viasd_slurm``: submitit's launchers, bounded and sized per cell.

**viasd_local**: submitit's local launcher, at most ``max_parallel`` cells at once.

``hydra/launcher=submitit_local`` (``hydra-submitit-launcher``, a dev dependency) starts every
cell of a grid at once: 25 decodes on 2 cores. This launcher submits ``max_parallel`` (default 2)
and starts the next cell when one ends; a job that dies (killed, out of memory) is a failed cell
of the grid's summary (:func:`failed_job`), not an exception that ends the sweep; Ctrl-C or an
error in the launcher cancels the running jobs. Each cell stops when the grid process dies and
waits for a decode slot (:mod:`viasd.harness.launchers`, wired by the grid callback). Without the
submitit plugin installed this module defines only :func:`failed_job`.

Settings (``hydra.launcher.<key>=…``): ``max_parallel``; ``timeout_min`` (submitit ends a local
job after it: 7 days here, not submitit's 60 minutes); ``tasks_per_node`` must stay 1 (submitit
runs that many copies of one cell, all writing the same run).

**viasd_slurm** (``conf/hydra/launcher/viasd_slurm.yaml``): submitit's SLURM launcher that sizes
each cell from its pair. Hydra hands a launcher one resource block per multirun; this one composes
every cell's config (without its ``hydra`` node: the sweep's ``${hydra.job.num}`` is unset until a
job runs), asks :func:`viasd.harness.dryrun.cell_job` for its GPUs, host memory and time (the dry
run's memory plan on ``gpu_gib`` GPUs, the same knob the dry run's SLURM sizes read), and submits
one job array per distinct size — a grid over three pairs is three arrays, each with its pair's
resources. A job never spans more than one node of ``node_gpus`` GPUs (default 8): when a cell
would need more, nothing is submitted and one ``error:`` line names every such cell (exit 2), as
does a bad ``gpu_gib``/``node_gpus``. ``size_per_cell=false``
submits every cell with the block as written. Each cell builds its run inside the job, on the
compute node, so a code task's sandbox preflight runs there too (``viasd.harness.runner.Cell``).
"""

# No `from __future__ import annotations`: Hydra's plugin scan runs this module outside sys.modules,
# where dataclasses cannot resolve string annotations.
import dataclasses
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides

from viasd.errors import ConfigError

try:  # the [slurm] extra: without it there is no viasd_local or viasd_slurm launcher
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, LocalQueueConf, SlurmQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher
except ImportError:  # pragma: no cover - exercised where the plugin is missing
    LocalQueueConf = LocalLauncher = SlurmQueueConf = SlurmLauncher = BaseQueueConf = None

log = logging.getLogger(__name__)


def failed_job(overrides: Sequence[str], why: str) -> JobReturn:
    """The return of a job that died before it could report: a failed cell (``{"failed": why}``),
    which the grid lists at the end, instead of an exception that would end the whole sweep."""
    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    ret.return_value = {"failed": why}
    return ret

if LocalLauncher is not None:

    @dataclasses.dataclass
    class CappedLocalConf(LocalQueueConf):
        """Schema of ``hydra/launcher=viasd_local``."""

        _target_: str = "hydra_plugins.viasd_launcher.viasd_launcher.CappedLocalLauncher"
        max_parallel: int = 2  # cells running at once (each uses `threads` cores)
        timeout_min: int = 7 * 24 * 60  # submitit ends a local job after this (its default, 60, ends long decodes)

    class CappedLocalLauncher(LocalLauncher):
        """Submitit's local launcher, ``max_parallel`` jobs at a time (see the module docstring)."""

        def __init__(self, max_parallel: int = 2, **params: Any) -> None:
            if int(max_parallel) < 1:
                raise ConfigError(f"hydra.launcher.max_parallel must be >= 1, got {max_parallel}")
            if int(params.get("tasks_per_node", 1)) != 1:
                raise ConfigError("hydra.launcher.tasks_per_node must be 1: submitit would run that many copies of "
                                  "each cell, all writing the same run")
            super().__init__(**params)
            self.max_parallel = int(max_parallel)

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            import submitit  # imported here, as the submitit plugin does: plugin discovery stays fast

            executor = submitit.AutoExecutor(cluster="local", folder=self.params["submitit_folder"])
            executor.update_parameters(**{k: v for k, v in self.params.items() if k != "submitit_folder"})
            Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
            log.info(f"Submitit 'local' sweep output dir : {self.config.hydra.sweep.dir} "
                     f"({self.max_parallel} jobs at a time)")
            pending = list(enumerate(job_overrides, initial_job_idx))
            running: dict[int, Any] = {}
            results: dict[int, JobReturn] = {}
            try:
                while pending or running:
                    while pending and len(running) < self.max_parallel:
                        idx, overrides = pending.pop(0)
                        log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
                        running[idx] = executor.submit(self, list(overrides), "hydra.sweep.dir", idx,
                                                       f"job_id_for_{idx}", Singleton.get_state())
                    for idx, job in list(running.items()):
                        if job.done():
                            del running[idx]
                            try:
                                results[idx] = job.results()[0]
                            except Exception as e:  # the job died: a failed cell, the others go on
                                results[idx] = failed_job(job_overrides[idx - initial_job_idx],
                                                          f"job {idx} died ({type(e).__name__}); log: {job.paths.stderr}")
                    time.sleep(0.2)
            finally:
                for job in running.values():  # Ctrl-C or an error here: no job outlives the launcher
                    job.cancel(check=False)
            return [results[i] for i in sorted(results)]

    ConfigStore.instance().store(group="hydra/launcher", name="viasd_local", node=CappedLocalConf, provider="viasd")


def size_groups(job_overrides: Sequence[Sequence[str]], initial_job_idx: int,
                sizes) -> dict[tuple, list[tuple[int, list[str]]]]:
    """The cells of a sweep grouped by their job size: ``{sorted size items: [(job index, overrides)]}``
    in sweep order; ``sizes(overrides) -> {hydra.launcher key: value}``."""
    groups: dict[tuple, list[tuple[int, list[str]]]] = {}
    for idx, overrides in enumerate(job_overrides, initial_job_idx):
        groups.setdefault(tuple(sorted(sizes(list(overrides)).items())), []).append((idx, list(overrides)))
    return groups


if SlurmLauncher is not None:

    @dataclasses.dataclass
    class SizedSlurmConf(SlurmQueueConf):
        """Schema of ``hydra/launcher=viasd_slurm`` (``conf/hydra/launcher/viasd_slurm.yaml`` sets it)."""

        _target_: str = "hydra_plugins.viasd_launcher.viasd_launcher.SizedSlurmLauncher"
        size_per_cell: bool = True  # each cell's gpus_per_node, mem_gb and timeout_min from its pair
        gpu_gib: float = 80.0  # GPU memory of the cluster's GPUs (GiB) the cells are sized for
        node_gpus: int = 8  # GPUs of one node: a cell needing more is refused before anything is submitted

    class SizedSlurmLauncher(SlurmLauncher):
        """Submitit's SLURM launcher, one job array per cell size (see the module docstring)."""

        def __init__(self, size_per_cell: bool = True, gpu_gib: float = 80.0, node_gpus: int = 8,
                     **params: Any) -> None:
            super().__init__(**params)
            self.size_per_cell, self.gpu_gib, self.node_gpus = bool(size_per_cell), gpu_gib, node_gpus

        def cell_size(self, overrides: list[str]) -> dict[str, int]:
            """A cell's ``gpus_per_node``, ``mem_gb`` and ``timeout_min`` (``timeout_min`` of the
            block is the time per GPU); a cell no node holds is one ConfigError line."""
            from viasd.harness.dryrun import cell_job, slurm_node

            gpu_gib, node_gpus = slurm_node({"gpu_gib": self.gpu_gib, "node_gpus": self.node_gpus})
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            return cell_job(cfg, gpu_gib, int(self.params["timeout_min"]), node_gpus)

        def sizes(self, job_overrides: Sequence[Sequence[str]]) -> dict[tuple, dict[str, int]]:
            """Every cell's :meth:`cell_size` by its overrides; one ``error:`` line naming every cell
            that cannot be sized (no node holds it, a bad knob) and exit 2 before anything is submitted."""
            sizes, refused = {}, []
            for overrides in job_overrides:
                try:
                    sizes[tuple(overrides)] = self.cell_size(list(overrides))
                except ConfigError as e:
                    refused.append(str(e))
            if refused:
                print(f"error: {len(refused)} of {len(job_overrides)} cells cannot be submitted, nothing was: "
                      + "; ".join(dict.fromkeys(refused)), file=sys.stderr)
                sys.exit(2)
            return sizes

        def executor(self, size: dict[str, Any]):
            """A submitit SLURM executor with the launcher's block, ``size`` overriding it."""
            import submitit
            from omegaconf import OmegaConf

            params = {**self.params, **size}
            init = {"folder": params.pop("submitit_folder")}
            if "max_num_timeout" in params:
                init["slurm_max_num_timeout"] = params.pop("max_num_timeout")
            executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init)
            base = set(OmegaConf.structured(BaseQueueConf).keys())
            executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
            return executor

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
            if not self.size_per_cell:
                return super().launch(job_overrides, initial_job_idx)
            sizes = self.sizes(job_overrides)
            Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
            jobs: dict[int, Any] = {}
            for size, cells in size_groups(job_overrides, initial_job_idx, lambda o: sizes[tuple(o)]).items():
                log.info(f"Submitit 'slurm' job array of {len(cells)} cells: "
                         + " ".join(f"{k}={v}" for k, v in size))
                for idx, overrides in cells:
                    log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
                args = [(o, "hydra.sweep.dir", i, f"job_id_for_{i}", Singleton.get_state()) for i, o in cells]
                submitted = self.executor(dict(size)).map_array(self, *zip(*args))
                jobs.update({i: job for (i, _), job in zip(cells, submitted)})
            return [jobs[i].results()[0] for i in sorted(jobs)]

    ConfigStore.instance().store(group="hydra/launcher", name="viasd_slurm_sized", node=SizedSlurmConf,
                                 provider="viasd")
