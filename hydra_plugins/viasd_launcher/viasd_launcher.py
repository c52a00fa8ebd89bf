"""``hydra/launcher=viasd_local``: submitit's local launcher, at most ``max_parallel`` cells at once.

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
"""

# No `from __future__ import annotations`: Hydra's plugin scan runs this module outside sys.modules,
# where dataclasses cannot resolve string annotations.
import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides

from viasd.errors import ConfigError

try:  # a dev dependency: without it there is no viasd_local launcher
    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher
except ImportError:  # pragma: no cover - exercised where the plugin is missing
    LocalQueueConf = LocalLauncher = None

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
